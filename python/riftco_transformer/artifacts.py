"""Model bundles (``.rift``): an immutable, content-addressed model with its tokenizer.

A bundle is a deterministic stored ZIP (:mod:`._container`) of exactly two members:

- ``manifest.json``: canonical JSON (at most 64 MiB) holding ``format``
  (``"riftco-transformer-model-bundle"``), ``format_version`` (1), ``architecture``
  (``"riftco_decoder_v1"``, the GPT decoder, or ``"riftco_llama_mistral_v1"``: then ``config``
  holds the :class:`LlamaMistralConfig` fields and ``tokenizer`` a pretrained tokenizer's
  exact vocabulary, ``{"method": "pretrained", "model", "pretokenizer", "tokens", "merges",
  "token_types", "scores", "bos_id", "eos_id", "unknown_id", "ignore_merges",
  "add_dummy_prefix", "chat_template"}``), ``stage``, ``parent_artifact_id`` (64 hex digits
  or null, for lineage), ``config`` (the eight :class:`TransformerConfig` fields),
  ``tokenizer`` (the exact state: ``{"method": "byte", "byte_vocabulary": [...]}`` or
  ``{"method": "bpe", "merge_rules": [[left, right, result], ...]}``), ``parameters``
  (``[{name, shape, offset, count}]``, offsets contiguous from 0 in float units, in the
  model's canonical order), ``weights`` (``{file, dtype: "float32", byte_order: "little",
  count, sha256}``), free ``metadata`` (a JSON object) and ``artifact_id``;
- ``weights.f32le``: every parameter value, little-endian float32, finite.

``artifact_id`` is the SHA-256 of the canonical manifest without the ``artifact_id`` key, so it
depends on the weights (through their hash), the tokenizer, the stage, the parent and the
metadata. Loading checks everything — the container, the manifest's schema and every value
in it, the tokenizer rules, the parameter table against the config, the weights' size, hash
and finiteness, and the recomputed id — before any live model exists; any failure is a
ValueError naming the field (FileNotFoundError when the file is missing). Saving is atomic
(:mod:`._files`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._container import canonical_json, read_stored_zip, sha256_hex, strict_json, write_stored_zip
from ._files import atomic_write, read_file
from .native import (
    DecoderOnlyTransformer,
    LlamaMistralConfig,
    LlamaMistralTransformer,
    PretrainedTokenizer,
    RiftcoTransformerError,
    Tokenizer,
    TransformerConfig,
)
from .native._validation import UINT32_LIMIT
from .native.pretrained_tokenizer import PRETOKENIZER_VALUES

BUNDLE_FORMAT = "riftco-transformer-model-bundle"
BUNDLE_FORMAT_VERSION = 1
ARCHITECTURE = "riftco_decoder_v1"
LLAMA_ARCHITECTURE = "riftco_llama_mistral_v1"
ARCHITECTURES = (ARCHITECTURE, LLAMA_ARCHITECTURE)
MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "weights.f32le"
# A pretrained model's vocabulary and merges live in the manifest (SmolLM2's: ~1.4 MB).
MAXIMUM_MANIFEST_BYTES = 1 << 26
MAXIMUM_BLOCKS = 256

_HEX_ID = re.compile(r"[0-9a-f]{64}\Z")
# The config's fields, in TransformerConfig's order (the six dimensions, the seed, epsilon,
# then the GPT-2 variant fields).
CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(TransformerConfig))
# The variant fields a GPT-2 import needs, with their defaults. A manifest records one only
# when it differs from its default, so every earlier artifact (eight fields) still validates
# and a default model's artifact id is what it always was.
OPTIONAL_CONFIG_DEFAULTS = {"feed_forward_activation": "gelu", "tie_embeddings": False}
REQUIRED_CONFIG_FIELDS = tuple(name for name in CONFIG_FIELDS
                               if name not in OPTIONAL_CONFIG_DEFAULTS)


def config_record(config: TransformerConfig) -> dict:
    """The manifest form of a GPT config: every required field, and each variant field
    that is not at its default."""
    record = {name: getattr(config, name) for name in REQUIRED_CONFIG_FIELDS}
    for name, default in OPTIONAL_CONFIG_DEFAULTS.items():
        if getattr(config, name) != default:
            record[name] = getattr(config, name)
    return record
LLAMA_CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(LlamaMistralConfig))
# The fields of the first Llama/Mistral bundles (before the family choices of C ABI 2.10):
# every bundle has them; the later ones are optional and default to Llama's choices.
LLAMA_REQUIRED_CONFIG_FIELDS = (
    "vocabulary_size", "maximum_context", "model_width", "query_head_count",
    "key_value_head_count", "block_count", "feed_forward_width", "architecture",
    "rms_norm_epsilon", "rope_theta", "sliding_window", "tie_embeddings", "random_seed",
)
_LLAMA_CHOICE_DEFAULTS = {field.name: field.default
                          for field in dataclasses.fields(LlamaMistralConfig)}
PRETRAINED_TOKENIZER_KEYS = {
    "method", "model", "pretokenizer", "tokens", "merges", "token_types", "scores", "bos_id",
    "eos_id", "unknown_id", "ignore_merges", "add_dummy_prefix", "chat_template",
}
_MANIFEST_KEYS = {
    "format",
    "format_version",
    "architecture",
    "stage",
    "parent_artifact_id",
    "config",
    "tokenizer",
    "parameters",
    "weights",
    "metadata",
    "artifact_id",
}


@dataclass(frozen=True)
class ParameterSpec:
    """One row of a bundle's parameter table: ``count`` floats at flat ``offset``."""

    name: str
    shape: tuple[int, ...]
    offset: int
    count: int


def decoder_parameter_shapes(config: TransformerConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The GPT decoder's parameters, in canonical order, with their shapes ([out, in])."""
    v, c, d, f = (
        config.vocabulary_size,
        config.maximum_context,
        config.model_width,
        config.feed_forward_width,
    )
    shapes = [("token_embedding.weight", (v, d)), ("position_embedding.weight", (c, d))]
    for block in range(config.block_count):
        prefix = f"blocks.{block}."
        shapes += [(prefix + "attention_norm.scale", (d,)), (prefix + "attention_norm.bias", (d,))]
        for projection in ("query", "key", "value", "output"):
            shapes += [
                (f"{prefix}attention.{projection}.weight", (d, d)),
                (f"{prefix}attention.{projection}.bias", (d,)),
            ]
        shapes += [
            (prefix + "feed_forward_norm.scale", (d,)),
            (prefix + "feed_forward_norm.bias", (d,)),
            (prefix + "feed_forward.expand.weight", (f, d)),
            (prefix + "feed_forward.expand.bias", (f,)),
            (prefix + "feed_forward.project.weight", (d, f)),
            (prefix + "feed_forward.project.bias", (d,)),
        ]
    shapes += [("final_norm.scale", (d,)), ("final_norm.bias", (d,))]
    if not config.tie_embeddings:
        shapes += [("language_model_head.weight", (v, d)), ("language_model_head.bias", (v,))]
    return shapes


def llama_parameter_shapes(config: LlamaMistralConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The general decoder's parameters (every family, the GPT-2 preset's choices included),
    in canonical order, with their shapes."""
    v, d, f = config.vocabulary_size, config.model_width, config.feed_forward_width
    head = config.resolved_head_width
    q = config.query_head_count * head
    kv = config.key_value_head_count * head
    # A norm's parameters: RMSNorm's scale, LayerNorm's scale and bias (the QK-norms are RMS).
    norm_parts = ("scale", "bias") if config.norm == "layer" else ("scale",)

    def norm(name: str) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"{name}.{part}", (d,)) for part in norm_parts]

    def linear(name: str, rows: int, columns: int, bias: bool) -> list[tuple[str, tuple[int, ...]]]:
        return [(name + ".weight", (rows, columns))] + ([(name + ".bias", (rows,))] if bias else [])

    shapes = [("token_embedding.weight", (v, d))]
    if config.positions == "learned":
        shapes.append(("position_embedding.weight", (config.maximum_context, d)))
    for block in range(config.block_count):
        prefix = f"blocks.{block}."
        attention = prefix + "attention."
        shapes += norm(prefix + "attention_norm")
        for name, rows in (("query", q), ("key", kv), ("value", kv)):
            shapes += linear(attention + name, rows, d, config.query_key_value_bias)
        shapes += linear(attention + "output", d, q, config.output_bias)
        if config.query_key_norm:
            shapes += [(attention + "query_norm.scale", (head,)),
                       (attention + "key_norm.scale", (head,))]
        if config.post_block_norms:
            shapes += norm(prefix + "post_attention_norm")
        shapes += norm(prefix + "feed_forward_norm")
        bias = config.feed_forward_bias
        if config.feed_forward == "plain":
            shapes += (linear(prefix + "feed_forward.expand", f, d, bias)
                       + linear(prefix + "feed_forward.project", d, f, bias))
        else:
            shapes += (linear(prefix + "feed_forward.gate", f, d, bias)
                       + linear(prefix + "feed_forward.up", f, d, bias)
                       + linear(prefix + "feed_forward.down", d, f, bias))
        if config.post_block_norms:
            shapes += norm(prefix + "post_feed_forward_norm")
    shapes += norm("final_norm")
    if not config.tie_embeddings:
        shapes += linear("language_model_head", v, d, config.head_bias)
    return shapes


# ---- the one home of what differs between the two decoder classes in an artifact ----------


def model_record(model) -> tuple[str, dict]:
    """``(architecture, config record)`` of a live model for a manifest: the GPT decoder's
    ``riftco_decoder_v1`` or the rotary decoder's ``riftco_llama_mistral_v1`` (every family).
    TypeError for anything else."""
    if isinstance(model, LlamaMistralTransformer):
        # The first bundles' fields, and each family choice that is not Llama's default: a
        # Llama/Mistral bundle's manifest (and artifact id) is what it was before them.
        config = model.config
        recorded = {
            name: getattr(config, name) for name in LLAMA_CONFIG_FIELDS
            if name in LLAMA_REQUIRED_CONFIG_FIELDS
            or getattr(config, name) != _LLAMA_CHOICE_DEFAULTS[name]
        }
        # JSON's form: rope_frequency_factors is a tuple in the config, a list in a file.
        return LLAMA_ARCHITECTURE, {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in recorded.items()
        }
    if isinstance(model, DecoderOnlyTransformer):
        return ARCHITECTURE, config_record(model.config)
    raise TypeError("model must be a DecoderOnlyTransformer or a LlamaMistralTransformer, "
                    f"not {type(model).__name__}")


def validate_model_config(architecture: object, config: object,
                          where: str) -> TransformerConfig | LlamaMistralConfig:
    """A manifest's ``architecture`` and ``config`` as the config object (ValueError)."""
    if architecture == LLAMA_ARCHITECTURE:
        return _validate_llama_config(config, where)
    if architecture == ARCHITECTURE:
        return _validate_config(config, where)
    raise ValueError(f"{where}: architecture {architecture!r} is not one of {list(ARCHITECTURES)}")


def build_model(config: TransformerConfig | LlamaMistralConfig, attention: str,
                activation_checkpointing: str):
    """A new model of the class ``config`` describes (random weights from its seed)."""
    model_class = (LlamaMistralTransformer if isinstance(config, LlamaMistralConfig)
                   else DecoderOnlyTransformer)
    return model_class(config, attention, activation_checkpointing)


def tokenizer_record(tokenizer: Tokenizer | PretrainedTokenizer,
                     chat_template: str | None = None) -> dict:
    """A tokenizer's exact state for a manifest: ours (byte or BPE) or a pretrained one."""
    if isinstance(tokenizer, PretrainedTokenizer):
        return {"method": "pretrained", **tokenizer.state(), "chat_template": chat_template}
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError("tokenizer must be a Tokenizer or a PretrainedTokenizer, "
                        f"not {type(tokenizer).__name__}")
    method, vocabulary, rules = tokenizer.state()
    if method == "byte":
        return {"method": "byte", "byte_vocabulary": list(vocabulary)}
    return {"method": "bpe", "merge_rules": [list(rule) for rule in rules]}


def require_tokenizer_fits(tokenizer_size: int, pretrained: bool, vocabulary_size: int,
                           where: str) -> None:
    """Our tokenizers have exactly the model's vocabulary; a pretrained checkpoint's may have
    fewer tokens than its model, whose vocabulary is padded (the padding ids are never
    sampled). ValueError otherwise, naming both sizes."""
    if tokenizer_size > vocabulary_size or (not pretrained and tokenizer_size != vocabulary_size):
        raise ValueError(f"{where}: tokenizer vocabulary {tokenizer_size} != model "
                         f"vocabulary_size {vocabulary_size}"
                         + (" (a pretrained one may be smaller, not larger)" if pretrained
                            else ""))


def tokenizer_from_record(state: dict) -> Tokenizer | PretrainedTokenizer:
    """A new tokenizer restored exactly from :func:`tokenizer_record`'s state."""
    if state["method"] == "pretrained":
        return PretrainedTokenizer.from_state(state)
    if state["method"] == "byte":
        return Tokenizer.from_state("byte", bytes(state["byte_vocabulary"]))
    return Tokenizer.from_state("bpe", merge_rules=[tuple(rule) for rule in state["merge_rules"]])


def validate_tokenizer_record(state: object, where: str) -> int:
    """The vocabulary size of a manifest's tokenizer state, a pretrained tokenizer's or one of
    ours (ValueError when it breaks that kind's rules)."""
    if isinstance(state, dict) and state.get("method") == "pretrained":
        return _validate_pretrained_tokenizer(state, where)
    return _validate_tokenizer(state, where)


def little_endian_bytes(values: array) -> bytes:
    """float32 ``values`` as little-endian bytes."""
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array("f", values)
    swapped.byteswap()
    return swapped.tobytes()


def floats_from_little_endian(data) -> array:
    """Little-endian float32 bytes as ``array('f')``."""
    values = array("f")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def first_non_finite(values: array) -> int | None:
    """The index of the first NaN or infinity in ``values``, or None."""
    isfinite = math.isfinite
    if all(map(isfinite, values)):
        return None
    return next(index for index, value in enumerate(values) if not isfinite(value))


class ModelRuntime:
    """A live model and its tokenizer, made by :meth:`ModelBundle.instantiate`; closeable."""

    def __init__(self, bundle: ModelBundle, model: DecoderOnlyTransformer, tokenizer: Tokenizer):
        self.bundle = bundle
        self.model = model
        self.tokenizer = tokenizer

    def close(self) -> None:
        self.model.close()
        self.tokenizer.close()

    @property
    def closed(self) -> bool:
        return self.model.closed

    def __enter__(self) -> ModelRuntime:
        return self

    def __exit__(self, *exception) -> None:
        self.close()


class ModelBundle:
    """An immutable model artifact: config, exact tokenizer state, weights, stage and lineage.

    Make one with :meth:`capture` (from a live model) or :meth:`load` (from a ``.rift`` file);
    write it with :meth:`save`; make a live model with :meth:`instantiate`.
    """

    def __init__(self, manifest_bytes: bytes, manifest: dict, weights: array) -> None:
        # Private: use capture/load/from_bytes, which validate.
        self._manifest_bytes = manifest_bytes
        self._manifest = manifest
        self._weights = weights
        config = manifest["config"]
        if manifest["architecture"] == LLAMA_ARCHITECTURE:
            self._config = LlamaMistralConfig(**{name: config[name] for name in LLAMA_CONFIG_FIELDS
                                                 if name in config})
        else:
            self._config = TransformerConfig(**{name: config[name] for name in CONFIG_FIELDS
                                                if name in config})
        self._parameters = tuple(
            ParameterSpec(entry["name"], tuple(entry["shape"]), entry["offset"], entry["count"])
            for entry in manifest["parameters"]
        )

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def capture(
        cls,
        model: DecoderOnlyTransformer | LlamaMistralTransformer,
        tokenizer: Tokenizer | PretrainedTokenizer,
        stage: str,
        parent_artifact_id: str | None = None,
        metadata: Mapping | None = None,
        chat_template: str | None = None,
    ) -> ModelBundle:
        """A bundle of ``model``'s current weights and ``tokenizer``'s exact state.

        The model must be dense: an attached (unmerged) LoRA adapter or packed NF4 weights
        are a ValueError ("merge first"). ``stage`` is a nonempty str, ``parent_artifact_id``
        a 64-hex-digit id or None, ``metadata`` a JSON-serialisable mapping (finite numbers).
        """
        architecture, config_entry = model_record(model)
        # Either decoder carries a pretrained tokenizer (an imported checkpoint) or one of ours
        # (byte or BPE: a model pretrained here, of any architecture).
        pretrained = isinstance(tokenizer, PretrainedTokenizer)
        if not pretrained and not isinstance(tokenizer, Tokenizer):
            raise TypeError("tokenizer must be a Tokenizer or a PretrainedTokenizer, "
                            f"not {type(tokenizer).__name__}")
        if chat_template is not None and (not pretrained or not isinstance(chat_template, str)):
            raise TypeError("chat_template is the Jinja text of a pretrained model's template "
                            "(a str, with a PretrainedTokenizer)")
        if model.lora_attached:
            raise ValueError("model has an attached LoRA adapter: merge_lora() before capture")
        if model.quantized_linear_weights:
            packed = model.linear_weight_format
            if packed == "nf4":
                raise ValueError("model has packed NF4 weights: merge_lora() (which "
                                 "dequantizes) before capture")
            raise ValueError(f"model has packed {packed} weights (a GGUF file's blocks), which "
                             "bundles do not hold yet: load the file with weights='f32' to "
                             "save a bundle, or keep serving it from the file")
        _require_stage(stage)
        _require_parent(parent_artifact_id)
        metadata = _require_metadata(metadata)
        tokenizer_size = tokenizer.vocabulary_size if pretrained else tokenizer.vocab_size
        require_tokenizer_fits(tokenizer_size, pretrained, model.config.vocabulary_size,
                               "capture")
        with model.parameters() as parameter_list:
            names, shapes = parameter_list.names, parameter_list.shapes
            weights = parameter_list.flat_values()
        tokenizer_state = tokenizer_record(tokenizer, chat_template)
        offset = 0
        table = []
        for name, shape in zip(names, shapes, strict=True):
            count = math.prod(shape)
            table.append({"name": name, "shape": list(shape), "offset": offset, "count": count})
            offset += count
        manifest = {
            "format": BUNDLE_FORMAT,
            "format_version": BUNDLE_FORMAT_VERSION,
            "architecture": architecture,
            "stage": stage,
            "parent_artifact_id": parent_artifact_id,
            "config": config_entry,
            "tokenizer": tokenizer_state,
            "parameters": table,
            "weights": {
                "file": WEIGHTS_NAME,
                "dtype": "float32",
                "byte_order": "little",
                "count": len(weights),
                "sha256": sha256_hex(little_endian_bytes(weights)),
            },
            "metadata": metadata,
        }
        manifest["artifact_id"] = sha256_hex(canonical_json(manifest))
        manifest_bytes = canonical_json(manifest)
        if len(manifest_bytes) > MAXIMUM_MANIFEST_BYTES:
            raise ValueError(
                f"the manifest would be {len(manifest_bytes)} bytes (limit "
                f"{MAXIMUM_MANIFEST_BYTES}): metadata or tokenizer state too large"
            )
        # Round-trip through the validator: what capture makes, load accepts.
        _validate_manifest(strict_json(manifest_bytes, MANIFEST_NAME), MANIFEST_NAME)
        return cls(manifest_bytes, manifest, weights)

    @classmethod
    def load(cls, path) -> ModelBundle:
        """Read and fully validate a ``.rift`` file (ValueError naming what is wrong)."""
        return cls.from_bytes(*read_file(path, "a bundle"))

    @classmethod
    def from_bytes(cls, data, source: str = "<bundle>") -> ModelBundle:
        """:meth:`load` from bytes in memory."""
        members = read_stored_zip(data, (MANIFEST_NAME, WEIGHTS_NAME), source)
        manifest_view = members[MANIFEST_NAME]
        if manifest_view.nbytes > MAXIMUM_MANIFEST_BYTES:
            raise ValueError(
                f"{source}: manifest is {manifest_view.nbytes} bytes (limit "
                f"{MAXIMUM_MANIFEST_BYTES})"
            )
        manifest_bytes = bytes(manifest_view)
        where = f"{source}: {MANIFEST_NAME}"
        manifest = strict_json(manifest_bytes, where)
        _validate_manifest(manifest, where)
        if canonical_json(manifest) != manifest_bytes:
            raise ValueError(f"{where}: not in canonical form (sorted keys, compact)")
        weights_view = members[WEIGHTS_NAME]
        weights_entry = manifest["weights"]
        if weights_view.nbytes != 4 * weights_entry["count"]:
            raise ValueError(
                f"{source}: {WEIGHTS_NAME} holds {weights_view.nbytes} bytes, but the manifest "
                f"lists {weights_entry['count']} float32 values ({4 * weights_entry['count']} "
                "bytes)"
            )
        if sha256_hex(weights_view) != weights_entry["sha256"]:
            raise ValueError(f"{source}: {WEIGHTS_NAME} does not match weights.sha256 (corrupted)")
        weights = floats_from_little_endian(weights_view)
        bad = first_non_finite(weights)
        if bad is not None:
            raise ValueError(f"{source}: {WEIGHTS_NAME} value {bad} is not finite")
        return cls(manifest_bytes, manifest, weights)

    # ---- output -----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self._write(buffer)
        return buffer.getvalue()

    def _write(self, stream) -> None:
        write_stored_zip(
            stream,
            [
                (MANIFEST_NAME, self._manifest_bytes),
                (WEIGHTS_NAME, little_endian_bytes(self._weights)),
            ],
        )

    def save(self, path) -> Path:
        """Write the bundle to ``path`` atomically (temporary file, fsync, rename)."""
        return atomic_write(path, self._write)

    def instantiate(
        self,
        backend: str = "cpu",
        attention: str = "materialized",
        activation_checkpointing: str = "disabled",
    ) -> ModelRuntime:
        """A fresh live model with these weights, and the tokenizer, as a :class:`ModelRuntime`.

        The model's parameter names and shapes must equal the bundle's table (ValueError);
        the values load transactionally, then the model moves to ``backend``.
        """
        tokenizer = self.tokenizer()
        model = None
        try:
            model = build_model(self._config, attention, activation_checkpointing)
            with model.parameters() as parameter_list:
                actual = list(zip(parameter_list.names, parameter_list.shapes, strict=True))
                expected = [(spec.name, spec.shape) for spec in self._parameters]
                if actual != expected:
                    raise ValueError("the bundle's parameter table does not match the model")
                parameter_list.load_flat_values(self._weights)
            if model.backend != backend:
                model.to(backend)
        except BaseException:
            if model is not None:
                model.close()
            tokenizer.close()
            raise
        return ModelRuntime(self, model, tokenizer)

    def tokenizer(self) -> Tokenizer | PretrainedTokenizer:
        """A new tokenizer restored exactly from the bundle's state (a
        :class:`PretrainedTokenizer` for Llama/Mistral bundles and imported GPT-2 models)."""
        return tokenizer_from_record(self._manifest["tokenizer"])

    # ---- views --------------------------------------------------------------------------

    @property
    def artifact_id(self) -> str:
        return self._manifest["artifact_id"]

    @property
    def stage(self) -> str:
        return self._manifest["stage"]

    @property
    def parent_artifact_id(self) -> str | None:
        return self._manifest["parent_artifact_id"]

    @property
    def config(self) -> TransformerConfig | LlamaMistralConfig:
        return self._config

    @property
    def architecture(self) -> str:
        """``"gpt"``, or the rotary decoder's family (``"llama"``, ``"qwen3"``, ...)."""
        if isinstance(self._config, LlamaMistralConfig):
            return self._config.architecture
        return "gpt"

    @property
    def chat_template(self) -> str | None:
        """The Jinja text of a pretrained model's chat template, when the bundle has one."""
        return self._manifest["tokenizer"].get("chat_template")

    @property
    def metadata(self) -> dict:
        """A copy of the free metadata."""
        return copy.deepcopy(self._manifest["metadata"])

    @property
    def tokenizer_state(self) -> dict:
        return copy.deepcopy(self._manifest["tokenizer"])

    @property
    def parameters(self) -> tuple[ParameterSpec, ...]:
        return self._parameters

    @property
    def weights(self) -> array:
        """A copy of the flat float32 weights."""
        return array("f", self._weights)

    @property
    def manifest(self) -> dict:
        """A copy of the manifest."""
        return copy.deepcopy(self._manifest)

    @property
    def manifest_bytes(self) -> bytes:
        return self._manifest_bytes

    @property
    def weight_count(self) -> int:
        return len(self._weights)

    def __repr__(self) -> str:
        return (
            f"<ModelBundle {self.artifact_id[:12]} stage={self.stage!r} "
            f"parameters={len(self._weights)}>"
        )


def load_bundle(path) -> ModelBundle:
    """:meth:`ModelBundle.load`."""
    return ModelBundle.load(path)


# ---- validation ---------------------------------------------------------------------------


def _require_stage(stage: object) -> None:
    if not isinstance(stage, str) or not stage.strip():
        raise ValueError(f"stage must be a nonempty str, got {stage!r}")


def _require_parent(parent: object) -> None:
    if parent is not None and (not isinstance(parent, str) or not _HEX_ID.match(parent)):
        raise ValueError(
            f"parent_artifact_id must be 64 lowercase hex digits or None, got {parent!r}"
        )


def _require_metadata(metadata: object) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
    plain = strict_json(canonical_json(dict(metadata)), "metadata")
    return plain


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def finite_number(value: object) -> float | None:
    """``value`` as a finite float when it is a JSON number that is one, else None (a bool,
    a string, NaN, infinity, or an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _field(mapping: dict, key: str, where: str) -> object:
    if key not in mapping:
        raise ValueError(f"{where}: missing {key!r}")
    return mapping[key]


def _validate_manifest(manifest: object, where: str) -> None:
    """Every rule of the manifest schema; ValueError prefixed ``where``."""
    if not isinstance(manifest, dict):
        raise ValueError(f"{where}: the manifest must be a JSON object")
    keys = set(manifest)
    if keys != _MANIFEST_KEYS:
        missing, extra = sorted(_MANIFEST_KEYS - keys), sorted(keys - _MANIFEST_KEYS)
        raise ValueError(f"{where}: manifest keys differ (missing {missing}, unexpected {extra})")
    if manifest["format"] != BUNDLE_FORMAT:
        raise ValueError(f"{where}: format is {manifest['format']!r}, not {BUNDLE_FORMAT!r}")
    if manifest["format_version"] != BUNDLE_FORMAT_VERSION or not _is_int(
        manifest["format_version"]
    ):
        raise ValueError(
            f"{where}: format_version {manifest['format_version']!r} is not supported "
            f"(this reader knows {BUNDLE_FORMAT_VERSION})"
        )
    if manifest["architecture"] not in ARCHITECTURES:
        raise ValueError(
            f"{where}: architecture {manifest['architecture']!r} is not one of "
            f"{list(ARCHITECTURES)}"
        )
    try:
        _require_stage(manifest["stage"])
        _require_parent(manifest["parent_artifact_id"])
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if not isinstance(manifest["metadata"], dict):
        raise ValueError(f"{where}: metadata must be a JSON object")
    artifact_id = manifest["artifact_id"]
    if not isinstance(artifact_id, str) or not _HEX_ID.match(artifact_id):
        raise ValueError(f"{where}: artifact_id must be 64 lowercase hex digits")
    config = validate_model_config(manifest["architecture"], manifest["config"], where)
    require_tokenizer_fits(validate_tokenizer_record(manifest["tokenizer"], where),
                           manifest["tokenizer"]["method"] == "pretrained",
                           config.vocabulary_size, where)
    total = _validate_parameters(manifest["parameters"], config, where)
    _validate_weights_entry(manifest["weights"], total, where)
    without_id = {key: value for key, value in manifest.items() if key != "artifact_id"}
    if sha256_hex(canonical_json(without_id)) != artifact_id:
        raise ValueError(f"{where}: artifact_id does not match the manifest's content")


def validate_config_mapping(config: object, where: str) -> TransformerConfig:
    """A manifest's ``config`` object as a TransformerConfig (ValueError otherwise)."""
    return _validate_config(config, where)


def _validate_config(config: object, where: str) -> TransformerConfig:
    if (not isinstance(config, dict) or not set(REQUIRED_CONFIG_FIELDS) <= set(config)
            or not set(config) <= set(CONFIG_FIELDS)):
        raise ValueError(
            f"{where}: config must be an object with exactly {list(REQUIRED_CONFIG_FIELDS)}, "
            f"and optionally {list(OPTIONAL_CONFIG_DEFAULTS)}"
        )
    for name in REQUIRED_CONFIG_FIELDS[:-1]:
        if not _is_int(config[name]):
            raise ValueError(f"{where}: config.{name} must be an int, got {config[name]!r}")
    for name in CONFIG_FIELDS[:6]:
        if config[name] < 1 or config[name] >= 1 << 32:
            raise ValueError(f"{where}: config.{name} must be in [1, 2**32), got {config[name]}")
    if not 0 <= config["random_seed"] < UINT32_LIMIT:
        raise ValueError(
            f"{where}: config.random_seed must be a uint32, got {config['random_seed']}"
        )
    epsilon = finite_number(config["layer_norm_epsilon"])
    if epsilon is None or epsilon <= 0 or epsilon > 3.4e38 or array("f", [epsilon])[0] <= 0:
        raise ValueError(f"{where}: config.layer_norm_epsilon must be a positive float32, got "
                         f"{config['layer_norm_epsilon']!r}")
    if config["model_width"] % config["head_count"]:
        raise ValueError(
            f"{where}: config.head_count {config['head_count']} does not divide model_width "
            f"{config['model_width']}"
        )
    if config["block_count"] > MAXIMUM_BLOCKS:
        raise ValueError(f"{where}: config.block_count {config['block_count']} exceeds "
                         f"{MAXIMUM_BLOCKS}")
    activation = config.get("feed_forward_activation", "gelu")
    if activation not in ("gelu", "gelu_tanh", "relu"):
        raise ValueError(f"{where}: config.feed_forward_activation must be 'gelu', 'gelu_tanh' "
                         f"or 'relu', got {activation!r}")
    if not isinstance(config.get("tie_embeddings", False), bool):
        raise ValueError(f"{where}: config.tie_embeddings must be a bool, got "
                         f"{config['tie_embeddings']!r}")
    return TransformerConfig(**config)


def validate_tokenizer_state(state: object, where: str) -> int:
    """The vocabulary size of a manifest's ``tokenizer`` state (ValueError when it breaks the
    tokenizer rules: docs/ARCHITECTURE.md, 'Tokenizers')."""
    return _validate_tokenizer(state, where)


def _validate_tokenizer(state: object, where: str) -> int:
    if not isinstance(state, dict) or "method" not in state:
        raise ValueError(f"{where}: tokenizer must be an object with a method")
    method = state["method"]
    if method == "byte":
        if set(state) != {"method", "byte_vocabulary"}:
            raise ValueError(f"{where}: a byte tokenizer has exactly method and byte_vocabulary")
        vocabulary = state["byte_vocabulary"]
        if not isinstance(vocabulary, list) or not 1 <= len(vocabulary) <= 256:
            raise ValueError(f"{where}: tokenizer.byte_vocabulary must list 1 to 256 bytes")
        if not all(_is_int(value) and 0 <= value < 256 for value in vocabulary):
            raise ValueError(f"{where}: tokenizer.byte_vocabulary entries must be ints 0-255")
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError(f"{where}: tokenizer.byte_vocabulary repeats a byte")
        return len(vocabulary)
    if method == "bpe":
        if set(state) != {"method", "merge_rules"}:
            raise ValueError(f"{where}: a BPE tokenizer has exactly method and merge_rules")
        rules = state["merge_rules"]
        if not isinstance(rules, list):
            raise ValueError(f"{where}: tokenizer.merge_rules must be a list")
        seen = set()
        for index, rule in enumerate(rules):
            if (
                not isinstance(rule, list)
                or len(rule) != 3
                or not all(_is_int(value) and value >= 0 for value in rule)
            ):
                raise ValueError(
                    f"{where}: tokenizer.merge_rules[{index}] must be [left, right, result] ints"
                )
            left, right, result = rule
            if result != 256 + index:
                raise ValueError(
                    f"{where}: tokenizer.merge_rules[{index}] result {result} must be "
                    f"{256 + index}"
                )
            if left >= result or right >= result:
                raise ValueError(
                    f"{where}: tokenizer.merge_rules[{index}] uses an id not yet defined"
                )
            if (left, right) in seen:
                raise ValueError(f"{where}: tokenizer.merge_rules[{index}] repeats a pair")
            seen.add((left, right))
        return 256 + len(rules)
    raise ValueError(f"{where}: tokenizer.method {method!r} is not 'byte' or 'bpe'")


def _validate_llama_config(config: object, where: str) -> LlamaMistralConfig:
    if (not isinstance(config, dict) or not set(LLAMA_REQUIRED_CONFIG_FIELDS) <= set(config)
            or not set(config) <= set(LLAMA_CONFIG_FIELDS)):
        optional = [name for name in LLAMA_CONFIG_FIELDS
                    if name not in LLAMA_REQUIRED_CONFIG_FIELDS]
        raise ValueError(f"{where}: config must be an object with "
                         f"{list(LLAMA_REQUIRED_CONFIG_FIELDS)} and optionally {optional}")
    for name in ("vocabulary_size", "maximum_context", "model_width", "query_head_count",
                 "key_value_head_count", "block_count", "feed_forward_width"):
        if not _is_int(config[name]) or not 1 <= config[name] < 1 << 32:
            raise ValueError(f"{where}: config.{name} must be an int in [1, 2**32), got "
                             f"{config[name]!r}")
    for name in ("rms_norm_epsilon", "rope_theta"):
        value = finite_number(config[name])
        if value is None or value <= 0 or (name == "rms_norm_epsilon" and
                                           (value > 3.4e38 or array("f", [value])[0] <= 0)):
            raise ValueError(f"{where}: config.{name} must be a positive finite float, got "
                             f"{config[name]!r}")
    window = config["sliding_window"]
    if window is not None and (not _is_int(window) or not 1 <= window < 1 << 32):
        raise ValueError(f"{where}: config.sliding_window must be null or a positive int, got "
                         f"{window!r}")
    if not isinstance(config["tie_embeddings"], bool):
        raise ValueError(f"{where}: config.tie_embeddings must be a bool")
    if not _is_int(config["random_seed"]) or not 0 <= config["random_seed"] < UINT32_LIMIT:
        raise ValueError(f"{where}: config.random_seed must be a uint32")
    if config["block_count"] > MAXIMUM_BLOCKS:
        raise ValueError(f"{where}: config.block_count {config['block_count']} exceeds "
                         f"{MAXIMUM_BLOCKS}")
    try:
        parsed = LlamaMistralConfig(**config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: config: {error}") from None
    d, hq, hkv = parsed.model_width, parsed.query_head_count, parsed.key_value_head_count
    # RoPE rotates pairs: an even head width (learned positions take any).
    odd_head = parsed.positions == "rotary" and parsed.resolved_head_width % 2
    if (not parsed.head_width and d % hq) or hq % hkv or odd_head:
        raise ValueError(f"{where}: config: model_width {d}, query_head_count {hq}, "
                         f"key_value_head_count {hkv} and head_width {parsed.head_width} do not "
                         f"fit (D % Hq without a head width, Hq % Hkv, an even head width with "
                         f"rotary positions)")
    if parsed.rope_scaling == "frequency_factors" and (
            len(parsed.rope_frequency_factors) != parsed.resolved_head_width // 2):
        raise ValueError(f"{where}: config.rope_frequency_factors has "
                         f"{len(parsed.rope_frequency_factors)} values; head width "
                         f"{parsed.resolved_head_width} needs {parsed.resolved_head_width // 2}")
    return parsed


def _validate_pretrained_tokenizer(state: object, where: str) -> int:
    """A pretrained tokenizer's state: the schema here, the vocabulary rules by building it
    natively (the library is the one home of those rules)."""
    if not isinstance(state, dict) or set(state) != PRETRAINED_TOKENIZER_KEYS:
        raise ValueError(f"{where}: a pretrained tokenizer has exactly "
                         f"{sorted(PRETRAINED_TOKENIZER_KEYS)}")
    for name in ("tokens", "merges"):
        if not isinstance(state[name], list) or not all(isinstance(t, str) for t in state[name]):
            raise ValueError(f"{where}: tokenizer.{name} must be a list of strings")
    if not isinstance(state["token_types"], list) or not all(
            _is_int(t) for t in state["token_types"]):
        raise ValueError(f"{where}: tokenizer.token_types must be a list of ints")
    if not isinstance(state["scores"], list) or not all(
            finite_number(x) is not None for x in state["scores"]):
        raise ValueError(f"{where}: tokenizer.scores must be a list of finite numbers")
    for name in ("bos_id", "eos_id", "unknown_id"):
        if state[name] is not None and (not _is_int(state[name]) or state[name] < 0):
            raise ValueError(f"{where}: tokenizer.{name} must be null or an id")
    for name in ("ignore_merges", "add_dummy_prefix"):
        if not isinstance(state[name], bool):
            raise ValueError(f"{where}: tokenizer.{name} must be a bool")
    if state["chat_template"] is not None and not isinstance(state["chat_template"], str):
        raise ValueError(f"{where}: tokenizer.chat_template must be null or a string")
    if state["model"] not in ("byte_level_bpe", "sentencepiece_bpe") or (
            state["pretokenizer"] not in (None, *PRETOKENIZER_VALUES)):
        raise ValueError(f"{where}: tokenizer.model/pretokenizer {state['model']!r}/"
                         f"{state['pretokenizer']!r} is not supported")
    try:
        PretrainedTokenizer.from_state(state).close()
    except (RiftcoTransformerError, TypeError, ValueError) as error:
        raise ValueError(f"{where}: tokenizer: {error}") from None
    return len(state["tokens"])


def parameter_shapes(config) -> list[tuple[str, tuple[int, ...]]]:
    """The parameters, in canonical order, with their shapes, of the model ``config``
    describes (either decoder class)."""
    return (llama_parameter_shapes(config) if isinstance(config, LlamaMistralConfig)
            else decoder_parameter_shapes(config))


def _validate_parameters(table: object, config, where: str) -> int:
    expected = parameter_shapes(config)
    if not isinstance(table, list) or len(table) != len(expected):
        raise ValueError(f"{where}: parameters must list the model's {len(expected)} parameters")
    offset = 0
    for index, (entry, (name, shape)) in enumerate(zip(table, expected, strict=True)):
        if not isinstance(entry, dict) or set(entry) != {"name", "shape", "offset", "count"}:
            raise ValueError(f"{where}: parameters[{index}] must have name, shape, offset, count")
        if entry["name"] != name:
            raise ValueError(
                f"{where}: parameters[{index}] is {entry['name']!r}, expected {name!r}"
            )
        if entry["shape"] != list(shape):
            raise ValueError(
                f"{where}: parameters[{index}] ({name}) has shape {entry['shape']!r}, expected "
                f"{list(shape)}"
            )
        count = math.prod(shape)
        if entry["count"] != count or not _is_int(entry["count"]):
            raise ValueError(f"{where}: parameters[{index}] ({name}) count must be {count}")
        if entry["offset"] != offset or not _is_int(entry["offset"]):
            raise ValueError(f"{where}: parameters[{index}] ({name}) offset must be {offset}")
        offset += count
    return offset


def _validate_weights_entry(entry: object, total: int, where: str) -> None:
    keys = {"file", "dtype", "byte_order", "count", "sha256"}
    if not isinstance(entry, dict) or set(entry) != keys:
        raise ValueError(f"{where}: weights must have exactly {sorted(keys)}")
    if (entry["file"] != WEIGHTS_NAME or entry["dtype"] != "float32"
            or entry["byte_order"] != "little"):
        raise ValueError(f"{where}: weights must be {WEIGHTS_NAME}, float32, little-endian")
    if entry["count"] != total or not _is_int(entry["count"]):
        raise ValueError(f"{where}: weights.count {entry['count']!r} != parameter total {total}")
    if not isinstance(entry["sha256"], str) or not _HEX_ID.match(entry["sha256"]):
        raise ValueError(f"{where}: weights.sha256 must be 64 lowercase hex digits")


def bundle_parameter_values(bundle: ModelBundle, names: Sequence[str]) -> dict[str, array]:
    """The named parameters' values (a dict name -> array('f'))."""
    index = {spec.name: spec for spec in bundle.parameters}
    weights = bundle._weights
    return {
        name: weights[index[name].offset : index[name].offset + index[name].count] for name in names
    }
