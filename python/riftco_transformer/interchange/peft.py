"""LoRA adapters as Hugging Face PEFT adapter directories, both ways; the adapter-only save.

A PEFT LoRA adapter directory (what ``PeftModel.save_pretrained`` writes) holds:

* ``adapter_config.json``: ``peft_type`` ``"LORA"``, ``r``, ``lora_alpha``, ``use_rslora``,
  ``target_modules`` (Hugging Face module names: ``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``, ``lm_head``), ``lora_dropout``,
  ``bias`` ``"none"``, ``task_type`` ``"CAUSAL_LM"``, ``base_model_name_or_path``;
* ``adapter_model.safetensors``: for every adapted module ``M`` (e.g.
  ``model.layers.3.self_attn.q_proj``), ``base_model.model.M.lora_A.weight`` ``[r, in]`` and
  ``base_model.model.M.lora_B.weight`` ``[out, r]``.

PEFT adds ``scaling·(x·Aᵀ)·Bᵀ`` to the module's output with ``scaling = lora_alpha / r``, or
``lora_alpha / √r`` with ``use_rslora``: our LoRA (:class:`~riftco_transformer.LoraConfig`,
``rank_stabilized`` for rsLoRA) in the same layout, so the factors are written as they are,
float32, and read back exactly. ``lora_dropout`` is the config's ``dropout`` both ways (dropout
on the adapter input while training).

**Writing** (:func:`export_peft`, :meth:`LoraAdapter.save`). An adapter comes from a model with
an attached adapter (:func:`capture_lora_adapter`), from the ``.riftckpt`` checkpoint of a LoRA
or QLoRA run (:func:`adapter_from_checkpoint`), or from a post-training result
(``PostTrainingResult.adapter``, captured before the merge): that is the adapter-only save, a
PEFT directory, the one format both ways. A ``.rift`` bundle holds merged weights and no
adapter, and a full fine-tuning checkpoint none either: both are refused naming the file.
Rotary families only (Llama, Mistral, Qwen 2/3, Gemma 2/3, Phi-3); Phi-3 fuses q/k/v and
gate/up into one module each, which PEFT adapts with one shared A, so adapters on those parts
are refused (its o_proj, down_proj and lm_head export). The safetensors metadata also records
what identifies the base (``riftco.base.weights_sha256``: the SHA-256 of its float32 weights,
as a bundle's manifest records them; ``riftco.base.artifact_id``: the base bundle's id;
``riftco.base.base_id``: the pretrained source's id, which ``riftco`` takes as the SHA-256 of
the file or directory, :func:`source_identity`). PEFT ignores it.

**Reading** (:func:`read_peft_adapter`, then :func:`load_peft_adapter` onto a base). Checked
before the model changes, every failure a ValueError naming the file and the key or tensor:

* ``peft_type`` must be ``"LORA"``, ``task_type`` ``"CAUSAL_LM"`` (or null), ``bias``
  ``"none"``; ``r`` a positive integer, ``lora_alpha`` a positive number, ``use_rslora`` a
  bool; ``rank_pattern`` and ``alpha_pattern`` empty (or giving every module ``r`` and
  ``lora_alpha``); ``init_lora_weights`` true, false or ``"gaussian"`` (PiSSA, OLoRA, LoftQ,
  EVA and CorDA change the base weights);
* every other option must be off (null, false, empty): ``use_dora``, ``fan_in_fan_out``,
  ``modules_to_save``, ``layers_to_transform``, ``layer_replication``, ``lora_bias``,
  ``use_qalora``, ``trainable_token_indices``, ``target_parameters``, ... (what our LoRA does not
  do); ``lora_dropout`` only acts in training and is not used; ``base_model_name_or_path``,
  ``revision``, ``inference_mode`` and ``peft_version`` are information;
* ``target_modules`` (a list: each entry a module name or its last components, as PEFT
  matches them; a string: a regular expression the full module name must match; or
  ``"all-linear"``: every block projection) and ``exclude_modules`` select modules of the base
  model; an entry that names no projection LoRA can adapt (``embed_tokens``, a module of
  another architecture) is refused, and so is a selection that covers a projection in some
  blocks but not all (our adapters cover a projection in every block);
* the tensors are exactly the selected modules' ``lora_A``/``lora_B`` (F32, F16 or BF16, as
  the Hugging Face importer reads them), each of the shape the base implies: the error names
  the tensor, the expected and the actual shape. Phi-3's fused ``qkv_proj``/``gate_up_proj``
  adapters load exactly (each part gets the shared A and its rows of B);
* ``adapter_model.bin`` (a pickle) is not read.

When the adapter records its base, the base must prove to be it: one recorded identity
(``base_id`` as given or computed from the model's source path, the source bundle's
``artifact_id``, or the SHA-256 of the model's dense float32 weights) must match, else a
ValueError names the difference, or says that none could be checked; ``check_base=False``
attaches it anyway. Adapters from other tools record no base and are checked by shape only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._container import read_stored_zip, sha256_hex, strict_json
from .._files import read_file
from ..artifacts import (
    BUNDLE_FORMAT,
    MANIFEST_NAME,
    WEIGHTS_NAME,
    little_endian_bytes,
    llama_parameter_shapes,
    validate_model_config,
)
from ..native import DecoderOnlyTransformer, LlamaMistralConfig, LlamaMistralTransformer, LoraConfig
from ..native.llama import checkpoint_tensor_name
from ..native.lora import LORA_TARGETS
from .huggingface import _fused_rows, _mapped, read_safetensors_header
from .huggingface_export import _FAMILIES, _require_free, _write_json, write_directory
from .safetensors import write_safetensors

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "LoraAdapter",
    "PeftAdapter",
    "adapter_from_checkpoint",
    "capture_lora_adapter",
    "export_peft",
    "load_peft_adapter",
    "read_peft_adapter",
    "require_peft_exportable",
    "source_identity",
]

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_PICKLED_WEIGHTS_FILE = "adapter_model.bin"
_PREFIX = "base_model.model."
_TENSOR_NAME = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<factor>[AB])\.weight\Z")
_HEAD = "language_model_head"
# What identifies a base, by the key riftco writes into the safetensors metadata.
BASE_IDENTITIES = ("artifact_id", "base_id", "weights_sha256")
_METADATA_PREFIX = "riftco.base."
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}\Z")

# adapter_config.json keys that carry information only (any value is accepted).
_INFORMATIONAL_KEYS = frozenset({
    "base_model_name_or_path", "revision", "inference_mode", "auto_mapping", "peft_version",
    "megatron_core", "qalora_group_size", "layers_pattern", "loftq_config",
})
# adapter_config.json keys read with their own rules; every other key must be off.
_READ_KEYS = frozenset({
    "peft_type", "task_type", "r", "lora_alpha", "use_rslora", "target_modules",
    "exclude_modules", "bias", "init_lora_weights", "rank_pattern", "alpha_pattern",
    "lora_dropout",
})
_PLAIN_INITIALISATIONS = (True, False, "gaussian")


# ---- the projections of a base model, by their Hugging Face module --------------------------


@dataclass(frozen=True)
class _Projection:
    """One projection LoRA can adapt: ``path`` ours (``blocks.0.attention.query``), ``target``
    its LoRA target name, ``module`` the Hugging Face module holding it, ``part`` its part of a
    fused module (None: the whole module) at rows ``[first_row, first_row + rows)`` of the
    module's output, ``columns`` its input width."""

    path: str
    target: str
    module: str
    part: int | None
    first_row: int
    rows: int
    columns: int


def _projections(config: LlamaMistralConfig) -> dict[str, _Projection]:
    """Every projection of a model of ``config`` that LoRA can adapt, block by block (in our
    attach order), then the head unless it is tied to the embeddings (no adapter attaches
    there); keyed by our path."""
    shapes = dict(llama_parameter_shapes(config))
    architecture = config.architecture
    paths = [f"blocks.{block}.{target}" for block in range(config.block_count)
             for target in LORA_TARGETS if target != _HEAD
             and f"blocks.{block}.{target}.weight" in shapes]
    if f"{_HEAD}.weight" in shapes:
        paths.append(_HEAD)
    result = {}
    for path in paths:
        rows, columns = shapes[f"{path}.weight"]
        name, part = checkpoint_tensor_name(architecture, "huggingface", f"{path}.weight")
        first_row = 0
        if part is not None:
            first_row, fused_rows = _fused_rows(config, f"{path}.weight", part)
            if fused_rows != rows:
                raise AssertionError(f"{path}: {rows} rows, the fused layout says {fused_rows}")
        target = _HEAD if path == _HEAD else path.split(".", 2)[2]
        result[path] = _Projection(path, target, name.removesuffix(".weight"), part, first_row,
                                   rows, columns)
    return result


def _by_module(projections: dict[str, _Projection]) -> dict[str, list[_Projection]]:
    modules: dict[str, list[_Projection]] = {}
    for projection in projections.values():
        modules.setdefault(projection.module, []).append(projection)
    return modules


def _short(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _require_rotary(config, doing: str) -> LlamaMistralConfig:
    if not isinstance(config, LlamaMistralConfig):
        raise ValueError(f"our GPT decoder (riftco_decoder_v1) has no PEFT form: {doing} is for "
                         f"the rotary families ({', '.join(sorted(_FAMILIES))})")
    if config.architecture not in _FAMILIES:
        raise ValueError(f"architecture {config.architecture!r} has no PEFT form: {doing} is "
                         f"for the rotary families ({', '.join(sorted(_FAMILIES))})")
    return config


def require_peft_exportable(config, lora: LoraConfig) -> None:
    """ValueError unless an adapter ``lora`` on a model of ``config`` can be written as a PEFT
    adapter: a rotary family, and no adapter on a part of a fused module (Phi-3's q/k/v and
    gate/up). Checks nothing else, so a command can ask before it trains."""
    _require_rotary(config, "PEFT export")
    _fused_targets(config, lora)


def _fused_targets(config: LlamaMistralConfig, lora: LoraConfig) -> dict[str, _Projection]:
    projections = _projections(config)
    for module, parts in _by_module(projections).items():
        adapted = [p.target for p in parts if p.target in lora.targets]
        if len(parts) > 1 and adapted:
            raise ValueError(
                f"{config.architecture} fuses {', '.join(p.target for p in parts)} into one "
                f"module ({_short(module)}), which PEFT adapts with one A shared by the parts, "
                f"while this adapter gives {', '.join(adapted)} factors of its own: it cannot "
                f"be written as a PEFT adapter (train without the LoRA targets "
                f"{', '.join(p.target for p in parts)} to export one)")
    return projections


# ---- the adapter, detached from its model ---------------------------------------------------


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """A model's LoRA factors without the model: ``config`` (the base model's), ``lora`` (rank,
    alpha, targets, rsLoRA), the factors' ``names`` and ``shapes`` (our names,
    ``<projection>.lora_a.weight`` ``[r, in]`` and ``.lora_b.weight`` ``[out, r]``, in the
    model's order), their flat float32 ``values``, and ``base``: what identifies the base model
    (``weights_sha256``, ``artifact_id``, ``base_id``; see the module docstring).
    :meth:`save` writes it as a PEFT adapter directory."""

    config: object
    lora: LoraConfig
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    values: array
    base: Mapping[str, str]

    def save(self, directory, base_model_name_or_path: str | None = None) -> Path:
        """Write the PEFT adapter directory ``directory`` (created; an existing one must be
        empty; written into a temporary sibling renamed at the end, so a failure leaves nothing)
        and return its path. ``base_model_name_or_path`` goes into ``adapter_config.json`` (the
        Hugging Face directory or hub id of the base, for ``AutoPeftModelForCausalLM``).
        ValueError for what PEFT cannot express (:func:`require_peft_exportable`), before
        anything is written."""
        if base_model_name_or_path is not None and not isinstance(base_model_name_or_path, str):
            raise TypeError(f"base_model_name_or_path must be a str or None, not "
                            f"{type(base_model_name_or_path).__name__}")
        config = _require_rotary(self.config, "PEFT export")
        projections = _fused_targets(config, self.lora)
        rank = self.lora.rank
        tensors, modules, offset = {}, [], 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            count = math.prod(shape)
            path, factor = _adapter_parameter(name)
            projection = projections[path]
            expected = ((rank, projection.columns) if factor == "a"
                        else (projection.rows, rank))
            if tuple(shape) != expected:
                raise ValueError(f"adapter factor {name} has shape {tuple(shape)}, expected "
                                 f"{expected} for rank {rank} in this model")
            tensors[f"{_PREFIX}{projection.module}.lora_{factor.upper()}.weight"] = (
                tuple(shape), self.values[offset:offset + count])
            offset += count
            if _short(projection.module) not in modules:
                modules.append(_short(projection.module))
        if offset != len(self.values):
            raise ValueError(f"the adapter holds {len(self.values)} values, its factors "
                             f"{offset}")
        document = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model_name_or_path,
            "revision": None,
            "inference_mode": True,
            "r": rank,
            "lora_alpha": self.lora.alpha,
            "lora_dropout": self.lora.dropout,
            "use_rslora": self.lora.rank_stabilized,
            "target_modules": modules,
            "bias": "none",
            "use_dora": False,
            "fan_in_fan_out": False,
            "modules_to_save": None,
            "init_lora_weights": True,
            "layers_to_transform": None,
            "layers_pattern": None,
            "rank_pattern": {},
            "alpha_pattern": {},
        }
        metadata = {"format": "pt"}
        metadata.update({f"{_METADATA_PREFIX}{key}": value
                         for key, value in sorted(self.base.items())})

        def fill(temporary: Path) -> None:
            _write_json(temporary / ADAPTER_CONFIG_FILE, document)
            write_safetensors(temporary / ADAPTER_WEIGHTS_FILE, tensors, metadata)

        return write_directory(Path(os.fspath(directory)), fill, "PEFT export")


def _adapter_parameter(name: str) -> tuple[str, str]:
    """``blocks.0.attention.query.lora_a.weight`` -> (``blocks.0.attention.query``, ``a``)."""
    match = re.fullmatch(r"(?P<path>.+)\.lora_(?P<factor>[ab])\.weight", name)
    if match is None:
        raise ValueError(f"{name!r} is not the name of a LoRA factor")
    return match["path"], match["factor"]


def _base_identity(base) -> dict[str, str]:
    if base is None:
        return {}
    if not isinstance(base, Mapping):
        raise TypeError(f"base must be a mapping of identities, not {type(base).__name__}")
    unknown = [key for key in base if key not in BASE_IDENTITIES]
    if unknown:
        raise ValueError(f"base identity {unknown[0]!r} is unknown (known: "
                         f"{', '.join(BASE_IDENTITIES)})")
    for key, value in base.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"base identity {key} must be a non-empty str, got {value!r}")
    return {key: base[key] for key in BASE_IDENTITIES if key in base}


def _live_model(model):
    """The decoder of ``model`` (a decoder, or a PretrainedModel) and the PretrainedModel."""
    from ..pretrained import PretrainedModel

    if isinstance(model, PretrainedModel):
        return model.model, model
    if isinstance(model, (LlamaMistralTransformer, DecoderOnlyTransformer)):
        return model, None
    raise TypeError(f"model must be a LlamaMistralTransformer or a PretrainedModel, not "
                    f"{type(model).__name__}")


def weights_identity(model) -> str:
    """The SHA-256 of a dense model's float32 weights in parameter order, little-endian: what a
    bundle of it records as ``weights.sha256``."""
    with model.parameters() as parameters:
        return sha256_hex(little_endian_bytes(parameters.flat_values()))


def capture_lora_adapter(model, base: Mapping[str, str] | None = None) -> LoraAdapter:
    """The attached adapter of ``model`` (a decoder or a PretrainedModel) as a
    :class:`LoraAdapter`; ``base`` gives the identities of the base (``weights_sha256``,
    ``artifact_id``, ``base_id``); when it is None, the SHA-256 of a dense base's weights is
    computed (packed NF4 weights have none). ValueError when no adapter is attached (never, or
    merged)."""
    live, _ = _live_model(model)
    if not live.lora_attached:
        state = "merged into its weights" if live.lora_config is not None else "never attached"
        raise ValueError(f"the model has no attached LoRA adapter ({state}): there is no "
                         "adapter to save")
    identity = _base_identity(base)
    if base is None and not live.quantized_linear_weights:
        identity["weights_sha256"] = weights_identity(live)
    with live.adapter_parameters() as parameters:
        names, shapes, values = parameters.names, parameters.shapes, parameters.flat_values()
    return LoraAdapter(live.config, live.lora_config, names, shapes, values,
                       _base_identity(identity))


def adapter_from_checkpoint(checkpoint, where: str = "the checkpoint") -> LoraAdapter:
    """The adapter of a LoRA or QLoRA run's :class:`~..checkpoints.TrainingCheckpoint` at its
    step; its base identities from the checkpoint (the frozen base's weights when they are
    dense, the run's ``base_artifact_id`` or ``base_id``). ValueError naming ``where`` for a
    full fine-tuning checkpoint."""
    from ..checkpoints import ADAPTER_VALUES, MODEL_VALUES

    manifest = checkpoint.manifest
    model = manifest["model"]
    if model["lora"] is None:
        raise ValueError(f"{where} is a checkpoint of a full fine-tuning run (optimizer scope "
                         f"{manifest['optimizer']['scope']!r}): it holds no LoRA adapter; only "
                         "a LoRA or QLoRA run's checkpoint has one")
    config = validate_model_config(model["architecture"], model["config"], where)
    record = model["lora"]
    lora = LoraConfig(record["rank"], record["alpha"], tuple(record["targets"]),
                      record["random_seed"], record.get("rank_stabilized", False),
                      record.get("dropout", 0.0))
    base = {}
    metadata = manifest["metadata"]
    for key, recorded in (("artifact_id", "base_artifact_id"), ("base_id", "base_id")):
        if isinstance(metadata.get(recorded), str) and metadata[recorded]:
            base[key] = metadata[recorded]
    if not model["quantized"]:  # the frozen base, dense: a bundle of it has this SHA-256
        base["weights_sha256"] = next(entry["sha256"] for entry in manifest["members"]
                                      if entry["name"] == MODEL_VALUES)
    table = model["adapter_parameters"]
    return LoraAdapter(config, lora, tuple(entry["name"] for entry in table),
                       tuple(tuple(entry["shape"]) for entry in table),
                       checkpoint.floats(ADAPTER_VALUES), _base_identity(base))


def _bundle_refusal(where: str, metadata: Mapping) -> ValueError:
    method = metadata.get("fine_tuning_method")
    if metadata.get("lora_merged") is True or method in ("lora", "qlora"):
        state = (f"the adapter of its {method or 'LoRA'} run was merged into its weights "
                 "when the run ended")
    else:
        state = "it holds dense weights only"
    return ValueError(f"{where} is a .rift bundle, which holds no LoRA adapter ({state}): "
                      "export the .riftckpt checkpoint of the LoRA/QLoRA run, or keep the "
                      "adapter when training (riftco post-train --adapter-output DIR; "
                      "PostTrainingResult.adapter.save(DIR))")


def _adapter_of(source) -> LoraAdapter:
    from ..artifacts import ModelBundle
    from ..checkpoints import TrainingCheckpoint, read_artifact

    if isinstance(source, LoraAdapter):
        return source
    if isinstance(source, ModelBundle):
        raise _bundle_refusal("the bundle", source.metadata)
    if isinstance(source, TrainingCheckpoint):
        return adapter_from_checkpoint(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source))
        if path.is_file():
            with open(path, "rb") as stream:
                if stream.read(4) == b"GGUF":
                    raise ValueError(f"{source} is a GGUF file, not the .riftckpt checkpoint of "
                                     "a LoRA or QLoRA run")
        kind, loaded = read_artifact(path)
        if kind == "rift":
            raise _bundle_refusal(str(source), loaded.metadata)
        if kind != "riftckpt":
            raise ValueError(f"{source} is a safetensors file, not the .riftckpt checkpoint of "
                             "a LoRA or QLoRA run")
        return adapter_from_checkpoint(loaded, str(source))
    return capture_lora_adapter(source)


def export_peft(source, directory, base_model_name_or_path: str | None = None) -> Path:
    """Write the LoRA adapter of ``source`` as the PEFT adapter directory ``directory`` and
    return its path. ``source``: the ``.riftckpt`` checkpoint (a path or a loaded
    ``TrainingCheckpoint``) of a LoRA or QLoRA run, a model (or PretrainedModel) with an
    attached adapter, or a :class:`LoraAdapter` (e.g. ``PostTrainingResult.adapter``). A
    ``.rift`` bundle (merged weights) and a full fine-tuning checkpoint are refused naming the
    file. See :meth:`LoraAdapter.save` and the module docstring."""
    destination = Path(os.fspath(directory))
    _require_free(destination, "PEFT export")
    return _adapter_of(source).save(destination, base_model_name_or_path)


# ---- reading a PEFT adapter directory -------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PeftAdapter:
    """A PEFT LoRA adapter directory, read and checked on its own (:func:`read_peft_adapter`):
    ``rank``, ``alpha``, ``rank_stabilized`` (``use_rslora``), ``dropout`` (``lora_dropout``),
    ``target_modules`` (a tuple, or
    the string PEFT matches as a regular expression or ``"all-linear"``), ``exclude_modules``,
    ``base_model_name_or_path``, ``tensors`` (PEFT name -> TensorSpan, header only), ``base``
    (the identities riftco recorded, if any) and ``document`` (the config as read)."""

    directory: Path
    rank: int
    alpha: float
    rank_stabilized: bool
    target_modules: tuple[str, ...] | str
    exclude_modules: tuple[str, ...] | str | None
    base_model_name_or_path: str | None
    tensors: Mapping
    base: Mapping[str, str]
    document: Mapping
    dropout: float = 0.0

    @property
    def config_path(self) -> Path:
        return self.directory / ADAPTER_CONFIG_FILE

    @property
    def weights_path(self) -> Path:
        return self.directory / ADAPTER_WEIGHTS_FILE

    @property
    def modules(self) -> tuple[str, ...]:
        """The adapted module names the tensors hold, in name order."""
        return tuple(sorted({_TENSOR_NAME.match(name)["module"] for name in self.tensors}))


def _neutral(value) -> bool:
    return value is None or value is False or (isinstance(value, (dict, list, str))
                                                and not value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _module_names(value, key: str, source: str, allow_none: bool):
    """target_modules / exclude_modules: a tuple of names, a pattern string, or None."""
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        if value != "all-linear":
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"{source}: {key} {value!r} is not a regular expression "
                                 f"({error})") from None
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    if isinstance(value, list) and not value and allow_none:
        return None
    raise ValueError(f"{source}: {key} must be a list of module names or a pattern string, "
                     f"not {value!r}")


def _read_config(path: Path) -> tuple[dict, dict]:
    """The checked adapter_config.json: (its fields as read, the document)."""
    source = str(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a PEFT adapter directory holds "
                                f"{ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE})")
    document = strict_json(path.read_bytes(), source)
    if not isinstance(document, dict):
        raise ValueError(f"{source}: must hold a JSON object")
    peft_type = document.get("peft_type")
    if peft_type != "LORA":
        raise ValueError(f"{source}: peft_type {peft_type!r} is not supported: only LoRA "
                         "adapters (peft_type 'LORA') load")
    task = document.get("task_type")
    if task not in (None, "CAUSAL_LM"):
        raise ValueError(f"{source}: task_type {task!r} is not supported: the adapter must be "
                         "for a causal language model (CAUSAL_LM)")
    rank = document.get("r")
    if not _is_int(rank) or rank <= 0:
        raise ValueError(f"{source}: r must be a positive integer, not {rank!r}")
    alpha = document.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or \
            not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"{source}: lora_alpha must be a positive number, not {alpha!r}")
    rslora = document.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise ValueError(f"{source}: use_rslora must be true or false, not {rslora!r}")
    dropout = document.get("lora_dropout", 0.0)
    if dropout is None:
        dropout = 0.0
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or \
            not math.isfinite(dropout) or not 0 <= dropout < 1:
        raise ValueError(f"{source}: lora_dropout must be a number in [0, 1), not {dropout!r}")
    bias = document.get("bias", "none")
    if bias != "none":
        raise ValueError(f"{source}: bias {bias!r} is not supported: only bias 'none' (our "
                         "LoRA trains no bias)")
    initialisation = document.get("init_lora_weights", True)
    if not any(initialisation is value or (isinstance(value, str) and initialisation == value)
               for value in _PLAIN_INITIALISATIONS):
        raise ValueError(f"{source}: init_lora_weights {initialisation!r} is not supported: "
                         "that initialisation changes the base weights too (PiSSA, OLoRA, "
                         "LoftQ, EVA, CorDA); only true, false or 'gaussian'")
    for key, value in (("rank_pattern", rank), ("alpha_pattern", alpha)):
        pattern = document.get(key)
        if pattern is None:
            continue
        if not isinstance(pattern, dict):
            raise ValueError(f"{source}: {key} must be an object, not {pattern!r}")
        odd = [(module, given) for module, given in pattern.items() if given != value]
        if odd:
            raise ValueError(f"{source}: {key} gives {odd[0][0]!r} {odd[0][1]!r}, not "
                             f"{value!r}: per-module ranks and alphas are not supported (our "
                             "adapters share one rank and alpha)")
    for key, value in document.items():
        if key in _INFORMATIONAL_KEYS or key in _READ_KEYS:
            continue
        if not _neutral(value):
            raise ValueError(f"{source}: {key} = {json.dumps(value)} is not supported (our LoRA "
                             "has no such option; it must be off, null or empty)")
    if "target_modules" not in document:
        raise ValueError(f"{source}: target_modules is missing")
    fields = {
        "rank": rank, "alpha": float(alpha), "rank_stabilized": rslora,
        "dropout": float(dropout),
        "target_modules": _module_names(document["target_modules"], "target_modules", source,
                                        False),
        "exclude_modules": _module_names(document.get("exclude_modules"), "exclude_modules",
                                         source, True),
        "base_model_name_or_path": document.get("base_model_name_or_path")
        if isinstance(document.get("base_model_name_or_path"), str) else None,
    }
    return fields, document


def read_peft_adapter(directory) -> PeftAdapter:
    """The PEFT LoRA adapter in ``directory``, checked on its own (no base yet): the config's
    rules of the module docstring, and a tensor header holding only ``lora_A``/``lora_B``
    factors of rank ``r``, two of each module. ValueError naming the file and key or tensor;
    FileNotFoundError for a missing file. No value is read."""
    directory = Path(os.fspath(directory))
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory (a PEFT adapter directory)")
    fields, document = _read_config(directory / ADAPTER_CONFIG_FILE)
    weights = directory / ADAPTER_WEIGHTS_FILE
    if not weights.is_file():
        if (directory / _PICKLED_WEIGHTS_FILE).is_file():
            raise ValueError(f"{directory / _PICKLED_WEIGHTS_FILE}: a pickled adapter is not "
                             f"read (it can run code); save it as {ADAPTER_WEIGHTS_FILE} "
                             "(safe_serialization=True)")
        raise FileNotFoundError(f"{weights}: no such file")
    tensors, metadata = read_safetensors_header(weights)
    rank = fields["rank"]
    factors: dict[str, set[str]] = {}
    for name, span in tensors.items():
        match = _TENSOR_NAME.match(name)
        if match is None:
            raise ValueError(f"{weights}: tensor {name!r} is not a LoRA factor "
                             f"({_PREFIX}<module>.lora_A.weight or .lora_B.weight)")
        if len(span.shape) != 2:
            raise ValueError(f"{weights}: tensor {name} has shape {list(span.shape)}, not a "
                             "matrix")
        factor = match["factor"]
        held = span.shape[0] if factor == "A" else span.shape[1]
        if held != rank:
            expected = "[r, in]" if factor == "A" else "[out, r]"
            raise ValueError(f"{weights}: tensor {name} has shape {list(span.shape)}, not "
                             f"{expected} with r = {rank} ({ADAPTER_CONFIG_FILE})")
        factors.setdefault(match["module"], set()).add(factor)
    if not tensors:
        raise ValueError(f"{weights}: holds no tensor")
    for module, held in sorted(factors.items()):
        if held != {"A", "B"}:
            missing = ({"A", "B"} - held).pop()
            raise ValueError(f"{weights}: no tensor {_PREFIX}{module}.lora_{missing}.weight "
                             f"for the lora_{held.pop()} of {module}")
    base = {}
    for key in BASE_IDENTITIES:
        value = metadata.get(f"{_METADATA_PREFIX}{key}")
        if value is not None:
            if not value or (key != "base_id" and not _HEX_DIGEST.match(value)):
                raise ValueError(f"{weights}: metadata {_METADATA_PREFIX}{key} {value!r} is not "
                                 "a SHA-256 in hex" if key != "base_id" else
                                 f"{weights}: metadata {_METADATA_PREFIX}{key} is empty")
            base[key] = value
    return PeftAdapter(directory, rank, fields["alpha"], fields["rank_stabilized"],
                       fields["target_modules"], fields["exclude_modules"],
                       fields["base_model_name_or_path"], tensors, base, document,
                       fields["dropout"])


# ---- onto a base ----------------------------------------------------------------------------


def _matches(module: str, entry: str) -> bool:
    return module == entry or module.endswith(f".{entry}")


def _selected(adapter: PeftAdapter, modules: list[str], config: LlamaMistralConfig,
              head: str) -> list[str]:
    """The modules ``target_modules`` minus ``exclude_modules`` select, in model order."""
    source = str(adapter.config_path)
    targets = adapter.target_modules
    known = ", ".join(dict.fromkeys(_short(m) for m in modules))
    if targets == "all-linear":
        chosen = {m for m in modules if m != head}
    elif isinstance(targets, str):
        chosen = {m for m in modules if re.fullmatch(targets, m)}
    else:
        chosen = set()
        for entry in targets:
            found = {m for m in modules if _matches(m, entry)}
            if not found:
                tied = (" (this model ties its head to the token embeddings, and a tied head "
                        "takes no adapter)" if _matches(head, entry) else "")
                raise ValueError(f"{source}: target_modules entry {entry!r} names no projection "
                                 f"of this {config.architecture} model that LoRA can adapt"
                                 f"{tied} (its modules: {known})")
            chosen |= found
    excluded = adapter.exclude_modules
    if isinstance(excluded, str):
        chosen = {m for m in chosen if not re.fullmatch(excluded, m)}
    elif excluded is not None:
        chosen = {m for m in chosen if not any(_matches(m, entry) for entry in excluded)}
    selected = [m for m in modules if m in chosen]
    if not selected:
        raise ValueError(f"{source}: target_modules {targets!r} selects no projection of this "
                         f"{config.architecture} model (its modules: {known})")
    return selected


def _attachment(adapter: PeftAdapter, config) -> tuple[LoraConfig, dict]:
    """The LoraConfig to attach to a model of ``config`` and, by our factor name, where its
    values lie: ``(span, first_row, rows)`` (rows of B for a fused module's part; None: the
    whole tensor). Every base-dependent rule, before the model changes."""
    config = _require_rotary(config, "loading a PEFT adapter")
    projections = _projections(config)
    modules = _by_module(projections)
    head = checkpoint_tensor_name(config.architecture, "huggingface",
                                  f"{_HEAD}.weight")[0].removesuffix(".weight")
    selected = _selected(adapter, list(modules), config, head)
    source, weights = str(adapter.config_path), adapter.weights_path
    targets = []
    for target in LORA_TARGETS:
        kind = [p for p in projections.values() if p.target == target]
        chosen = [p for p in kind if p.module in selected]
        if chosen and len(chosen) != len(kind):
            missing = next(p for p in kind if p.module not in selected)
            raise ValueError(f"{source}: target_modules selects {chosen[0].module} but not "
                             f"{missing.module}: layer-selective adapters are not supported "
                             "(ours adapt a projection in every block)")
        if chosen:
            targets.append(target)
    expected = {}
    for module in selected:
        parts = modules[module]
        rows = sum(p.rows for p in parts)
        expected[f"{_PREFIX}{module}.lora_A.weight"] = (adapter.rank, parts[0].columns)
        expected[f"{_PREFIX}{module}.lora_B.weight"] = (rows, adapter.rank)
    for name in adapter.tensors:
        if name not in expected:
            raise ValueError(f"{weights}: tensor {name} is not a factor of a module "
                             f"target_modules selects ({adapter.target_modules!r}) in this "
                             f"{config.architecture} model")
    for name, shape in expected.items():
        span = adapter.tensors.get(name)
        module = _TENSOR_NAME.match(name)["module"]
        if span is None:
            raise ValueError(f"{weights}: no tensor {name} (target_modules selects {module})")
        if span.shape != shape:
            parts = modules[module]
            raise ValueError(f"{weights}: tensor {name} has shape {list(span.shape)}, expected "
                             f"{list(shape)}: {module} maps {parts[0].columns} to "
                             f"{sum(p.rows for p in parts)} features in this model, r = "
                             f"{adapter.rank}")
    try:
        lora = LoraConfig(rank=adapter.rank, alpha=adapter.alpha, targets=tuple(targets),
                          rank_stabilized=adapter.rank_stabilized, dropout=adapter.dropout)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
    plan = {}
    for projection in projections.values():
        if projection.target not in targets:
            continue
        a = adapter.tensors[f"{_PREFIX}{projection.module}.lora_A.weight"]
        b = adapter.tensors[f"{_PREFIX}{projection.module}.lora_B.weight"]
        plan[f"{projection.path}.lora_a.weight"] = (a, None, None)
        plan[f"{projection.path}.lora_b.weight"] = (b, projection.first_row, projection.rows)
    return lora, plan


def _payloads(plan: dict) -> dict[str, tuple[str, bytes]]:
    """Every factor's bytes (a fused module's part: its rows of B), read before the model
    changes."""
    by_file: dict[Path, list[str]] = {}
    for name, (span, _, _) in plan.items():
        by_file.setdefault(span.path, []).append(name)
    payloads = {}
    for path, names in by_file.items():
        with _mapped(path) as view:
            for name in names:
                span, first_row, rows = plan[name]
                begin, end = span.begin, span.end
                if first_row is not None:
                    row_bytes = (end - begin) // span.shape[0]
                    begin, end = begin + first_row * row_bytes, begin + (first_row + rows) \
                        * row_bytes
                payloads[name] = (span.dtype, bytes(view[begin:end]))
    return payloads


def source_identity(path) -> str:
    """What identifies a pretrained source for its checkpoints and adapters (``base_id``): the
    SHA-256 of a file (GGUF or bundle), or of a directory's files (names and contents, in name
    order)."""
    digest = hashlib.sha256()
    path = Path(os.fspath(path))
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.name.encode() + b"\0" if len(files) > 1 else b"")
        with open(file, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _bundle_artifact_id(path: Path) -> str | None:
    """The artifact id a ``.rift`` file's manifest records (None for any other file)."""
    with open(path, "rb") as stream:
        if stream.read(4) != b"PK\x03\x04":
            return None
    data, where = read_file(path, "a bundle")
    members = read_stored_zip(data, (MANIFEST_NAME,), where, (WEIGHTS_NAME,))
    manifest = strict_json(bytes(members[MANIFEST_NAME]), where)
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        return None
    return manifest.get("artifact_id")


def _require_base(adapter: PeftAdapter, live, source: str | None, base_id: str | None) -> None:
    """The base must prove to be the adapter's (see the module docstring)."""
    recorded = adapter.base
    if not recorded:
        return
    path = Path(source) if source is not None and os.path.exists(source) else None

    def artifact_id():
        return _bundle_artifact_id(path) if path is not None and path.is_file() else None

    def source_id():
        if base_id is not None:
            return base_id
        return source_identity(path) if path is not None else None

    def weights():
        return None if live.quantized_linear_weights else weights_identity(live)

    mismatches = []
    for key, compute in (("base_id", source_id), ("artifact_id", artifact_id),
                         ("weights_sha256", weights)):
        if key not in recorded:
            continue
        actual = compute()
        if actual is None:
            continue
        if actual == recorded[key]:
            return
        mismatches.append(f"{key} {recorded[key]} in the adapter, {actual} for this model")
    weights_file = adapter.weights_path
    if mismatches:
        raise ValueError(f"{weights_file}: the adapter was trained on another base ("
                         + "; ".join(mismatches) + "); attach it anyway with check_base=False "
                         "(riftco: --skip-adapter-base-check)")
    raise ValueError(f"{weights_file}: the adapter records its base ("
                     + ", ".join(f"{key} {value}" for key, value in recorded.items())
                     + "), and none of these can be checked on this model; give its base_id, "
                     "or attach it anyway with check_base=False (riftco: "
                     "--skip-adapter-base-check)")


def load_peft_adapter(model, directory, *, base_id: str | None = None,
                      check_base: bool = True) -> LoraConfig:
    """Attach the PEFT LoRA adapter in ``directory`` (or an already read :class:`PeftAdapter`)
    to ``model`` (a rotary-family decoder, or a PretrainedModel, whose ``source`` then
    identifies the base) with its trained values, and return the :class:`LoraConfig` attached.
    The adapter stays unmerged (``model.merge_lora()`` folds it in).

    Every rule of the module docstring is checked before the model changes, and so is the base
    (``check_base``; ``base_id`` names a pretrained base as its fine-tuning run named it).
    ValueError naming the file and key or tensor; a model that already has (or had) an adapter
    is a ValueError too: one adapter per model lifetime.

    ``lora_dropout`` becomes the config's ``dropout``; as PEFT's ``from_pretrained`` loads for
    inference, a model given an adapter with dropout > 0 is left in evaluation mode
    (``model.lora_dropout_enabled`` False: its forwards apply none); a trainer
    (:class:`~riftco_transformer.training.CausalLanguageModelTrainer`) turns it back on."""
    live, pretrained = _live_model(model)
    if not isinstance(check_base, bool):
        raise TypeError(f"check_base must be a bool, not {type(check_base).__name__}")
    if base_id is not None and not isinstance(base_id, str):
        raise TypeError(f"base_id must be a str or None, not {type(base_id).__name__}")
    adapter = directory if isinstance(directory, PeftAdapter) else read_peft_adapter(directory)
    if live.lora_config is not None:
        raise ValueError(f"the model already has a LoRA adapter ("
                         f"{'attached' if live.lora_attached else 'merged'}): a model takes one "
                         f"adapter in its lifetime; load {adapter.directory} onto a fresh base")
    lora, plan = _attachment(adapter, live.config)
    if check_base:
        _require_base(adapter, live, None if pretrained is None else pretrained.source, base_id)
    payloads = _payloads(plan)
    if pretrained is not None:
        pretrained.reset_generator()  # its KV-cache pool pins the parameters
    live.attach_lora(lora)
    if lora.dropout > 0.0:
        live.lora_dropout_enabled = False
    with live.adapter_parameters() as parameters:
        names = parameters.names
        if set(names) != set(payloads):
            raise AssertionError(f"attached factors {sorted(set(names) ^ set(payloads))} differ "
                                 "from the adapter's")
        for index, name in enumerate(names):
            dtype, data = payloads[name]
            parameters.load_from_bytes(index, dtype, data)
    return lora
