"""Rotary-family models to GGUF v3, the format llama.cpp, Ollama and LM Studio run.

:func:`export_gguf` writes a ``.rift`` bundle of a :class:`LlamaMistralTransformer` (Llama,
Mistral, Qwen 2, Qwen 3, Gemma 2, Gemma 3, Phi-3), or a loaded :class:`PretrainedModel` of
one, as a GGUF v3 file under llama.cpp's conventions: it is the inverse of our loader
(``llama_config_from_gguf`` / ``load_llama_from_gguf`` in src/interchange/llama_gguf.cpp), so
``load_pretrained`` of the file gives the same logits.

What is written:

* the header (``GGUF``, version 3, the counts), typed metadata, the tensor infos (name, dims
  innermost first, type, offset) and the data, every tensor at a multiple of the default
  alignment, 32;
* ``general.architecture`` (Mistral as ``llama``, as llama.cpp's converter writes it),
  ``general.name``, ``general.file_type`` and the family's hyperparameters: dimensions,
  RMSNorm epsilon, RoPE base and width, head width (``key_length``/``value_length``), the
  sliding window, linear or YaRN scaling (``rope.scaling.*``), Gemma 2's soft caps;
* the tensors under the library's architecture table's GGUF names
  (:func:`~riftco_transformer.native.llama.checkpoint_tensor_name`; Phi-3's fused
  ``attn_qkv`` and ``ffn_up``, the only ``ffn_up`` llama.cpp's Phi-3 reads), with
  llama.cpp's permuted q/k rows for Llama/Mistral, Gemma's norm weights as ``1 + w``, and Llama
  3's frequency scaling as ``rope_freqs.weight`` (the divisor of each frequency);
* the tokenizer (``tokenizer.ggml.*``: model, tokens, token types, merges or scores, special
  ids, pre-tokenizer) and ``tokenizer.chat_template`` when the model has one; a vocabulary
  padded past the tokenizer (an imported checkpoint's) gets llama.cpp's converter's unused
  ``[PAD<id>]`` tokens, as GGUF readers take the vocabulary size from the token list.

Weights are float32 (``dtype="f32"``, exact) or float16 (``dtype="f16"``: every matrix rounded
to nearest even; 1-D norm and bias tensors stay float32, as llama.cpp keeps them).

What GGUF cannot express is refused before anything is written (ValueError naming it): the
GPT decoder (``riftco_decoder_v1``), the GPT-2 preset, a tokenizer of our own training (byte
or BPE: GGUF needs a pretrained vocabulary), ``ignore_merges`` other than GGUF readers derive
from the pre-tokenizer, and any config field our loader would read back differently (a RoPE
base for Gemma 3's local layers or a window period other than the family's, an attention
scale the family does not derive, ...). Bundles hold merged, dense weights (capture refuses
LoRA adapters and packed NF4 weights), and so does any :class:`PretrainedModel` accepted
here. The file is written to a temporary name and renamed: a failure leaves no partial file.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from array import array
from dataclasses import fields, replace
from pathlib import Path

from .._files import atomic_write
from ..artifacts import LLAMA_ARCHITECTURE, ModelBundle
from ..native import LlamaMistralConfig
from ..native.llama import checkpoint_tensor_name

__all__ = ["GGUF_DTYPES", "export_gguf", "gguf_read_back_config"]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_ALIGNMENT = 32  # general.alignment's default: not written

# Metadata value types (GGUF's enum gguf_type).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = range(10)
_UINT64, _INT64, _FLOAT64 = 10, 11, 12
# Tensor types (ggml_type) and general.file_type (llama_ftype) of each dtype.
_TENSOR_F32, _TENSOR_F16 = 0, 1
GGUF_DTYPES = {"f32": (_TENSOR_F32, 0), "f16": (_TENSOR_F16, 1)}

_UINT32_MAX = 2**32 - 1
# Token types (tokenizer.ggml.token_type) and the score llama.cpp's converter gives padding.
_NORMAL, _UNUSED = 1, 5
_PADDING_SCORE = -1000.0
_F16_CHUNK = 1 << 16  # values packed per struct.pack call

# general.architecture of each family: llama.cpp has no "mistral"; its converter writes
# Mistral as llama (our loader reads both).
_FILE_ARCHITECTURE = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "phi3": "phi3",
}
# tokenizer.ggml.pre for each of our pre-tokenizers (the names our reader maps back:
# pretokenizer_kind_from_gguf in src/data/pretokenizer.cpp).
_GGUF_PRETOKENIZER = {"gpt2": "gpt-2", "llama3": "llama-bpe", "smollm": "smollm",
                      "qwen2": "qwen2"}
# Gemma 27B's attention scale rule (llama.cpp's and our loader's): block count per family.
_GEMMA_27B_BLOCKS = {"gemma2": 46, "gemma3": 62}


def _f32(value: float) -> float:
    """``value`` rounded to float32, as a GGUF float32 value holds it."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _llama3_frequency_factors(config: LlamaMistralConfig) -> tuple[float, ...]:
    """Llama 3's frequency scaling as llama.cpp's rope_freqs.weight: the divisor of each of
    the d/2 frequencies (Hugging Face's rule: high frequencies kept, low ones divided by the
    factor, a smooth blend between)."""
    head = config.resolved_head_width
    factor = config.rope_scaling_factor
    low, high = config.rope_low_frequency_factor, config.rope_high_frequency_factor
    context = config.rope_original_context
    divisors = []
    for index in range(0, head, 2):
        wavelength = 2 * math.pi * config.rope_theta ** (index / head)
        if wavelength < context / high:
            divisors.append(1.0)
        elif wavelength > context / low:
            divisors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(_f32(value) for value in divisors)


def _frequency_factors(config: LlamaMistralConfig) -> tuple[float, ...]:
    if config.rope_scaling == "llama3":
        return _llama3_frequency_factors(config)
    return config.rope_frequency_factors  # "frequency_factors"; empty for every other kind


def gguf_read_back_config(config: LlamaMistralConfig) -> LlamaMistralConfig:
    """The config our GGUF loader (and llama.cpp) reads back from the file :func:`export_gguf`
    writes for a model of ``config``: Mistral as llama, reals as float32, the head width 0
    where it is D/Hq, Gemma's norm offset folded into the weights, Llama 3's scaling as its
    frequency factors, the rest from the family's preset. ValueError for the GPT-2 preset."""
    require_family(config, "GGUF", _FILE_ARCHITECTURE)
    architecture = config.architecture
    file_architecture = _FILE_ARCHITECTURE[architecture]
    head = config.resolved_head_width
    default_head = (config.model_width // config.query_head_count
                    if config.model_width % config.query_head_count == 0 else 0)
    given = dict(
        vocabulary_size=config.vocabulary_size,
        maximum_context=config.maximum_context,
        model_width=config.model_width,
        query_head_count=config.query_head_count,
        key_value_head_count=config.key_value_head_count,
        block_count=config.block_count,
        feed_forward_width=config.feed_forward_width,
        rms_norm_epsilon=_f32(config.rms_norm_epsilon),
        rope_theta=_f32(config.rope_theta),
        sliding_window=config.sliding_window,
        tie_embeddings=config.tie_embeddings,
        head_width=0 if head == default_head else head,
    )
    if config.rope_scaling == "linear":
        given.update(rope_scaling="linear", rope_scaling_factor=_f32(config.rope_scaling_factor))
    elif config.rope_scaling == "yarn":
        given.update(rope_scaling="yarn", rope_scaling_factor=_f32(config.rope_scaling_factor),
                     rope_original_context=config.rope_original_context,
                     rope_yarn_beta_fast=_f32(config.rope_yarn_beta_fast),
                     rope_yarn_beta_slow=_f32(config.rope_yarn_beta_slow),
                     rope_yarn_attention_factor=_f32(config.rope_yarn_attention_factor))
    elif config.rope_scaling in ("llama3", "frequency_factors"):
        given.update(rope_scaling="frequency_factors",
                     rope_frequency_factors=_frequency_factors(config))
    read = LlamaMistralConfig.preset(file_architecture, **given)
    if file_architecture in ("gemma2", "gemma3"):
        read = replace(read, norm_weight_offset=False)  # the file's norms are 1 + w
        if config.block_count == _GEMMA_27B_BLOCKS[file_architecture]:
            scalar = config.model_width // config.query_head_count
            read = replace(read, attention_scale=_f32(1.0 / math.sqrt(scalar)))
    if file_architecture == "gemma2":  # the file gives both caps (0: off)
        read = replace(read, attention_logit_softcap=_f32(config.attention_logit_softcap),
                       final_logit_softcap=_f32(config.final_logit_softcap))
    return replace(read, random_seed=0)  # GGUF has no seed: the loader's config holds 0


# The fields of a config whose differences the file carries in another form.
_ROPE_FIELDS = {
    "rope_scaling_factor": ("linear", "yarn", "llama3"),
    "rope_original_context": ("yarn", "llama3"),
    "rope_low_frequency_factor": ("llama3",),
    "rope_high_frequency_factor": ("llama3",),
    "rope_yarn_beta_fast": ("yarn",),
    "rope_yarn_beta_slow": ("yarn",),
    "rope_yarn_attention_factor": ("yarn",),
}
_FLOAT32_FIELDS = ("rms_norm_epsilon", "rope_theta", "embedding_scale", "attention_scale",
                   "attention_logit_softcap", "final_logit_softcap", "rope_scaling_factor",
                   "rope_yarn_beta_fast", "rope_yarn_beta_slow", "rope_yarn_attention_factor")


def _inexpressible(config: LlamaMistralConfig, read: LlamaMistralConfig) -> list[str]:
    """The fields of ``config`` that the file would not give back (``read``), as text."""
    problems = []
    for field in fields(LlamaMistralConfig):
        name = field.name
        ours, theirs = getattr(config, name), getattr(read, name)
        if name in ("architecture", "random_seed"):
            continue  # Mistral is written as llama; the seed only drew the initial weights
        if name == "head_width":
            ours, theirs = config.resolved_head_width, read.resolved_head_width
        elif name == "norm_weight_offset" and read.architecture in ("gemma2", "gemma3"):
            continue  # folded into the norm weights (1 + w)
        elif name in ("rope_scaling", "rope_frequency_factors"):
            if config.rope_scaling == "llama3":
                continue  # written as its frequency factors (rope_freqs.weight)
        elif name in _ROPE_FIELDS and config.rope_scaling not in _ROPE_FIELDS[name]:
            continue  # a field the model's RoPE does not read
        elif name in _FLOAT32_FIELDS:
            ours = _f32(ours)
        if name in _ROPE_FIELDS and config.rope_scaling == "llama3":
            continue
        if ours != theirs:
            problems.append(f"{name}={getattr(config, name)!r} (the file would give "
                            f"{getattr(read, name)!r})")
    return problems


# ---- encoding -------------------------------------------------------------------------------


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


_SCALAR_FORMATS = {_UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I",
                   _INT32: "<i", _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q",
                   _FLOAT64: "<d"}


def _value(kind: int, value) -> bytes:
    if kind == _STRING:
        return _string(value)
    return struct.pack(_SCALAR_FORMATS[kind], value)


class _Metadata:
    """Typed key-value pairs in insertion order."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.keys: list[str] = []

    def add(self, key: str, kind: int, value) -> None:
        if key in self.keys:
            raise AssertionError(f"metadata {key} written twice")
        self.keys.append(key)
        self.entries.append(_string(key) + struct.pack("<I", kind) + _value(kind, value))

    def add_array(self, key: str, kind: int, values) -> None:
        if key in self.keys:
            raise AssertionError(f"metadata {key} written twice")
        self.keys.append(key)
        if kind == _STRING:
            body = b"".join(_string(value) for value in values)
        else:
            body = struct.pack(f"<{len(values)}{_SCALAR_FORMATS[kind][1]}", *values)
        self.entries.append(_string(key) + struct.pack("<IIQ", _ARRAY, kind, len(values)) + body)


def _uint32(value: int, what: str) -> int:
    if not 0 <= value <= _UINT32_MAX:
        raise ValueError(f"{what} {value} does not fit the uint32 GGUF keeps it in")
    return value


def _hyperparameters(metadata: _Metadata, config: LlamaMistralConfig, name: str,
                     file_type: int) -> None:
    arch = _FILE_ARCHITECTURE[config.architecture]
    head = config.resolved_head_width
    metadata.add("general.architecture", _STRING, arch)
    metadata.add("general.name", _STRING, name)
    metadata.add("general.file_type", _UINT32, file_type)
    for key, value in (("context_length", config.maximum_context),
                       ("embedding_length", config.model_width),
                       ("block_count", config.block_count),
                       ("feed_forward_length", config.feed_forward_width),
                       ("attention.head_count", config.query_head_count),
                       ("attention.head_count_kv", config.key_value_head_count)):
        metadata.add(f"{arch}.{key}", _UINT32, _uint32(value, key))
    metadata.add(f"{arch}.attention.layer_norm_rms_epsilon", _FLOAT32, config.rms_norm_epsilon)
    metadata.add(f"{arch}.rope.freq_base", _FLOAT32, config.rope_theta)
    metadata.add(f"{arch}.rope.dimension_count", _UINT32, _uint32(head, "head width"))
    metadata.add(f"{arch}.attention.key_length", _UINT32, head)
    metadata.add(f"{arch}.attention.value_length", _UINT32, head)
    if config.sliding_window is not None:
        metadata.add(f"{arch}.attention.sliding_window", _UINT32,
                     _uint32(config.sliding_window, "sliding_window"))
    prefix = f"{arch}.rope.scaling."
    if config.rope_scaling == "linear":
        metadata.add(prefix + "type", _STRING, "linear")
        metadata.add(prefix + "factor", _FLOAT32, config.rope_scaling_factor)
    elif config.rope_scaling == "yarn":
        metadata.add(prefix + "type", _STRING, "yarn")
        metadata.add(prefix + "factor", _FLOAT32, config.rope_scaling_factor)
        metadata.add(prefix + "original_context_length", _UINT32,
                     _uint32(config.rope_original_context, "rope_original_context"))
        metadata.add(prefix + "yarn_beta_fast", _FLOAT32, config.rope_yarn_beta_fast)
        metadata.add(prefix + "yarn_beta_slow", _FLOAT32, config.rope_yarn_beta_slow)
        if config.rope_yarn_attention_factor != 0.0:
            metadata.add(prefix + "yarn_attn_factor", _FLOAT32, config.rope_yarn_attention_factor)
    if arch == "gemma2":
        metadata.add(f"{arch}.attn_logit_softcapping", _FLOAT32, config.attention_logit_softcap)
        metadata.add(f"{arch}.final_logit_softcapping", _FLOAT32, config.final_logit_softcap)


def _tokenizer_metadata(metadata: _Metadata, state: dict, vocabulary_size: int) -> None:
    """tokenizer.ggml.* from a bundle's pretrained tokenizer state (ValueError when GGUF
    cannot hold it as our reader and llama.cpp read it back)."""
    if state.get("method") != "pretrained":
        raise ValueError(f"the tokenizer is one of our own training ({state.get('method')!r}), "
                         "which GGUF cannot hold: GGUF export needs a pretrained tokenizer "
                         "(tokenizer.ggml.* is a GPT-2-style or SentencePiece vocabulary)")
    tokens = list(state["tokens"])
    token_types = list(state["token_types"]) or [_NORMAL] * len(tokens)
    scores = list(state["scores"]) or [0.0] * len(tokens)
    if len(tokens) > vocabulary_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens but the model's vocabulary is "
                         f"only {vocabulary_size}")
    # A padded vocabulary (an imported checkpoint's model rows past its tokenizer): GGUF
    # readers take the vocabulary size from the token list, so the rows get llama.cpp's
    # converter's padding tokens, unused, never made from text.
    padding = [f"[PAD{index}]" for index in range(len(tokens), vocabulary_size)]
    taken = set(tokens).intersection(padding)
    if taken:
        raise ValueError(f"the padding token {sorted(taken)[0]!r} for the vocabulary's unused rows "
                         "is already a token of the tokenizer")
    tokens += padding
    token_types += [_UNUSED] * len(padding)
    scores += [_PADDING_SCORE] * len(padding)
    byte_level = state["model"] == "byte_level_bpe"
    if byte_level:
        pretokenizer = state["pretokenizer"] or "gpt2"
        if pretokenizer not in _GGUF_PRETOKENIZER:
            raise ValueError(f"pre-tokenizer {pretokenizer!r} has no tokenizer.ggml.pre name")
        # GGUF readers take ignore_merges from the pre-tokenizer (llama-bpe: on).
        if bool(state["ignore_merges"]) != (pretokenizer == "llama3"):
            raise ValueError(f"the tokenizer's ignore_merges={bool(state['ignore_merges'])} with "
                             f"pre-tokenizer {pretokenizer!r} cannot be written: GGUF readers "
                             "set ignore_merges exactly for Llama 3's (llama-bpe)")
    metadata.add("tokenizer.ggml.model", _STRING, "gpt2" if byte_level else "llama")
    if byte_level:
        metadata.add("tokenizer.ggml.pre", _STRING, _GGUF_PRETOKENIZER[pretokenizer])
    metadata.add_array("tokenizer.ggml.tokens", _STRING, tokens)
    metadata.add_array("tokenizer.ggml.token_type", _INT32, token_types)
    if byte_level:
        metadata.add_array("tokenizer.ggml.merges", _STRING, state["merges"])
    else:
        metadata.add_array("tokenizer.ggml.scores", _FLOAT32, scores)
        metadata.add("tokenizer.ggml.add_space_prefix", _BOOL, bool(state["add_dummy_prefix"]))
    for key, field in (("bos_token_id", "bos_id"), ("eos_token_id", "eos_id"),
                       ("unknown_token_id", "unknown_id")):
        if state[field] is not None:
            metadata.add(f"tokenizer.ggml.{key}", _UINT32, state[field])
    if state.get("chat_template"):
        metadata.add("tokenizer.chat_template", _STRING, state["chat_template"])


# ---- tensors --------------------------------------------------------------------------------


def _permute_rotary_rows(values: array, heads: int, columns: int) -> array:
    """llama.cpp's q/k row order for Llama/Mistral (the inverse of our loader's
    unpermute_rotary_rows): within each head of d rows, stored row 2i + s is row
    s·d/2 + i."""
    rows = len(values) // columns
    d = rows // heads
    permuted = array("f", bytes(4 * len(values)))
    for head in range(heads):
        for i in range(d // 2):
            for s in range(2):
                stored = head * d + 2 * i + s
                row = head * d + s * (d // 2) + i
                permuted[stored * columns:(stored + 1) * columns] = \
                    values[row * columns:(row + 1) * columns]
    return permuted


def _tensor_bytes(values: array, tensor_type: int, name: str) -> bytes:
    if tensor_type == _TENSOR_F16:
        try:  # in chunks: struct.pack takes the values as arguments
            return b"".join(struct.pack(f"<{len(chunk)}e", *chunk) for chunk in (
                values[start:start + _F16_CHUNK] for start in range(0, len(values), _F16_CHUNK)))
        except (OverflowError, struct.error):
            largest = max(abs(value) for value in values)
            raise ValueError(f"tensor {name!r} has a value of magnitude {largest:g}, beyond "
                             "float16's range (65504): export it as f32") from None
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array("f", values)
    swapped.byteswap()
    return swapped.tobytes()


def _plan(bundle: ModelBundle, config: LlamaMistralConfig, tensor_type: int):
    """The file's tensors in order: ``(gguf name, dims innermost first, type, sources)``, each
    source a bundle parameter (in the fused tensor's part order) or, for rope_freqs.weight,
    None. Phi-3 is written fused (``attn_qkv``: q, k, v rows; ``ffn_up``: gate, up rows), the
    table's second layout: llama.cpp's Phi-3 reads only a fused ``ffn_up``, as its converter
    writes it."""
    architecture = config.architecture
    fused = architecture == "phi3"
    plan, pending = [], {}
    for spec in bundle.parameters:
        mapped = checkpoint_tensor_name(architecture, "gguf", spec.name, 1) if fused else None
        if mapped is None:
            gguf_name, part = checkpoint_tensor_name(architecture, "gguf", spec.name)
            if part is not None:
                raise AssertionError(f"{spec.name} maps to a part of the fused {gguf_name}")
            kind = tensor_type if len(spec.shape) == 2 else _TENSOR_F32
            plan.append([gguf_name, tuple(reversed(spec.shape)), kind, [spec]])
            if spec.name == "token_embedding.weight" and _frequency_factors(config):
                factors = len(_frequency_factors(config))
                plan.append(["rope_freqs.weight", (factors,), _TENSOR_F32, [None]])
            continue
        gguf_name, part = mapped
        entry = pending.get(gguf_name)
        if entry is None:  # placed where its first part is; rows added as parts arrive
            entry = pending[gguf_name] = [gguf_name, (spec.shape[1], 0), tensor_type, []]
            plan.append(entry)
        if part != len(entry[3]):
            raise AssertionError(f"{spec.name} is part {part} of {gguf_name}, out of order")
        entry[3].append(spec)
        entry[1] = (spec.shape[1], entry[1][1] + spec.shape[0])
    return [tuple(entry) for entry in plan]


def _values(bundle: ModelBundle, config: LlamaMistralConfig, spec) -> array:
    """One parameter's values as the file stores them: q/k rows permuted for Llama/Mistral,
    Gemma's norms as 1 + w."""
    if spec is None:
        return array("f", _frequency_factors(config))
    values = bundle._weights[spec.offset:spec.offset + spec.count]  # a copy of the slice
    if (_FILE_ARCHITECTURE[config.architecture] == "llama"
            and spec.name.endswith(("attention.query.weight", "attention.key.weight"))):
        heads = (config.query_head_count if spec.name.endswith("query.weight")
                 else config.key_value_head_count)
        values = _permute_rotary_rows(values, heads, spec.shape[1])
    if config.norm_weight_offset and spec.name.endswith(".scale"):
        values = array("f", (1.0 + value for value in values))
    return values


def _aligned(position: int) -> int:
    return (position + GGUF_ALIGNMENT - 1) // GGUF_ALIGNMENT * GGUF_ALIGNMENT


# ---- the entry point ------------------------------------------------------------------------


def rotary_bundle(source, format_name: str, families) -> ModelBundle:
    """The bundle ``source`` is, names or holds (a :class:`ModelBundle`, a ``.rift`` path or a
    loaded :class:`PretrainedModel`), when it is a rotary-family model of ``families`` with a
    pretrained tokenizer; else the ValueError (TypeError for another kind of source) the
    exporters of ``format_name`` ("GGUF", "Hugging Face") give."""
    bundle = _bundle_of(source, format_name)
    if bundle.manifest["architecture"] != LLAMA_ARCHITECTURE:
        raise ValueError(f"architecture {bundle.manifest['architecture']!r} (our GPT decoder) "
                         f"has no {format_name} export: it is written for the rotary families "
                         f"({', '.join(sorted(families))})")
    require_family(bundle.config, format_name, families)
    return bundle


def require_family(config: LlamaMistralConfig, format_name: str, families) -> None:
    """TypeError unless ``config`` is a :class:`LlamaMistralConfig`; ValueError unless its
    architecture is one of ``families`` (the exporters of ``format_name``)."""
    if not isinstance(config, LlamaMistralConfig):
        raise TypeError(f"config must be a LlamaMistralConfig, not {type(config).__name__}")
    if config.architecture not in families:
        raise ValueError(f"architecture {config.architecture!r} has no {format_name} export "
                         f"(it is written for {', '.join(sorted(families))})")


def _bundle_of(source, format_name: str) -> ModelBundle:
    """The bundle ``source`` is, names or holds."""
    if isinstance(source, ModelBundle):
        return source
    if isinstance(source, (str, os.PathLike)):
        return ModelBundle.load(source)
    from ..pretrained import PretrainedModel

    if isinstance(source, PretrainedModel):
        from ..native import PretrainedTokenizer

        if not isinstance(source.tokenizer, PretrainedTokenizer):
            raise ValueError(f"the model's tokenizer is one of our own training, which "
                             f"{format_name} cannot hold: {format_name} export needs a "
                             "pretrained tokenizer")
        source.reset_generator()  # its KV-cache pool pins the parameters
        template = getattr(source.chat_template, "text", None)
        # capture refuses an attached LoRA adapter and packed NF4 weights (merge first).
        return ModelBundle.capture(source.model, source.tokenizer, "pretrained",
                                   chat_template=template)
    raise TypeError("source must be a ModelBundle, a .rift path or a PretrainedModel, not "
                    f"{type(source).__name__}")


def export_gguf(source, path, dtype: str = "f32", name: str | None = None) -> Path:
    """Write ``source`` (a :class:`ModelBundle`, a ``.rift`` path or a loaded
    :class:`PretrainedModel` of a rotary family) as the GGUF v3 file ``path``, atomically;
    see the module docstring. ``dtype`` is ``"f32"`` (exact) or ``"f16"`` (matrices rounded
    to nearest even). ``name`` is ``general.name`` (default: the bundle metadata's ``name``,
    else the file's stem). Returns the path. ValueError for what GGUF cannot express, before
    anything is written (a float16 overflow, found while writing, removes the temporary
    file)."""
    if dtype not in GGUF_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(GGUF_DTYPES)} (got {dtype!r})")
    bundle = rotary_bundle(source, "GGUF", _FILE_ARCHITECTURE)
    config = bundle.config
    read = gguf_read_back_config(config)
    problems = _inexpressible(config, read)
    if problems:
        raise ValueError(f"this {config.architecture} model cannot be written as GGUF, whose "
                         "readers would give it another config: " + "; ".join(problems))
    destination = Path(os.fspath(path))
    if name is None:
        given = bundle.metadata.get("name")
        name = given if isinstance(given, str) and given else destination.stem
    tensor_type, file_type = GGUF_DTYPES[dtype]
    metadata = _Metadata()
    _hyperparameters(metadata, config, name, file_type)
    _tokenizer_metadata(metadata, bundle.tokenizer_state, config.vocabulary_size)
    # The infos need every tensor's size only: dims and types, computed without the values.
    infos = []
    offset = 0
    plan = _plan(bundle, config, tensor_type)
    for tensor_name, dims, kind, _ in plan:
        count = math.prod(dims)
        infos.append(_string(tensor_name) + struct.pack("<I", len(dims))
                     + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset))
        offset = _aligned(offset + count * (2 if kind == _TENSOR_F16 else 4))
    header = (GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(infos), len(metadata.entries))
              + b"".join(metadata.entries) + b"".join(infos))

    def write(stream) -> None:
        stream.write(header)
        position = len(header)
        padding = _aligned(position) - position
        stream.write(b"\0" * padding)
        written = 0
        for tensor_name, _, kind, sources in plan:
            for source in sources:  # a fused tensor's parts are consecutive rows
                data = _tensor_bytes(_values(bundle, config, source), kind, tensor_name)
                stream.write(data)
                written += len(data)
            padding = _aligned(written) - written
            stream.write(b"\0" * padding)
            written += padding

    return atomic_write(destination, write)
