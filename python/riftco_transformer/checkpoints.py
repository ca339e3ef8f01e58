"""Exact-resume training checkpoints
(``.riftckpt``; docs/ARCHITECTURE.md, 'Training checkpoints').

A checkpoint is the complete state of one Adam run at a step boundary: continuing from it is
bit-for-bit the same as never having stopped (on CPU). It is a deterministic stored ZIP
(:mod:`._container`) whose first member is ``manifest.json`` (canonical JSON), followed by:

- ``model.f32le``: every base parameter the model lists (dense ones; with packed NF4 weights
  those are not parameters);
- ``model-nf4.rtnf4``: the packed NF4 weights' canonical bytes, when the model is quantized;
- ``adapter.f32le``: the LoRA factors, when an adapter is attached;
- ``adam-first-moments.f32le`` and ``adam-second-moments.f32le``: Adam's moments in the
  optimizer's flat order (the values they belong to are ``model.f32le`` for scope
  ``"model"`` and ``adapter.f32le`` for scope ``"adapter"``).

The manifest records the format (``"riftco-transformer-training-checkpoint"``, version 2),
the boundary (``"post_optimizer_step"``), the global step, the model (architecture, config,
runtime policies, parameter table, NF4 settings, LoRA config and adapter table), the
tokenizer state, the optimizer (type, scope, options, step count and β powers), the batch
source's position (type, fingerprint, batches emitted, generator state), the training loop's
rolling-loss window, every member's dtype, count, size and SHA-256, free metadata, and a
``checkpoint_id`` (SHA-256 of the canonical manifest without it).

Loading (:meth:`TrainingCheckpoint.load`) validates all of that, checksums included, before
anything else happens. :meth:`TrainingCheckpoint.resume` builds a fresh model and optimizer
from it; :meth:`TrainingCheckpoint.restore` loads it into existing compatible ones. Both
check every compatibility rule first and undo partial work if a step fails, so a failure
leaves the caller's objects as they were.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import re
from array import array
from dataclasses import dataclass
from pathlib import Path

from ._container import canonical_json, read_stored_zip, sha256_hex, strict_json, write_stored_zip
from ._files import atomic_write, read_file
from .artifacts import (
    MAXIMUM_MANIFEST_BYTES,
    build_model,
    finite_number,
    first_non_finite,
    floats_from_little_endian,
    little_endian_bytes,
    model_record,
    require_tokenizer_fits,
    tokenizer_from_record,
    tokenizer_record,
    validate_model_config,
    validate_tokenizer_record,
)
from .native import (
    Adam,
    AdamOptions,
    AdamState,
    DecoderOnlyTransformer,
    LlamaMistralTransformer,
    LoraConfig,
    PretrainedTokenizer,
    Tokenizer,
)

# Either decoder class: the GPT decoder or the rotary decoder of every family.
Model = DecoderOnlyTransformer | LlamaMistralTransformer

CHECKPOINT_FORMAT = "riftco-transformer-training-checkpoint"
CHECKPOINT_FORMAT_VERSION = 2
BOUNDARY = "post_optimizer_step"
MANIFEST_NAME = "manifest.json"
MODEL_VALUES = "model.f32le"
PACKED_NF4 = "model-nf4.rtnf4"
ADAPTER_VALUES = "adapter.f32le"
FIRST_MOMENTS = "adam-first-moments.f32le"
SECOND_MOMENTS = "adam-second-moments.f32le"
OPTIONAL_MEMBERS = (PACKED_NF4, ADAPTER_VALUES, FIRST_MOMENTS, SECOND_MOMENTS)
_HEX_ID = re.compile(r"[0-9a-f]{64}\Z")
_OPTION_FIELDS = ("learning_rate", "beta1", "beta2", "epsilon", "maximum_gradient_norm")
# Recorded only where they differ from the defaults (plain Adam at a constant rate), so a
# checkpoint without them reads as before: AdamW's decay and the learning-rate schedule.
_SCHEDULE_DEFAULTS = {"weight_decay": 0.0, "schedule": "constant", "warmup_steps": 0,
                      "total_steps": 0, "minimum_fraction": 0.0}


def _schedule_record(options: AdamOptions) -> dict:
    return {name: getattr(options, name) for name, default in _SCHEDULE_DEFAULTS.items()
            if getattr(options, name) != default}


@dataclass(frozen=True)
class TrainingCheckpointRestore:
    """What a restore did: the checkpoint's id, its global step and the optimizer's step."""

    checkpoint_id: str
    global_step: int
    optimizer_step: int


@dataclass
class ResumedTraining:
    """A model, its optimizer and tokenizer rebuilt from a checkpoint (close when done)."""

    model: Model
    optimizer: Adam
    tokenizer: Tokenizer | PretrainedTokenizer | None
    checkpoint: TrainingCheckpoint

    def close(self) -> None:
        self.optimizer.close()
        self.model.close()
        if self.tokenizer is not None:
            self.tokenizer.close()


def _float32(value: float) -> float:
    return array("f", [value])[0]


def _table(parameter_list) -> list:
    return [
        {"name": n, "shape": list(s)}
        for n, s in zip(parameter_list.names, parameter_list.shapes, strict=True)
    ]


def _optimizer_scope(model: Model, optimizer: Adam) -> str:
    if not optimizer.owns_parameters_of(model):
        raise ValueError("the optimizer must own exactly this model's parameters (it belongs to "
                         "another model)")
    names = optimizer.parameter_names
    if model.lora_attached:
        with model.adapter_parameters() as adapter:
            if names == adapter.names:
                return "adapter"
        raise ValueError("the optimizer must own exactly the model's adapter parameters")
    with model.parameters() as base:
        if names == base.names:
            return "model"
    raise ValueError("the optimizer must own exactly the model's parameters (or its adapter's)")


def _lora_record(config: LoraConfig | None) -> dict | None:
    if config is None:
        return None
    record = {
        "rank": config.rank,
        "alpha": config.alpha,
        "targets": list(config.targets),
        "random_seed": config.random_seed,
    }
    if config.rank_stabilized:  # recorded only when set: older checkpoints read the same
        record["rank_stabilized"] = True
    if config.dropout > 0.0:  # likewise; its key is recorded beside it (_lora_state)
        record["dropout"] = config.dropout
    return record


def _valid_dropout(dropout, key) -> bool:
    """A recorded dropout (a number in (0, 1)) and key (a uint64)."""
    value = finite_number(dropout)
    return (value is not None and 0.0 < value < 1.0 and _is_int(key)
            and 0 <= key < (1 << 64))


def _lora_state(model: Model) -> dict | None:
    """The LoRA record plus, with dropout, the model's dropout key: the masks of the next
    training forward, so a resume draws exactly the masks the run would have drawn."""
    if not model.lora_attached:
        return None
    record = _lora_record(model.lora_config)
    if "dropout" in record:
        record["dropout_key"] = model.lora_dropout_key
    return record


def _without_key(record: dict | None) -> dict | None:
    if record is None:
        return None
    return {name: value for name, value in record.items() if name != "dropout_key"}


def save_training_checkpoint(
    path,
    model: Model,
    optimizer: Adam,
    tokenizer: Tokenizer | PretrainedTokenizer | None = None,
    source=None,
    trainer=None,
    nf4: dict | None = None,
    metadata: dict | None = None,
) -> TrainingCheckpoint:
    """Capture the run at this step boundary and write it to ``path`` atomically.

    The optimizer must own the model's complete parameter list or its complete adapter list;
    there must be no pending gradient (native error otherwise). ``source`` (a batch source
    with ``capture_state``) and ``trainer`` (a :class:`~.training.CausalLanguageModelTrainer`)
    are optional; without a source the data position is not recorded. ``nf4`` records the
    packing settings (``block_size``, ``double_quantization``, ``scale_block_size``) of a
    quantized model, which :meth:`TrainingCheckpoint.resume` needs to rebuild it.
    """
    checkpoint = capture_training_checkpoint(
        model, optimizer, tokenizer, source, trainer, nf4, metadata
    )
    checkpoint.save(path)
    return checkpoint


def capture_training_checkpoint(
    model, optimizer, tokenizer=None, source=None, trainer=None, nf4=None, metadata=None
) -> TrainingCheckpoint:
    """:func:`save_training_checkpoint` without writing: the checkpoint in memory."""
    architecture, config = model_record(model)  # TypeError for anything but the two decoders
    if not isinstance(optimizer, Adam):
        raise TypeError(f"optimizer must be an Adam, not {type(optimizer).__name__}")
    if source is not None and not (
        hasattr(source, "capture_state") and hasattr(source, "check_state")
    ):
        raise TypeError(
            "source must be a checkpointable batch source (capture_state/restore_state)"
        )
    scope = _optimizer_scope(model, optimizer)
    quantized = model.quantized_linear_weights
    if quantized and (
        not isinstance(nf4, dict)
        or set(nf4) != {"block_size", "double_quantization", "scale_block_size"}
    ):
        raise ValueError("a quantized model needs nf4={'block_size', 'double_quantization', "
                         "'scale_block_size'} to be resumable")
    state = optimizer.state()  # native: rejects pending gradients
    with model.parameters() as base:
        base_table = _table(base)
        base_values = base.flat_values() if scope == "adapter" else state.values
    members = [(MODEL_VALUES, little_endian_bytes(base_values), "float32", len(base_values))]
    adapter_table = None
    if model.lora_attached:
        with model.adapter_parameters() as adapter:
            adapter_table = _table(adapter)
        members.append(
            (ADAPTER_VALUES, little_endian_bytes(state.values), "float32", len(state.values))
        )
    if quantized:
        packed = model.packed_quantized_state()
        members.insert(1, (PACKED_NF4, packed, "bytes", len(packed)))
    members.append(
        (FIRST_MOMENTS, little_endian_bytes(state.first_moments), "float32",
         len(state.first_moments))
    )
    members.append(
        (SECOND_MOMENTS, little_endian_bytes(state.second_moments), "float32",
         len(state.second_moments))
    )
    options = optimizer.options
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "boundary": BOUNDARY,
        "global_step": state.step_count,
        "model": {
            "architecture": architecture,
            "config": config,
            "attention": model.full_sequence_attention,
            "activation_checkpointing": model.activation_checkpointing,
            "parameters": base_table,
            "quantized": quantized,
            "nf4": copy.deepcopy(nf4) if quantized else None,
            "lora": _lora_state(model),
            "adapter_parameters": adapter_table,
        },
        "tokenizer": None if tokenizer is None else tokenizer_record(tokenizer),
        "optimizer": {
            "type": "adam",
            "scope": scope,
            "options": {
                **{name: _float32(getattr(options, name)) if math.isfinite(getattr(options, name))
                   else "inf" for name in _OPTION_FIELDS},
                "state_storage": options.state_storage,
                "page_size": options.page_size,
                **_schedule_record(options),
            },
            "step_count": state.step_count,
            "beta1_power": state.beta1_power,
            "beta2_power": state.beta2_power,
        },
        "batch_source": None if source is None else source.capture_state(),
        "trainer": None if trainer is None else trainer.capture_state(),
        "members": [
            {
                "name": name,
                "dtype": dtype,
                "count": count,
                "bytes": len(data),
                "sha256": sha256_hex(data),
            }
            for name, data, dtype, count in members
        ],
        "metadata": (
            {} if metadata is None else strict_json(canonical_json(dict(metadata)), "metadata")
        ),
    }
    manifest["checkpoint_id"] = sha256_hex(canonical_json(manifest))
    manifest_bytes = canonical_json(manifest)
    data = {name: payload for name, payload, _, _ in members}
    checkpoint = TrainingCheckpoint(manifest_bytes, manifest, data)
    _validate_manifest(strict_json(manifest_bytes, MANIFEST_NAME), MANIFEST_NAME)
    return checkpoint


class TrainingCheckpoint:
    """A validated checkpoint in memory (:meth:`load`, or :func:`capture_training_checkpoint`)."""

    def __init__(self, manifest_bytes: bytes, manifest: dict, members: dict,
                 decoded: dict | None = None) -> None:
        self._manifest_bytes = manifest_bytes
        self._manifest = manifest
        self._members = members
        # float32 members already decoded (by from_bytes' finiteness check): not decoded twice
        self._decoded = {} if decoded is None else decoded

    # ---- reading and writing ------------------------------------------------------------

    @classmethod
    def load(cls, path) -> TrainingCheckpoint:
        return cls.from_bytes(*read_file(path, "a checkpoint"))

    @classmethod
    def from_bytes(cls, data, source: str = "<checkpoint>") -> TrainingCheckpoint:
        members = read_stored_zip(data, (MANIFEST_NAME, MODEL_VALUES), source, OPTIONAL_MEMBERS)
        if members[MANIFEST_NAME].nbytes > MAXIMUM_MANIFEST_BYTES * 4:
            raise ValueError(f"{source}: manifest is too large")
        manifest_bytes = bytes(members[MANIFEST_NAME])
        where = f"{source}: {MANIFEST_NAME}"
        manifest = strict_json(manifest_bytes, where)
        _validate_manifest(manifest, where)
        if canonical_json(manifest) != manifest_bytes:
            raise ValueError(f"{where}: not in canonical form")
        listed = [entry["name"] for entry in manifest["members"]]
        present = [name for name in members if name != MANIFEST_NAME]
        if listed != present:
            raise ValueError(f"{source}: the archive holds {present}, the manifest lists {listed}")
        payloads, decoded = {}, {}
        for entry in manifest["members"]:
            body = members[entry["name"]]
            if body.nbytes != entry["bytes"]:
                raise ValueError(
                    f"{source}: {entry['name']} holds {body.nbytes} bytes, the manifest says "
                    f"{entry['bytes']}"
                )
            if sha256_hex(body) != entry["sha256"]:
                raise ValueError(f"{source}: {entry['name']} fails its SHA-256 check (corrupted)")
            payloads[entry["name"]] = bytes(body)
            if entry["dtype"] == "float32":
                values = floats_from_little_endian(body)
                bad = first_non_finite(values)
                if bad is not None:
                    raise ValueError(f"{source}: {entry['name']} value {bad} is not finite")
                decoded[entry["name"]] = values
        return cls(manifest_bytes, manifest, payloads, decoded)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        self._write(buffer)
        return buffer.getvalue()

    def _write(self, stream) -> None:
        write_stored_zip(
            stream,
            [(MANIFEST_NAME, self._manifest_bytes)]
            + [
                (entry["name"], self._members[entry["name"]])
                for entry in self._manifest["members"]
            ],
        )

    def save(self, path) -> Path:
        """Write atomically (temporary file, fsync, rename, directory fsync)."""
        return atomic_write(path, self._write)

    # ---- views ------------------------------------------------------------------------

    @property
    def checkpoint_id(self) -> str:
        return self._manifest["checkpoint_id"]

    @property
    def global_step(self) -> int:
        return self._manifest["global_step"]

    @property
    def manifest(self) -> dict:
        return copy.deepcopy(self._manifest)

    @property
    def metadata(self) -> dict:
        return copy.deepcopy(self._manifest["metadata"])

    @property
    def batch_source_state(self) -> dict | None:
        return copy.deepcopy(self._manifest["batch_source"])

    def floats(self, name: str) -> array:
        """A float32 member's values (a new array)."""
        return array("f", self._float_member(name))

    def _float_member(self, name: str) -> array:
        if name not in self._decoded:
            self._decoded[name] = floats_from_little_endian(self._members[name])
        return self._decoded[name]

    def tokenizer(self) -> Tokenizer | PretrainedTokenizer | None:
        state = self._manifest["tokenizer"]
        return None if state is None else tokenizer_from_record(state)

    def adam_options(
        self, state_storage: str | None = None, page_size: int | None = None
    ) -> AdamOptions:
        """The recorded options (storage kind and page size may be overridden: the math is
        the same)."""
        recorded = self._manifest["optimizer"]["options"]
        values = {
            name: math.inf if recorded[name] == "inf" else recorded[name]
            for name in _OPTION_FIELDS
        }
        return AdamOptions(
            **values,
            state_storage=recorded["state_storage"] if state_storage is None else state_storage,
            page_size=recorded["page_size"] if page_size is None else page_size,
            **{name: recorded[name] for name in _SCHEDULE_DEFAULTS if name in recorded},
        )

    def trainable_values(self) -> array:
        """The trained parameters' values (the adapters' under LoRA, else the model's), in
        the optimizer's flat order: what early stopping keeps of a best checkpoint."""
        return self._adam_state().values

    def _adam_state(self) -> AdamState:
        optimizer = self._manifest["optimizer"]
        values = self._float_member(
            ADAPTER_VALUES if optimizer["scope"] == "adapter" else MODEL_VALUES
        )
        return AdamState(
            optimizer["step_count"],
            optimizer["beta1_power"],
            optimizer["beta2_power"],
            values,
            self._float_member(FIRST_MOMENTS),
            self._float_member(SECOND_MOMENTS),
        )

    # ---- compatibility ----------------------------------------------------------------

    def check_model(self, model: Model) -> None:
        """ValueError unless ``model`` has this checkpoint's structure: decoder class, config
        (the init seed may differ), parameter table, quantization, LoRA config."""
        recorded = self._manifest["model"]
        architecture, current = model_record(model)
        if architecture != recorded["architecture"]:
            raise ValueError(f"the model is a {architecture} decoder, the checkpoint's a "
                             f"{recorded['architecture']}")
        config = recorded["config"]
        # Both records in JSON's form; a field either leaves out is at its default (a choice
        # the model makes that the checkpoint does not record is a difference too).
        defaults = {field.name: field.default for field in dataclasses.fields(model.config)}
        for name in sorted((set(config) | set(current)) - {"random_seed"}):
            default = defaults.get(name)
            default = list(default) if isinstance(default, tuple) else default
            value = config.get(name, default)
            actual = current.get(name, default)
            if actual != value:
                raise ValueError(f"model config {name} = {actual!r}, the checkpoint has {value!r}")
        with model.parameters() as base:
            if _table(base) != recorded["parameters"]:
                raise ValueError(
                    "the model's parameter names or shapes differ from the checkpoint's"
                )
        if model.quantized_linear_weights != recorded["quantized"]:
            raise ValueError(
                f"the checkpoint's model is {'' if recorded['quantized'] else 'not '}quantized; "
                f"this one is {'' if model.quantized_linear_weights else 'not '}"
            )
        lora = _lora_record(model.lora_config) if model.lora_attached else None
        if lora != _without_key(recorded["lora"]):
            raise ValueError(f"LoRA config differs: model {lora}, checkpoint "
                             f"{_without_key(recorded['lora'])}")
        if lora is not None:
            with model.adapter_parameters() as adapter:
                if _table(adapter) != recorded["adapter_parameters"]:
                    raise ValueError("the model's adapter parameters differ from the checkpoint's")

    def check_optimizer(self, model: Model, optimizer: Adam) -> None:
        """ValueError unless ``optimizer`` owns the checkpoint's scope of ``model`` with the
        same options (:meth:`check_adam_options`)."""
        recorded = self._manifest["optimizer"]
        if _optimizer_scope(model, optimizer) != recorded["scope"]:
            raise ValueError(f"the optimizer's scope differs from the checkpoint's "
                             f"({recorded['scope']!r})")
        self.check_adam_options(optimizer.options)

    def check_adam_options(self, options: AdamOptions) -> None:
        """ValueError naming the first option that differs from the checkpoint's: learning
        rate, betas, epsilon, clipping, weight decay or schedule (storage kind and page size
        may differ: the math is the same)."""
        recorded = self._manifest["optimizer"]
        for name in _OPTION_FIELDS:
            want = recorded["options"][name]
            have = getattr(options, name)
            have = "inf" if not math.isfinite(have) else _float32(have)
            if have != want:
                raise ValueError(f"optimizer {name} is {have!r}, the checkpoint's is {want!r}")
        for name, default in _SCHEDULE_DEFAULTS.items():
            want = recorded["options"].get(name, default)
            have = getattr(options, name)
            if have != want:
                label = "schedule" if name == "schedule" else f"{name} (learning-rate schedule)"
                raise ValueError(f"optimizer {label} is {have!r}, the checkpoint's is {want!r}")

    # ---- resuming ---------------------------------------------------------------------

    def resume(
        self,
        backend: str = "cpu",
        attention: str | None = None,
        activation_checkpointing: str | None = None,
        state_storage: str | None = None,
    ) -> ResumedTraining:
        """A fresh model, optimizer and tokenizer in exactly the checkpoint's state."""
        recorded = self._manifest["model"]
        config = validate_model_config(recorded["architecture"], recorded["config"],
                                       "checkpoint model")
        model = build_model(
            config,
            recorded["attention"] if attention is None else attention,
            recorded["activation_checkpointing"]
            if activation_checkpointing is None
            else activation_checkpointing,
        )
        optimizer = tokenizer = None
        try:
            if recorded["quantized"]:
                settings = recorded["nf4"]
                model.quantize_nf4(
                    settings["block_size"],
                    settings["double_quantization"],
                    settings["scale_block_size"],
                )
                model.load_packed_quantized_state(self._members[PACKED_NF4])
            with model.parameters() as base:
                if _table(base) != recorded["parameters"]:
                    raise ValueError("the rebuilt model's parameters differ from the checkpoint's")
                base.load_flat_values(self._float_member(MODEL_VALUES))
            if recorded["lora"] is not None:
                lora = recorded["lora"]
                model.attach_lora(
                    LoraConfig(
                        lora["rank"], lora["alpha"], tuple(lora["targets"]), lora["random_seed"],
                        lora.get("rank_stabilized", False), lora.get("dropout", 0.0),
                    )
                )
                model.lora_dropout_key = lora.get("dropout_key", 0)
            if model.backend != backend:
                model.to(backend)
            trainable = (
                model.adapter_parameters() if recorded["lora"] is not None
                else model.parameters()
            )
            with trainable:
                optimizer = Adam(trainable, self.adam_options(state_storage))
            optimizer.load_state(self._adam_state())
            tokenizer = self.tokenizer()
        except BaseException:
            if optimizer is not None:
                optimizer.close()
            model.close()
            raise
        return ResumedTraining(model, optimizer, tokenizer, self)

    def restore(self, model, optimizer, source=None, trainer=None) -> TrainingCheckpointRestore:
        """Load this checkpoint into existing ``model`` and ``optimizer`` (and ``source``,
        ``trainer``), validating everything first and undoing partial work on failure.

        The model's frozen base (adapter scope) and packed weights cannot change while an
        optimizer pins the model, so for adapter-scope checkpoints they must already equal
        the checkpoint's (ValueError otherwise; build the pair with :meth:`resume` instead).
        """
        self.check_model(model)
        self.check_optimizer(model, optimizer)
        recorded = self._manifest
        if recorded["batch_source"] is not None and source is not None:
            source.check_state(recorded["batch_source"])
        elif recorded["batch_source"] is None and source is not None:
            raise ValueError("the checkpoint has no batch source position to restore")
        if trainer is not None and recorded["trainer"] is not None:
            trainer_state = recorded["trainer"]
        else:
            trainer_state = None
        if recorded["optimizer"]["scope"] == "adapter":
            with model.parameters() as base:
                if little_endian_bytes(base.flat_values()) != self._members[MODEL_VALUES]:
                    raise ValueError("the model's frozen base differs from the checkpoint's; "
                                     "use TrainingCheckpoint.resume()")
            if (
                recorded["model"]["quantized"]
                and model.packed_quantized_state() != self._members[PACKED_NF4]
            ):
                raise ValueError("the model's packed NF4 weights differ from the checkpoint's; "
                                 "use TrainingCheckpoint.resume()")
        previous_source = None if source is None else source.capture_state()
        previous_trainer = None if trainer is None else trainer.capture_state()
        previous_optimizer = optimizer.state()
        previous_key = model.lora_dropout_key
        try:
            if source is not None:
                source.restore_state(recorded["batch_source"])
            if trainer_state is not None:
                trainer.restore_state(trainer_state)
            optimizer.load_state(self._adam_state())
            if recorded["model"]["lora"] is not None:
                model.lora_dropout_key = recorded["model"]["lora"].get("dropout_key", 0)
        except BaseException:
            try:
                model.lora_dropout_key = previous_key
                optimizer.load_state(previous_optimizer)
                if trainer is not None:
                    trainer.restore_state(previous_trainer)
                if source is not None:
                    source.restore_state(previous_source)
            except BaseException as undo_error:
                raise RuntimeError(
                    f"restore failed and could not be undone (indeterminate state): {undo_error}"
                ) from undo_error
            raise
        return TrainingCheckpointRestore(
            self.checkpoint_id, recorded["global_step"], optimizer.step_count
        )

    def restore_source(self, source) -> None:
        """Continue ``source`` from the recorded position (ValueError if none or another)."""
        state = self._manifest["batch_source"]
        if state is None:
            raise ValueError("the checkpoint records no batch source position")
        source.restore_state(state)

    def restore_trainer(self, trainer) -> None:
        if self._manifest["trainer"] is not None:
            trainer.restore_state(self._manifest["trainer"])


def load_training_checkpoint(path) -> TrainingCheckpoint:
    """:meth:`TrainingCheckpoint.load`."""
    return TrainingCheckpoint.load(path)


def read_artifact(path) -> tuple[str, object]:
    """``(kind, loaded)`` for a bundle ("rift"), checkpoint ("riftckpt") or safetensors file
    ("safetensors": its tensors and metadata), read once and fully validated by its own loader
    (chosen by the manifest's format)."""
    from .artifacts import BUNDLE_FORMAT, WEIGHTS_NAME, ModelBundle
    from .interchange import parse_safetensors

    data, source = read_file(path, "a bundle, checkpoint or safetensors file")
    if data[:4] != b"PK\x03\x04":
        return "safetensors", parse_safetensors(data, source)
    members = read_stored_zip(data, (MANIFEST_NAME,), source,
                              (WEIGHTS_NAME, MODEL_VALUES, *OPTIONAL_MEMBERS))
    manifest = strict_json(bytes(members[MANIFEST_NAME]), source)
    format_name = manifest.get("format") if isinstance(manifest, dict) else None
    if format_name == BUNDLE_FORMAT:
        return "rift", ModelBundle.from_bytes(data, source)
    if format_name == CHECKPOINT_FORMAT:
        return "riftckpt", TrainingCheckpoint.from_bytes(data, source)
    raise ValueError(f"{path}: a ZIP, but neither a bundle nor a checkpoint")


# ---- manifest validation --------------------------------------------------------------------

_KEYS = {
    "format", "format_version", "boundary", "global_step", "model", "tokenizer", "optimizer",
    "batch_source", "trainer", "members", "metadata", "checkpoint_id",
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_table(table, where: str, name: str) -> int:
    if not isinstance(table, list) or not table:
        raise ValueError(f"{where}: {name} must be a nonempty list")
    total = 0
    for index, entry in enumerate(table):
        if (
            not isinstance(entry, dict)
            or set(entry) != {"name", "shape"}
            or not isinstance(entry["name"], str)
            or not isinstance(entry["shape"], list)
            or not all(_is_int(d) and d > 0 for d in entry["shape"])
        ):
            raise ValueError(f"{where}: {name}[{index}] must be {{name, shape}} with positive dims")
        total += math.prod(entry["shape"])
    return total


def _validate_manifest(manifest, where: str) -> None:
    if not isinstance(manifest, dict) or set(manifest) != _KEYS:
        keys = set(manifest) if isinstance(manifest, dict) else set()
        raise ValueError(
            f"{where}: manifest keys differ (missing {sorted(_KEYS - keys)}, unexpected "
            f"{sorted(keys - _KEYS)})"
        )
    if manifest["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"{where}: format is {manifest['format']!r}, not {CHECKPOINT_FORMAT!r}")
    if (
        not _is_int(manifest["format_version"])
        or manifest["format_version"] != CHECKPOINT_FORMAT_VERSION
    ):
        raise ValueError(f"{where}: format_version {manifest['format_version']!r} is not supported")
    if manifest["boundary"] != BOUNDARY:
        raise ValueError(f"{where}: boundary must be {BOUNDARY!r}")
    if not _is_int(manifest["global_step"]) or manifest["global_step"] < 0:
        raise ValueError(f"{where}: global_step must be an int >= 0")
    if (
        not isinstance(manifest["checkpoint_id"], str)
        or not _HEX_ID.match(manifest["checkpoint_id"])
    ):
        raise ValueError(f"{where}: checkpoint_id must be 64 lowercase hex digits")
    if not isinstance(manifest["metadata"], dict):
        raise ValueError(f"{where}: metadata must be an object")
    model = manifest["model"]
    model_keys = {"architecture", "config", "attention", "activation_checkpointing", "parameters",
                  "quantized", "nf4", "lora", "adapter_parameters"}
    if not isinstance(model, dict) or set(model) != model_keys:
        raise ValueError(f"{where}: model must have exactly {sorted(model_keys)}")
    config = validate_model_config(model["architecture"], model["config"], f"{where}: model")
    if model["attention"] not in ("materialized", "flash"):
        raise ValueError(f"{where}: model.attention {model['attention']!r} is unknown")
    if model["activation_checkpointing"] not in ("disabled", "block"):
        raise ValueError(f"{where}: model.activation_checkpointing is unknown")
    base_total = _validate_table(model["parameters"], where, "model.parameters")
    if not isinstance(model["quantized"], bool):
        raise ValueError(f"{where}: model.quantized must be a bool")
    if model["quantized"]:
        nf4 = model["nf4"]
        if (
            not isinstance(nf4, dict)
            or set(nf4) != {"block_size", "double_quantization", "scale_block_size"}
            or not _is_int(nf4["block_size"])
            or not _is_int(nf4["scale_block_size"])
            or not isinstance(nf4["double_quantization"], bool)
        ):
            raise ValueError(f"{where}: model.nf4 must record block_size, double_quantization, "
                             "scale_block_size")
    elif model["nf4"] is not None:
        raise ValueError(f"{where}: model.nf4 must be null for an unquantized model")
    lora = model["lora"]
    adapter_total = None
    if lora is not None:
        if (
            not isinstance(lora, dict)
            or not {"rank", "alpha", "targets", "random_seed"} <= set(lora)
            <= {"rank", "alpha", "targets", "random_seed", "rank_stabilized", "dropout",
                "dropout_key"}
            or lora.get("rank_stabilized", True) is not True
            or ("dropout" in lora) != ("dropout_key" in lora)
            or not _valid_dropout(lora.get("dropout", 0.5), lora.get("dropout_key", 0))
            or not _is_int(lora["rank"])
            or finite_number(lora["alpha"]) is None
            or not isinstance(lora["targets"], list)
            or not all(isinstance(t, str) for t in lora["targets"])
            or not _is_int(lora["random_seed"])
        ):
            raise ValueError(f"{where}: model.lora must record rank, alpha, targets, random_seed")
        adapter_total = _validate_table(
            model["adapter_parameters"], where, "model.adapter_parameters"
        )
    elif model["adapter_parameters"] is not None:
        raise ValueError(f"{where}: model.adapter_parameters must be null without LoRA")
    if manifest["tokenizer"] is not None:
        require_tokenizer_fits(validate_tokenizer_record(manifest["tokenizer"], where),
                               manifest["tokenizer"]["method"] == "pretrained",
                               config.vocabulary_size, where)
    optimizer = manifest["optimizer"]
    optimizer_keys = {"type", "scope", "options", "step_count", "beta1_power", "beta2_power"}
    if not isinstance(optimizer, dict) or set(optimizer) != optimizer_keys:
        raise ValueError(f"{where}: optimizer must have exactly {sorted(optimizer_keys)}")
    if optimizer["type"] != "adam":
        raise ValueError(f"{where}: optimizer.type must be 'adam'")
    if (
        optimizer["scope"] not in ("model", "adapter")
        or (optimizer["scope"] == "adapter") != (lora is not None)
    ):
        raise ValueError(
            f"{where}: optimizer.scope must be 'adapter' exactly when LoRA is recorded"
        )
    options = optimizer["options"]
    option_keys = set(_OPTION_FIELDS) | {"state_storage", "page_size"}
    if not isinstance(options, dict) or not option_keys <= set(options) <= \
            option_keys | set(_SCHEDULE_DEFAULTS):
        raise ValueError(f"{where}: optimizer.options must have exactly {sorted(option_keys)}, "
                         f"and may have {sorted(_SCHEDULE_DEFAULTS)}")
    try:
        restored = {}
        for name in _OPTION_FIELDS:
            value = math.inf if options[name] == "inf" else finite_number(options[name])
            if value is None:
                raise ValueError(f"{name} must be a finite number or 'inf'")
            restored[name] = value
        AdamOptions(**restored, state_storage=options["state_storage"],
                    page_size=options["page_size"],
                    **{name: options[name] for name in _SCHEDULE_DEFAULTS if name in options})
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{where}: optimizer.options: {error}") from None
    step = optimizer["step_count"]
    if not _is_int(step) or step < 0 or step != manifest["global_step"]:
        raise ValueError(f"{where}: optimizer.step_count must equal global_step")
    for name, beta in (("beta1_power", restored["beta1"]), ("beta2_power", restored["beta2"])):
        power = finite_number(optimizer[name])
        if power is None:
            raise ValueError(f"{where}: optimizer.{name} must be a finite number")
        try:
            expected = float(beta) ** step
        except OverflowError:
            expected = math.inf
        if not math.isclose(power, expected, rel_tol=1e-9, abs_tol=1e-300):
            raise ValueError(f"{where}: optimizer.{name} {power!r} is not beta^step ({expected!r})")
    source = manifest["batch_source"]
    if source is not None and (
        not isinstance(source, dict)
        or set(source) != {"type", "fingerprint", "batches_emitted", "rng"}
    ):
        raise ValueError(f"{where}: batch_source must have type, fingerprint, batches_emitted, rng")
    trainer = manifest["trainer"]
    if trainer is not None and (
        not isinstance(trainer, dict)
        or not isinstance(trainer.get("recent_losses"), list)
        or not all(finite_number(v) is not None for v in trainer["recent_losses"])
    ):
        raise ValueError(f"{where}: trainer must hold recent_losses")
    members = manifest["members"]
    trained_total = adapter_total if lora is not None else base_total
    expected_members = [(MODEL_VALUES, "float32", None)]
    if model["quantized"]:
        expected_members.append((PACKED_NF4, "bytes", None))
    if lora is not None:
        expected_members.append((ADAPTER_VALUES, "float32", adapter_total))
    expected_members += [
        (FIRST_MOMENTS, "float32", trained_total),
        (SECOND_MOMENTS, "float32", trained_total),
    ]
    if not isinstance(members, list) or len(members) != len(expected_members):
        raise ValueError(f"{where}: members must list {[m[0] for m in expected_members]}")
    for entry, (name, dtype, count) in zip(members, expected_members, strict=True):
        if (
            not isinstance(entry, dict)
            or set(entry) != {"name", "dtype", "count", "bytes", "sha256"}
            or entry["name"] != name
            or entry["dtype"] != dtype
            or not _is_int(entry["count"])
            or not _is_int(entry["bytes"])
            or not isinstance(entry["sha256"], str)
            or not _HEX_ID.match(entry["sha256"])
        ):
            raise ValueError(f"{where}: members entry for {name} is malformed")
        if dtype == "float32" and entry["bytes"] != 4 * entry["count"]:
            raise ValueError(f"{where}: {name} bytes must be 4 x count")
        if count is not None and entry["count"] != count:
            raise ValueError(f"{where}: {name} must hold {count} values, lists {entry['count']}")
    if members[0]["count"] != base_total and not model["quantized"]:
        raise ValueError(f"{where}: {MODEL_VALUES} must hold {base_total} values")
    if model["quantized"] and members[0]["count"] != base_total:
        raise ValueError(f"{where}: {MODEL_VALUES} must hold {base_total} values")
    without_id = {key: value for key, value in manifest.items() if key != "checkpoint_id"}
    if sha256_hex(canonical_json(without_id)) != manifest["checkpoint_id"]:
        raise ValueError(f"{where}: checkpoint_id does not match the manifest's content")
