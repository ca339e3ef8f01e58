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
  ids, pre-tokenizer, ``add_bos_token``) and ``tokenizer.chat_template`` when the model has
  one. ``add_bos_token`` is llama.cpp's own default for the tokenizer (on for SentencePiece and
  Llama 3's ``llama-bpe``, off for the other byte-level ones), written out so that every reader
  agrees (our tokenizer never adds one itself: a chat template that needs it renders it). A
  vocabulary padded past the tokenizer (an imported checkpoint's) gets llama.cpp's
  converter's unused ``[PAD<id>]`` tokens, as GGUF readers take the vocabulary size from the
  token list.

Weights are float32 (``dtype="f32"``, exact), float16 (``dtype="f16"``: every matrix rounded
to nearest even) or ggml's block formats ``"q8_0"`` and ``"q4_0"``, written bit for bit as ggml's
reference quantizers (``quantize_row_q8_0_ref``, ``quantize_row_q4_0_ref``) write them. Each
block is 32 consecutive values of a row, stored as a float16 scale ``d`` then the quants:

* Q8_0 (34 bytes): ``d = max|x| / 127``, ``q = roundf(x / d)`` (int8; half away from zero);
* Q4_0 (18 bytes): ``d = m / -8`` with ``m`` the block's first value of the largest magnitude,
  signed, ``q = min(15, trunc(x / d + 8.5))``; value ``j`` is the low nibble of byte ``j``,
  value ``j + 16`` its high nibble.

As in ggml, ``d`` is computed in float32 and the quants use ``1/d`` in float32 (not the stored
float16), every product and sum rounded to float32. ``d`` is ``-0.0`` for an all-zero Q4_0
block, as ggml's running maximum starts at ``+0.0`` (the ``gguf`` package, which takes the
element's own sign, writes ``+0.0`` when that element is ``-0.0``).

Which tensors: as llama.cpp's converter writes a pure ``q8_0`` file (``convert_hf_to_gguf.py
--outtype q8_0``; ``llama-quantize --pure`` for ``q4_0``), every matrix (attention and
feed-forward projections, the token embedding, the output head) takes the block format and
1-D tensors (norms, biases, ``rope_freqs.weight``) stay float32. A matrix whose rows are not a
multiple of 32 values is written float16, as the converter falls back (``llama-quantize`` would
refuse the file); :func:`gguf_tensor_types` names them. ``general.file_type`` is llama.cpp's
``LLAMA_FTYPE_MOSTLY_Q8_0`` (7) or ``MOSTLY_Q4_0`` (2), and a quantized file also carries
``general.quantization_version`` 2. A value beyond float16's range in an F16 tensor, or a block
scale beyond it (a value of magnitude over 65504 · 127 in Q8_0, 65504 · 8 in Q4_0), and any
non-finite value in a quantized matrix, is a ValueError naming the tensor.

The quantizers are pure Python (no numpy): one multiplication per value through ``map`` over
:class:`array.array` columns (value ``j`` of every block against the blocks' ``1/d``), rounded
to float32 by ``struct``'s ``"<f"``, and the rest on whole columns at C speed: block maxima and
signs as integer arithmetic over packed 32-bit words, the rounding to an integer read from
each float32's top 16 bits through ``bytes.translate`` tables (exact: over the values a quant
can take, those bits decide it). SmolLM2-135M (134.5M weights) takes about 11 s of CPU time
in Q8_0 and 15 s in Q4_0 on one core of a shared 2-core Intel Xeon (4 s in F16), the blocks
of all 211 matrices byte-identical to ``gguf.quants.quantize``'s.

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

import functools
import math
import os
import struct
import sys
from array import array
from dataclasses import fields, replace
from itertools import repeat
from operator import add, mul
from pathlib import Path

from .._files import atomic_write
from ..artifacts import LLAMA_ARCHITECTURE, ModelBundle
from ..native import LlamaMistralConfig
from ..native.llama import checkpoint_tensor_name

__all__ = ["GGUF_DTYPES", "export_gguf", "gguf_read_back_config", "gguf_tensor_types"]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_ALIGNMENT = 32  # general.alignment's default: not written

# Metadata value types (GGUF's enum gguf_type).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = range(10)
_UINT64, _INT64, _FLOAT64 = 10, 11, 12
# Tensor types (ggml_type) and general.file_type (llama_ftype) of each dtype.
_TENSOR_F32, _TENSOR_F16, _TENSOR_Q4_0, _TENSOR_Q8_0 = 0, 1, 2, 8
GGUF_DTYPES = {"f32": (_TENSOR_F32, 0), "f16": (_TENSOR_F16, 1), "q8_0": (_TENSOR_Q8_0, 7),
               "q4_0": (_TENSOR_Q4_0, 2)}
_TENSOR_TYPE_NAMES = {_TENSOR_F32: "F32", _TENSOR_F16: "F16", _TENSOR_Q4_0: "Q4_0",
                      _TENSOR_Q8_0: "Q8_0"}
_QK = 32  # values per Q8_0 and Q4_0 block (ggml's QK8_0, QK4_0)
_BLOCK_BYTES = {_TENSOR_Q8_0: 2 + _QK, _TENSOR_Q4_0: 2 + _QK // 2}
_QUANTIZATION_VERSION = 2  # general.quantization_version (ggml's GGML_QNT_VERSION)

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
    if file_type not in (GGUF_DTYPES["f32"][1], GGUF_DTYPES["f16"][1]):
        metadata.add("general.quantization_version", _UINT32, _QUANTIZATION_VERSION)
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
    # llama.cpp's default for this tokenizer (llama-vocab.cpp: SentencePiece and llama-bpe add
    # a BOS, the other byte-level pre-tokenizers do not), written so that every reader agrees.
    metadata.add("tokenizer.ggml.add_bos_token", _BOOL,
                 not byte_level or state["pretokenizer"] == "llama3")
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
    if tensor_type in _BLOCK_BYTES:
        return b"".join(_quantize(values[start:start + _QUANTIZE_CHUNK], tensor_type, name)
                        for start in range(0, len(values), _QUANTIZE_CHUNK))
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


def _matrix_type(tensor_type: int, row_length: int) -> int:
    """The type a matrix of rows of ``row_length`` values is written in: F16 for a block type
    the rows do not divide into (llama.cpp's converter's fallback)."""
    if tensor_type in _BLOCK_BYTES and row_length % _QK:
        return _TENSOR_F16
    return tensor_type


def _plan(bundle: ModelBundle, config: LlamaMistralConfig, tensor_type: int):
    """The file's tensors in order: ``(gguf name, dims innermost first, type, sources)``, each
    source a bundle parameter (in the fused tensor's part order) or, for rope_freqs.weight,
    None. Phi-3 is written fused (``attn_qkv``: q, k, v rows; ``ffn_up``: gate, up rows), the
    table's second layout: llama.cpp's Phi-3 reads only a fused ``ffn_up``, as its converter
    writes it. Matrices take ``tensor_type`` (F16 where its blocks do not divide the rows),
    1-D tensors F32."""
    architecture = config.architecture
    fused = architecture == "phi3"
    plan, pending = [], {}
    for spec in bundle.parameters:
        mapped = checkpoint_tensor_name(architecture, "gguf", spec.name, 1) if fused else None
        if mapped is None:
            gguf_name, part = checkpoint_tensor_name(architecture, "gguf", spec.name)
            if part is not None:
                raise AssertionError(f"{spec.name} maps to a part of the fused {gguf_name}")
            kind = (_matrix_type(tensor_type, spec.shape[1]) if len(spec.shape) == 2
                    else _TENSOR_F32)
            plan.append([gguf_name, tuple(reversed(spec.shape)), kind, [spec]])
            if spec.name == "token_embedding.weight" and _frequency_factors(config):
                factors = len(_frequency_factors(config))
                plan.append(["rope_freqs.weight", (factors,), _TENSOR_F32, [None]])
            continue
        gguf_name, part = mapped
        entry = pending.get(gguf_name)
        if entry is None:  # placed where its first part is; rows added as parts arrive
            entry = pending[gguf_name] = [gguf_name, (spec.shape[1], 0),
                                          _matrix_type(tensor_type, spec.shape[1]), []]
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


def _tensor_size(tensor_type: int, count: int) -> int:
    """Bytes of ``count`` values of ``tensor_type``."""
    if tensor_type in _BLOCK_BYTES:
        return count // _QK * _BLOCK_BYTES[tensor_type]
    return count * (2 if tensor_type == _TENSOR_F16 else 4)


# ---- Q8_0 and Q4_0 --------------------------------------------------------------------------
#
# A chunk of whole blocks is quantized at once, a column at a time: column j holds value j of
# every block. Integers read from native bytes use the native byte order, so each packed 32-bit
# word holds one float32's bits as its value; quotients are packed little-endian (struct "<f").

_QUANTIZE_CHUNK = 1 << 20  # values per pass (whole blocks)
_ORDER = sys.byteorder
# Offsets of a little-endian float32's most significant byte (sign, 7 exponent bits) and the
# next one (the last exponent bit, 7 mantissa bits).
_TOP, _SECOND = 3, 2
_EXPONENT_ALL_ONES = 0x7F800000  # |x| bits at or above: an infinity or a NaN


@functools.lru_cache(maxsize=6)
def _words(word: int, count: int) -> int:
    """``count`` packed copies of the 32-bit ``word``: 0x7FFFFFFF clears each sign bit,
    0x80000000 is the guard bit above each magnitude."""
    return int.from_bytes(struct.pack(f"={count}I", *repeat(word, count)), _ORDER)


def _word_maximum(first: int, second: int, guard: int) -> int:
    """The word-wise maximum of two packings of 31-bit words: each word of ``(first | guard) -
    second`` keeps its guard bit exactly where first's word is at least second's (no word
    borrows from the next)."""
    kept = ((first | guard) - second) & guard
    return second ^ ((first ^ second) & (kept - (kept >> 31)))


def _roundf(value: float) -> int:
    """C's roundf: the nearest integer, halves away from zero."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def _prefix_tables(function, tops) -> tuple[tuple[bytes, bytes], ...]:
    """``(select, table)`` for each most significant byte in ``tops``: ``select`` maps that
    byte to 0xFF and every other to 0; ``table`` maps the second byte to ``function`` (a byte)
    of the float32s with those top 16 bits. ``function`` must be monotonic, so that its value
    at the prefix's two extreme floats decides it for all of them (the tests check that it
    does); a float whose top byte is not in ``tops`` gives 0."""
    tables = []
    for top in tops:
        table = bytearray(256)
        for second in range(256):
            prefix = (top << 24) | (second << 16)
            table[second] = function(struct.unpack("<f", struct.pack("<I", prefix))[0])
        tables.append((bytes(0xFF if byte == top else 0 for byte in range(256)), bytes(table)))
    return tuple(tables)


# Q8_0's int8 quant, roundf(x / d), of a float32 quotient: every quotient with |q| >= 0.5 has
# a top byte in 0x3F..0x42 (0.5 <= |q| < 128; |q| <= 127 within float32 rounding), plus the
# sign; the rest round to 0.
_Q8_0_TOPS = (0x3F, 0x40, 0x41, 0x42, 0xBF, 0xC0, 0xC1, 0xC2)
# Q4_0's nibble, min(15, trunc(t)), of t = x / d + 8.5 in float32 (0.5 - tiny <= t <= 16.5 +
# tiny): top byte 0x3F is 0.5 <= t < 2, 0x40 is 2 <= t < 8, 0x41 is 8 <= t < 32; t < 0.5 is 0.
_Q4_0_TOPS = (0x3F, 0x40, 0x41)


@functools.cache
def _quant_tables(tensor_type: int, high: bool = False) -> tuple[tuple[bytes, bytes], ...]:
    """The prefix tables of ``tensor_type``'s quant (Q4_0's shifted to the high nibble with
    ``high``)."""
    if tensor_type == _TENSOR_Q8_0:
        return _prefix_tables(lambda value: _roundf(value) & 0xFF, _Q8_0_TOPS)
    shift = 4 if high else 0
    return _prefix_tables(lambda value: min(15, int(value)) << shift, _Q4_0_TOPS)


def _prefix_lookup(data: bytes, tables) -> int:
    """The bytes ``tables`` give each little-endian float32 of ``data``, packed as an
    integer."""
    top, second = data[_TOP::4], data[_SECOND::4]
    found = 0
    for select, table in tables:
        found |= (int.from_bytes(top.translate(select), _ORDER)
                  & int.from_bytes(second.translate(table), _ORDER))
    return found


def _quantize(values: array, tensor_type: int, name: str) -> bytes:
    """Whole blocks of ``values`` (float32) as ggml's Q8_0 or Q4_0 blocks, bit for bit as
    ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref write them."""
    count = len(values)
    blocks = count // _QK
    raw = values.tobytes()
    guard = _words(0x80000000, blocks)
    magnitudes = array("I")
    magnitudes.frombytes((int.from_bytes(raw, _ORDER) & _words(0x7FFFFFFF, count))
                         .to_bytes(len(raw), _ORDER))
    columns = [int.from_bytes(magnitudes[j::_QK].tobytes(), _ORDER) for j in range(_QK)]
    level = columns
    while len(level) > 1:  # a tree of word-wise maxima: each block's max |x|, as bits
        level = [_word_maximum(first, second, guard)
                 for first, second in zip(level[0::2], level[1::2], strict=True)]
    largest = level[0]
    largest_bits = largest.to_bytes(4 * blocks, _ORDER)
    check = array("I")
    check.frombytes(largest_bits)
    if max(check) >= _EXPONENT_ALL_ONES:
        raise ValueError(f"tensor {name!r} has a non-finite value (an infinity or a NaN), which "
                         f"{_TENSOR_TYPE_NAMES[tensor_type]} cannot hold: export it as f32")
    maxima = array("f")
    if tensor_type == _TENSOR_Q8_0:
        maxima.frombytes(largest_bits)
        scales = array("f", [value / 127.0 for value in maxima])  # rounded once, as in float32
    else:
        # The block's first value of the largest magnitude, with its sign: going down the
        # columns, a word equal to the maximum takes its value's sign bit (the guard bit).
        signs = 0
        for j in reversed(range(_QK)):
            equal = (guard - (columns[j] ^ largest)) & guard
            signs ^= (signs ^ (int.from_bytes(values[j::_QK].tobytes(), _ORDER) & guard)) & equal
        nonzero = ((largest | guard) - _words(1, blocks)) & guard  # all zero: +0.0
        maxima.frombytes((largest | (signs & nonzero)).to_bytes(4 * blocks, _ORDER))
        scales = array("f", [value / -8.0 for value in maxima])
    # 1/d in float32; a scale so small that 1/d overflows gives infinite or NaN quotients,
    # which the tables read as 0 (its float16 is 0 too). Products and sums of two float32s
    # are exact in Python's doubles: struct's float32 packing rounds them once, as C does.
    inverses = array("f", [1.0 / scale if scale else 0.0 for scale in scales]).tolist()
    packing = f"<{blocks}f"
    try:
        scale_bytes = struct.pack(f"<{blocks}e", *scales)
    except OverflowError:
        largest_value = max(abs(value) for value in maxima)
        raise ValueError(f"tensor {name!r} has a value of magnitude {largest_value:g}, whose "
                         f"{_TENSOR_TYPE_NAMES[tensor_type]} block scale is beyond float16's "
                         "range (65504): export it as f32") from None
    size = _BLOCK_BYTES[tensor_type]
    out = bytearray(blocks * size)
    out[0::size] = scale_bytes[0::2]
    out[1::size] = scale_bytes[1::2]
    if tensor_type == _TENSOR_Q8_0:
        tables = _quant_tables(tensor_type)
        for j in range(_QK):
            quotients = struct.pack(packing, *map(mul, values[j::_QK], inverses))
            out[2 + j::size] = _prefix_lookup(quotients, tables).to_bytes(blocks, _ORDER)
        return bytes(out)
    low, high = _quant_tables(tensor_type), _quant_tables(tensor_type, high=True)
    half = _QK // 2
    for j in range(half):
        nibbles = 0
        for column, tables in ((j, low), (j + half, high)):
            quotients = struct.pack(packing, *map(mul, values[column::_QK], inverses))
            shifted = struct.pack(packing, *map(add, struct.unpack(packing, quotients),
                                                repeat(8.5)))
            nibbles |= _prefix_lookup(shifted, tables)
        out[2 + j::size] = nibbles.to_bytes(blocks, _ORDER)
    return bytes(out)


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


def _checked_bundle(source, dtype: str) -> ModelBundle:
    if dtype not in GGUF_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(GGUF_DTYPES)} (got {dtype!r})")
    return rotary_bundle(source, "GGUF", _FILE_ARCHITECTURE)


def gguf_tensor_types(source, dtype: str = "f32") -> dict[str, str]:
    """The type (``"F32"``, ``"F16"``, ``"Q8_0"``, ``"Q4_0"``) of each tensor, by GGUF name in
    file order, that :func:`export_gguf` of ``source`` with ``dtype`` writes: with ``q8_0``
    or ``q4_0``, a matrix whose rows are not a multiple of 32 values is ``"F16"``."""
    bundle = _checked_bundle(source, dtype)
    plan = _plan(bundle, bundle.config, GGUF_DTYPES[dtype][0])
    return {tensor_name: _TENSOR_TYPE_NAMES[kind] for tensor_name, _, kind, _ in plan}


def export_gguf(source, path, dtype: str = "f32", name: str | None = None) -> Path:
    """Write ``source`` (a :class:`ModelBundle`, a ``.rift`` path or a loaded
    :class:`PretrainedModel` of a rotary family) as the GGUF v3 file ``path``, atomically;
    see the module docstring. ``dtype`` is ``"f32"`` (exact), ``"f16"`` (matrices rounded
    to nearest even), ``"q8_0"`` or ``"q4_0"`` (matrices in ggml's blocks of 32, F16 where the
    rows do not divide into blocks: :func:`gguf_tensor_types`). ``name`` is ``general.name``
    (default: the bundle metadata's ``name``, else the file's stem). Returns the path.
    ValueError for what GGUF cannot express, before anything is written (a value F16 or a
    block scale cannot hold, found while writing, removes the temporary file)."""
    bundle = _checked_bundle(source, dtype)
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
        offset = _aligned(offset + _tensor_size(kind, count))
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
