"""Hugging Face checkpoints of the rotary families, read from their directory: Llama,
Mistral, Qwen 2/2.5, Qwen 3, Gemma 2, Gemma 3 (text) and Phi-3 (``GPT2LMHeadModel`` directories are
dispatched to :mod:`.huggingface_gpt2`).

A directory holds ``config.json`` (one of ``ARCHITECTURES``), the
weights as ``model.safetensors`` or as shards listed by ``model.safetensors.index.json``, and
``tokenizer.json`` with an optional ``tokenizer_config.json`` (chat template, bos/eos tokens).
:func:`load_huggingface` returns a :class:`~riftco_transformer.pretrained.PretrainedModel`;
:func:`read_config` only the :class:`LlamaMistralConfig`.

Weights: F32, F16 or BF16 tensors, converted exactly to float32 by the native library from
the memory-mapped file (``ParameterList.load_from_bytes``), so no Python loop touches a value.
Hugging Face's q/k rows are already in the split-half RoPE order of our model (no permutation,
unlike GGUF). Names map one to one (the family's extra tensors below)::

    model.embed_tokens.weight                  token_embedding.weight
    model.layers.N.input_layernorm.weight      blocks.N.attention_norm.scale
    model.layers.N.self_attn.{q,k,v,o}_proj    blocks.N.attention.{query,key,value,output}
    model.layers.N.post_attention_layernorm    blocks.N.feed_forward_norm.scale
    model.layers.N.mlp.{gate,up,down}_proj     blocks.N.feed_forward.{gate,up,down}
    model.norm.weight                          final_norm.scale
    lm_head.weight                             language_model_head.weight

(Every Hugging Face name ends in ``.weight``; ours end in ``.weight``, norms in ``.scale``.)
Qwen 2 adds ``self_attn.{q,k,v}_proj.bias``; Qwen 3 and Gemma 3 ``self_attn.{q,k}_norm``
(attention.{query,key}_norm.scale); Gemma 2 and 3 name their norms ``input_layernorm``,
``post_attention_layernorm`` (our post_attention_norm), ``pre_feedforward_layernorm``
(feed_forward_norm) and ``post_feedforward_layernorm`` (post_feed_forward_norm), stored as the
w of their (1 + w) form; Phi-3 fuses ``self_attn.qkv_proj`` (rows q, k, v) and
``mlp.gate_up_proj`` (rows gate, up), which are read as row ranges of the one tensor.

Gemma 2's ``attn_logit_softcapping`` and ``final_logit_softcapping`` (absent: transformers'
50 and 30; null: none) become the decoder's soft caps; Gemma 3 maps them the same way when a
config sets them (its transformers default is null). ``query_pre_attn_scalar`` s gives the
attention scale s**-0.5 of both.

RoPE scaling (``rope_parameters``, or 4.x's ``rope_scaling``, by ``rope_type`` or ``type``):
linear, llama3 and yarn, as transformers 5 computes them. YaRN (Qwen 2.5 and Qwen 3 past
32K: ``{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}``) takes
``original_max_position_embeddings`` (default ``max_position_embeddings``), ``factor`` (null:
their ratio), ``beta_fast``/``beta_slow`` (default 32 and 1) and ``attention_factor`` (as
given; null: 0.1·ln(factor) + 1); Gemma 3 applies it to its dense layers only.

With ``tie_word_embeddings`` the head is the embedding: ``lm_head.weight`` is then absent, or
byte for byte the embedding. Rotary ``inv_freq`` buffers are ignored. Like Hugging Face's own
loader, values are taken as they are (NaN and infinities included).

Strictness: nothing in the directory is trusted before it is checked. ``config.json`` is
strict JSON (no duplicate key; nesting too deep is reported as such) and every key read has
its type. Then every safetensors header (every shard the index lists) is read and checked
before any value is: a header of at most ``SAFETENSORS_MAXIMUM_HEADER_BYTES``, known fields
only, dtype F32/F16/BF16, each byte span exactly its shape's size, the spans tiling the data
buffer (no overlap, gap or missing byte). Then the config is checked against those tensors,
still before a model or anything sized by the config exists: ``num_hidden_layers`` equals the
layers the tensors hold, no tensor but the expected ones, every expected tensor present with
exactly the shape the config implies. So a config that claims a million layers or a 2**28
vocabulary over a small file fails at once, a ValueError naming config.json, the field and
both values (and the safetensors file). Config keys the decoder cannot honour (LongRoPE
scaling, and Phi-3's ``yarn``, which transformers reads as LongRoPE; YaRN's ``mscale``,
``mscale_all_dim`` or ``truncate`` false; an odd ``head_dim``, biases the family does not
have, another activation, soft-capping outside Gemma, Qwen's ``use_sliding_window``, a Gemma
``layer_types`` that is not a period (Gemma 2: not period 2)) are a ValueError naming the
key; ``tokenizer.json`` is read as :meth:`PretrainedTokenizer.from_tokenizer_json` says
(every defect a ValueError naming the file and the JSON path).
Nothing is returned half-loaded: on any error the model and tokenizer are closed.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from .._container import strict_json
from ..native._validation import UINT64_LIMIT, require_int
from ..native.llama import LlamaMistralConfig, LlamaMistralTransformer, checkpoint_tensor_name
from ..native.parameters import BYTE_DTYPES
from ..native.pretrained_tokenizer import PretrainedTokenizer
from ..serving.chat_templates import PretrainedChatTemplate
from .safetensors import (
    _ENTRY_KEYS,
    _INTEGER_LIMIT,
    _LENGTH_BYTES,
    METADATA_KEY,
    SAFETENSORS_MAXIMUM_HEADER_BYTES,
    _bounded_product,
    _check_tiling,
    _describe,
    _fail,
    _is_json_integer,
    _json_type,
    _parse_header,
    _reader_metadata,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
_GEMMA = ("gemma2", "gemma3")
# The activation key and value each family's config.json uses for its feed-forward.
_ACTIVATIONS = {family: ("hidden_activation", "gelu_pytorch_tanh") for family in _GEMMA}
_DEFAULT_ACTIVATION = ("hidden_act", "silu")

# Defaults of transformers' LlamaConfig / MistralConfig for keys a config.json may omit.
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_RMS_NORM_EPSILON = 1e-6
# Gemma's soft caps: config.json key -> our field, and transformers' Gemma2Config defaults
# for a key config.json omits (Gemma3TextConfig's are null: no cap).
_SOFTCAPS = {"attn_logit_softcapping": "attention_logit_softcap",
             "final_logit_softcapping": "final_logit_softcap"}
_DEFAULT_SOFTCAPS = {"gemma2": {"attn_logit_softcapping": 50.0,
                                "final_logit_softcapping": 30.0}}
# transformers' Gemma2Config sliding_window when config.json omits it.
_GEMMA2_DEFAULT_WINDOW = 4096
_FLOAT32_MAX = 3.4028234663852886e38

# Tensor names are the library's one architecture table (rt_checkpoint_tensor_name), shared
# with the GGUF loader; only the fused tensors' row widths are worked out here.


def _fused_rows(config: LlamaMistralConfig, name: str, part: int) -> tuple[int, int]:
    """Our parameter ``name``, part ``part`` of a fused tensor (Phi-3's ``qkv_proj``: q with
    Hq·d rows, then k and v with Hkv·d each; ``gate_up_proj``: gate, then up, F rows each):
    its first row and its rows."""
    d = config.resolved_head_width
    if ".attention." in name:
        widths = (config.query_head_count * d, config.key_value_head_count * d,
                  config.key_value_head_count * d)
    else:
        widths = (config.feed_forward_width, config.feed_forward_width)
    return sum(widths[:part]), widths[part]


# RoPE frequency buffers some checkpoints carry; they follow from the config.
_IGNORED = re.compile(r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")


def huggingface_name(name: str, architecture: str = "llama") -> str:
    """The Hugging Face tensor name of one of our parameter names in ``architecture``'s
    checkpoints (Phi-3's fused parameters: the fused tensor's name), from the library's
    architecture table. ValueError for a name without a Hugging Face counterpart."""
    return checkpoint_tensor_name(architecture, "huggingface", name)[0]


def _embedding_and_head(architecture: str) -> tuple[str, str]:
    return (huggingface_name("token_embedding.weight", architecture),
            huggingface_name("language_model_head.weight", architecture))


# ---- config.json


def read_config(directory: str | os.PathLike, maximum_context: int | None = None):
    """The model configuration of ``directory/config.json``: a :class:`LlamaMistralConfig`,
    or for ``GPT2LMHeadModel`` a :class:`TransformerConfig`.

    ``maximum_context`` (a positive int) replaces ``max_position_embeddings`` as the bound
    on sequences and the KV cache (RoPE has no position table; GPT-2's may only shorten
    ``n_positions``). ValueError naming the key for a missing or malformed value and for
    anything the model cannot honour.
    """
    path = Path(directory) / CONFIG_FILE
    document = _read_json_object(path)
    if _is_gpt2(document):
        from .huggingface_gpt2 import read_gpt2_config

        return read_gpt2_config(document, str(path), maximum_context)
    return _config_from_document(document, str(path), maximum_context)


def _is_gpt2(document: Mapping) -> bool:
    return document.get("architectures") == ["GPT2LMHeadModel"]


def is_gpt2_directory(directory: str | os.PathLike) -> bool:
    """Whether ``directory/config.json`` names ``GPT2LMHeadModel`` (False when unreadable:
    the loader then reports the problem)."""
    try:
        return _is_gpt2(_read_json_object(Path(directory) / CONFIG_FILE))
    except (OSError, ValueError):
        return False


def _config_from_document(
    document: dict, source: str, maximum_context: int | None
) -> LlamaMistralConfig:
    architecture = _architecture(document, source)
    width = _positive_int(document, "hidden_size", source)
    heads = _positive_int(document, "num_attention_heads", source)
    key_value_heads = _positive_int(document, "num_key_value_heads", source, default=heads)
    if heads % key_value_heads:
        _fail(source, f"num_attention_heads {heads} is not a multiple of num_key_value_heads "
                      f"{key_value_heads}")
    # transformers' Gemma2Config and Gemma3TextConfig default head_dim (and
    # query_pre_attn_scalar) to 256.
    head_dim = _positive_int(document, "head_dim", source,
                             default=256 if architecture in _GEMMA else None)
    if head_dim is None and width % heads != 0:
        _fail(source, f"hidden_size {width} is not a multiple of num_attention_heads {heads}")
    if head_dim is not None and head_dim % 2:
        _fail(source, f"head_dim {head_dim} is not supported (RoPE needs an even width)")
    head_width = 0 if head_dim is None or head_dim * heads == width else head_dim
    for key in ("attention_bias", "mlp_bias"):
        if document.get(key) not in (None, False):
            _fail(source, f"{key} {_describe(document[key])} is not supported (only false)")
    activation_key, activation = _ACTIVATIONS.get(architecture, _DEFAULT_ACTIVATION)
    if document.get(activation_key, activation) != activation:
        _fail(source, f"{activation_key} {_describe(document[activation_key])} is not supported "
                      f"(only {activation!r})")
    caps = _softcaps(document, architecture, source)
    if _optional_bool(document, "use_sliding_window", source):
        _fail(source, "use_sliding_window true is not supported (Qwen's per-layer windows)")
    if _optional_bool(document, "use_bidirectional_attention", source):
        _fail(source, "use_bidirectional_attention true is not supported (a decoder is causal)")
    if document.get("partial_rotary_factor", 1.0) != 1.0:
        _fail(source, f"partial_rotary_factor {_describe(document['partial_rotary_factor'])} is "
                      "not supported (only 1.0)")
    tied = document.get("tie_word_embeddings", architecture in _GEMMA)
    if not isinstance(tied, bool):
        _fail(source, f"tie_word_embeddings must be true or false, not {_json_type(tied)}")
    context = trained_context = _positive_int(document, "max_position_embeddings", source)
    if maximum_context is not None:
        context = require_int(maximum_context, "maximum_context", 1, UINT64_LIMIT)
    blocks = _positive_int(document, "num_hidden_layers", source)
    window = None
    if architecture in ("mistral", "phi3", "gemma3"):  # Llama and Qwen (by default): none
        window = _positive_int(document, "sliding_window", source, default=None)
    elif architecture == "gemma2":  # absent: transformers' 4096; null: none
        window = _positive_int(document, "sliding_window", source,
                               default=_GEMMA2_DEFAULT_WINDOW if "sliding_window" not in document
                               else None)
    fields = dict(
        vocabulary_size=_positive_int(document, "vocab_size", source),
        maximum_context=context,
        model_width=width,
        query_head_count=heads,
        key_value_head_count=key_value_heads,
        block_count=blocks,
        feed_forward_width=_positive_int(document, "intermediate_size", source),
        rms_norm_epsilon=_positive_float(document, "rms_norm_eps", source,
                                         _DEFAULT_RMS_NORM_EPSILON),
        sliding_window=window,
        tie_embeddings=tied,
        head_width=head_width,
    )
    if architecture == "gemma3":
        global_rope, local_rope = _gemma_rope(document, source, trained_context)
        fields.update(global_rope)
        fields["rope_local_theta"] = local_rope["rope_theta"]
        fields["sliding_window_period"] = _gemma_window_period(document, blocks, window, source)
    else:
        fields.update(_rope(document, source, trained_context, architecture))
    if architecture == "gemma2":
        fields["sliding_window_period"] = _gemma_window_period(document, blocks, window, source,
                                                               period=2)
    if architecture in _GEMMA:
        scalar = _positive_float(document, "query_pre_attn_scalar", source, 256.0)
        if scalar != head_dim:
            fields["attention_scale"] = scalar ** -0.5
    # The caps as config.json gives them: the Gemma 2 preset would turn a 0 (null) into 50/30.
    return replace(LlamaMistralConfig.preset(architecture, **fields), **caps)


def _softcaps(document: Mapping, architecture: str, source: str) -> dict:
    """Gemma's ``attn_logit_softcapping`` and ``final_logit_softcapping`` as our fields
    (null: 0, no cap; absent: transformers' default); another family's must be null."""
    if architecture not in _GEMMA:
        for key in _SOFTCAPS:
            if document.get(key) is not None:
                _fail(source, f"{key} {_describe(document[key])} is not supported (only null, "
                              "or a Gemma model)")
        return {}
    defaults = _DEFAULT_SOFTCAPS.get(architecture, {})
    caps = {}
    for key, field in _SOFTCAPS.items():
        value = document[key] if key in document else defaults.get(key)
        if value is None:
            caps[field] = 0.0
            continue
        cap = _positive_float({key: value}, key, source, 0.0)
        if cap > _FLOAT32_MAX:
            _fail(source, f"{key} {_describe(value)} is not supported (beyond float32)")
        caps[field] = cap
    return caps


def _gemma_window_period(document: Mapping, blocks: int, window: int | None,
                         source: str, period: int | None = None) -> int:
    """The period p of Gemma's local/global layers (layer i dense when (i+1) % p == 0):
    from ``layer_types`` (transformers 5), checked to be that pattern, or (4.x) Gemma 3's
    ``sliding_window_pattern`` (default 6). Gemma 2 passes ``period`` 2, its only pattern
    (4.x: the even layers sliding); its sliding layers need a ``sliding_window``."""
    layer_types = document.get("layer_types")
    if layer_types is None:
        if period is not None:
            if window is None:
                _fail(source, "sliding_window null is not supported (Gemma 2's even layers "
                              "are sliding_attention layers)")
            return period if window is not None else 0
        period = _positive_int(document, "sliding_window_pattern", source, default=6)
        return period if window is not None else 0
    if not isinstance(layer_types, list) or len(layer_types) != blocks:
        _fail(source, f"layer_types must list {blocks} layer types")
    dense = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    fixed = period is not None
    if not fixed:
        period = dense[0] + 1 if dense else 6
    expected = ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
                for i in range(blocks)]
    all_dense = dense == list(range(blocks))
    if window is None and not all_dense:
        _fail(source, f"layer_types {_describe(layer_types)} is not supported with sliding_window "
                      "null (sliding_attention layers need a window)")
    if window is not None and layer_types != expected:
        pattern = "every 2nd layer" if fixed else "every p-th layer"
        _fail(source, f"layer_types {_describe(layer_types)} is not supported ({pattern} "
                      "full_attention, the others sliding_attention, with a sliding_window)")
    return period if window is not None else 0


def _architecture(document: Mapping, source: str) -> str:
    names = document.get("architectures")
    if (not isinstance(names, list) or len(names) != 1 or not isinstance(names[0], str)
            or names[0] not in ARCHITECTURES):
        _fail(source, f"architectures {_describe(names)} is not supported (one of "
                      f"{', '.join(ARCHITECTURES)}, GPT2LMHeadModel)")
    return ARCHITECTURES[names[0]]


def _positive_int(document: Mapping, key: str, source: str, default: object = ...) -> int:
    """``document[key]`` as an int >= 1; ``default`` when absent or null (required if none)."""
    value = document.get(key)
    if value is None:
        if default is ...:
            _fail(source, f"{key} is missing")
        return default
    if not _is_json_integer(value) or not 1 <= value < UINT64_LIMIT:
        _fail(source, f"{key} must be a positive integer, not {_json_type(value)}")
    return value


def _positive_float(document: Mapping, key: str, source: str, default: float) -> float:
    """``document[key]`` as a finite float > 0; ``default`` when absent or null."""
    value = document.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            or not math.isfinite(float(value))):
        _fail(source, f"{key} must be a positive finite number, not {_json_type(value)}")
    return float(value)


def _optional_bool(document: Mapping, key: str, source: str) -> bool | None:
    """``document[key]`` when true or false; None when absent or null."""
    value = document.get(key)
    if value is not None and not isinstance(value, bool):
        _fail(source, f"{key} must be true, false or null, not {_json_type(value)}")
    return value


def _rope(document: Mapping, source: str, trained_context: int | None = None,
          architecture: str = "llama") -> dict:
    """The RoPE base and scaling as LlamaMistralConfig fields, from transformers 5's
    ``rope_parameters`` or 4.x's ``rope_theta`` + ``rope_scaling``: rope types default,
    linear, llama3 and yarn (LongRoPE and the rest: ValueError naming the key).
    ``trained_context`` is config.json's ``max_position_embeddings``, the default of YaRN's
    ``original_max_position_embeddings`` (transformers' standardize_rope_params)."""
    parameters = document.get("rope_parameters")
    if parameters is not None:
        key, where = "rope_parameters", source + " rope_parameters"
        if not isinstance(parameters, dict):
            _fail(source, f"rope_parameters {_describe(parameters)} must be an object")
        theta = _positive_float(parameters, "rope_theta", where, _DEFAULT_ROPE_THETA)
        scaling = parameters
    else:
        key, where = "rope_scaling", source + " rope_scaling"
        theta = _positive_float(document, "rope_theta", source, _DEFAULT_ROPE_THETA)
        scaling = document.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            _fail(source, f"rope_scaling {_describe(scaling)} must be null or an object")
    kind = "default"
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
    fields = {"rope_theta": theta}
    if kind == "linear":
        fields.update(rope_scaling="linear",
                      rope_scaling_factor=_positive_float(scaling, "factor", where, 1.0))
    elif kind == "llama3":
        fields.update(
            rope_scaling="llama3",
            rope_scaling_factor=_positive_float(scaling, "factor", where, 8.0),
            rope_low_frequency_factor=_positive_float(scaling, "low_freq_factor", where, 1.0),
            rope_high_frequency_factor=_positive_float(scaling, "high_freq_factor", where, 4.0),
            rope_original_context=_positive_int(scaling, "original_max_position_embeddings",
                                                where, default=8192))
    elif kind == "yarn" and architecture == "phi3":
        # Phi3Config turns "yarn" (and "su") into "longrope", which needs short/long factors.
        _fail(source, f"{key} {_describe(scaling)} is not supported (transformers reads "
                      "Phi-3's rope type 'yarn' as LongRoPE)")
    elif kind == "yarn":
        fields.update(_yarn(scaling, where, trained_context))
    elif kind != "default":
        _fail(source, f"{key} {_describe(scaling)} is not supported (rope_type default, linear, "
                      "llama3 or yarn)")
    return fields


def _yarn(scaling: Mapping, where: str, trained_context: int | None) -> dict:
    """YaRN's fields as transformers' ``_compute_yarn_parameters`` reads them (``where`` is
    "config.json rope_scaling" or "... rope_parameters"): ``original_max_position_embeddings``
    (default: ``max_position_embeddings``); ``factor`` (null or absent: max_position_embeddings
    / original_max_position_embeddings); ``beta_fast``/``beta_slow`` (null or 0: 32 and 1,
    transformers' ``or``); ``attention_factor`` used as given (null: 0.1·ln(factor) + 1, which
    the library computes). DeepSeek's ``mscale``/``mscale_all_dim`` and ``truncate`` false
    (an unrounded ramp) are refused: the decoder implements truncate=True only."""
    for name in ("mscale", "mscale_all_dim"):
        if scaling.get(name) is not None:
            _fail(where, f"{name} {_describe(scaling[name])} is not supported (DeepSeek's YaRN "
                         "attention factor; only attention_factor or none)")
    truncate = scaling.get("truncate")
    if truncate is not None and truncate is not True:
        _fail(where, f"truncate {_describe(truncate)} is not supported (only true: the ramp "
                     "between the floored and ceiled correction dimensions)")
    original = _positive_int(scaling, "original_max_position_embeddings", where,
                             default=trained_context)
    if original is None:
        _fail(where, "original_max_position_embeddings is missing (and so is "
                     "max_position_embeddings)")
    factor = scaling.get("factor")
    if factor is None:
        if trained_context is None:
            _fail(where, "factor is missing (and so is max_position_embeddings)")
        factor = trained_context / original
    else:
        factor = _yarn_real(scaling, "factor", where, None)

    betas = {name: _yarn_real(scaling, name, where, default)
             for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0))}
    if not betas["beta_fast"] > betas["beta_slow"]:
        _fail(where, f"beta_fast {_describe(scaling.get('beta_fast'))} must exceed beta_slow "
                     f"{_describe(scaling.get('beta_slow'))} (defaults 32 and 1)")
    attention = scaling.get("attention_factor")
    return dict(rope_scaling="yarn", rope_scaling_factor=factor, rope_original_context=original,
                rope_yarn_beta_fast=betas["beta_fast"], rope_yarn_beta_slow=betas["beta_slow"],
                rope_yarn_attention_factor=0.0 if attention is None
                else _yarn_real(scaling, "attention_factor", where, None))


def _yarn_real(scaling: Mapping, name: str, where: str, default: float | None) -> float:
    """``scaling[name]`` as a positive finite float below float32's largest; with a
    ``default``, null and 0 take it (transformers' ``scaling.get(name) or default``)."""
    value = scaling.get(name)
    if default is not None and (value is None or (value == 0 and not isinstance(value, bool))):
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value <= _FLOAT32_MAX):  # NaN and the infinities fail too
        _fail(where, f"{name} {_describe(value)} is not supported (a positive number, at most "
                     "float32's largest)")
    return float(value)


def _gemma_rope(document: Mapping, source: str,
                trained_context: int) -> tuple[dict, dict]:
    """Gemma 3's RoPE of its dense layers (base and scaling) and of its windowed layers
    (``rope_local_base_freq``, unscaled): transformers 5's ``rope_parameters`` per layer type,
    or 4.x's ``rope_theta``, ``rope_scaling`` and ``rope_local_base_freq``. A 4.x
    ``rope_scaling`` naming its kind by ``type`` alone is refused: transformers 5 merges it
    into a full_attention entry whose ``rope_type`` stays "default" (no scaling), 4.x scaled."""
    parameters = document.get("rope_parameters")
    if isinstance(parameters, dict) and "full_attention" in parameters:
        full = _rope({"rope_parameters": parameters["full_attention"]}, source,
                     trained_context, "gemma3")
        local = _rope({"rope_parameters": parameters.get("sliding_attention", {})}, source)
    else:
        scaling = document.get("rope_scaling")
        if (isinstance(scaling, dict) and "rope_type" not in scaling
                and scaling.get("type", "default") != "default"):
            _fail(source, f"rope_scaling {_describe(scaling)} is not supported (Gemma 3's kind "
                          "as type without rope_type: transformers 5 ignores it, 4.x applied "
                          "it)")
        full = _rope({**document, "rope_theta": document.get("rope_theta", 1e6)}, source,
                     trained_context, "gemma3")
        local = {"rope_theta": _positive_float(document, "rope_local_base_freq", source, 1e4)}
    if set(local) != {"rope_theta"}:
        _fail(source, "rope_parameters.sliding_attention: only rope_type 'default' is supported")
    return full, local


def _read_json_object(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    document = strict_json(path.read_bytes(), str(path))
    if not isinstance(document, dict):
        _fail(str(path), f"must hold a JSON object, not {_json_type(document)}")
    return document


# ---- safetensors headers (F32, F16, BF16)


@dataclass(frozen=True)
class TensorSpan:
    """Where one tensor's bytes lie: ``path``, and ``[begin, end)`` as file offsets."""

    path: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, TensorSpan], dict]:
    """The tensors (by name) and ``__metadata__`` of a safetensors file, no value read.

    ValueError starting with the path for every rule of the module docstring; the header is
    read with at most its declared (bounded) length, never the whole file.
    """
    path = Path(path)
    source = str(path)
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        prefix = stream.read(_LENGTH_BYTES)
        if len(prefix) == _LENGTH_BYTES:
            length = int.from_bytes(prefix, "little")
            if 0 < length <= SAFETENSORS_MAXIMUM_HEADER_BYTES:
                # A file shorter than the header claims is reported by _parse_header.
                prefix += stream.read(min(length, size - _LENGTH_BYTES))
    header, length = _parse_header(memoryview(prefix), source)
    metadata = _reader_metadata(header, source)
    data_start = _LENGTH_BYTES + length
    entries = [
        (*_tensor_entry(name, entry, source), name)
        for name, entry in header.items()
        if name != METADATA_KEY
    ]
    entries.sort(key=lambda entry: (entry[2], entry[3]))  # by offsets; ties in header order
    _check_tiling([(shape, begin, end, name) for _, shape, begin, end, name in entries],
                  size - data_start, source)
    tensors = {
        name: TensorSpan(path, name, dtype, shape, data_start + begin, data_start + end)
        for dtype, shape, begin, end, name in entries
    }
    return tensors, metadata


def _tensor_entry(name: str, entry: object, source: str) -> tuple[str, tuple[int, ...], int, int]:
    """One header entry as ``(dtype, shape, begin, end)``, the span checked against the shape."""
    tensor = f"tensor {_describe(name)}"
    if not isinstance(entry, dict):
        _fail(source, f"{tensor} must be an object, not {_json_type(entry)}")
    unknown = [key for key in entry if key not in _ENTRY_KEYS]
    if unknown:
        _fail(source, f"{tensor} has unknown field(s) {', '.join(map(_describe, unknown))}")
    for key in _ENTRY_KEYS:
        if key not in entry:
            _fail(source, f"{tensor} has no {key}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in BYTE_DTYPES:
        _fail(source, f"{tensor}: dtype {_describe(dtype)} is not supported (only "
                      f"{', '.join(BYTE_DTYPES)})")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(
        _is_json_integer(d) and 0 <= d < _INTEGER_LIMIT for d in shape
    ):
        _fail(source, f"{tensor}: shape {_describe(shape)} must be an array of integers in "
                      "[0, 2**64)")
    offsets = entry["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_json_integer(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] < _INTEGER_LIMIT):
        _fail(source, f"{tensor}: data_offsets {_describe(offsets)} must be two integers with "
                      "0 <= begin <= end < 2**64")
    begin, end = offsets
    element_bytes = BYTE_DTYPES[dtype][1]
    count = _bounded_product(shape, _INTEGER_LIMIT)
    if count is None or count * element_bytes != end - begin:
        needs = f"{count * element_bytes}" if count is not None else "more than 2**64"
        _fail(source, f"{tensor}: data_offsets [{begin}, {end}] span {end - begin} bytes, but "
                      f"{dtype} shape {_describe(shape)} needs {needs}")
    return dtype, tuple(shape), begin, end


# ---- the weights of a checkpoint directory


def read_checkpoint_tensors(directory: str | os.PathLike) -> dict[str, TensorSpan]:
    """Every tensor of ``model.safetensors``, or of the shards ``model.safetensors.index.json``
    lists (each shard holding exactly the tensors the index assigns to it)."""
    directory = Path(directory)
    single = directory / WEIGHTS_FILE
    if single.is_file():
        return read_safetensors_header(single)[0]
    index_path = directory / INDEX_FILE
    if not index_path.is_file():
        raise FileNotFoundError(f"{directory}: neither {WEIGHTS_FILE} nor {INDEX_FILE}")
    source = str(index_path)
    index = _read_json_object(index_path)
    unknown = [key for key in index if key not in ("metadata", "weight_map")]
    if unknown:
        _fail(source, f"unknown key(s) {', '.join(map(_describe, unknown))}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        _fail(source, f"weight_map must be an object, not {_json_type(weight_map)}")
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        if (not isinstance(shard, str) or shard in ("", ".", "..") or "/" in shard
                or "\\" in shard or "\0" in shard):
            _fail(source, f"weight_map[{_describe(name)}] = {_describe(shard)} is not a file name "
                          "in the checkpoint directory")
        shards.setdefault(shard, set()).add(name)
    tensors: dict[str, TensorSpan] = {}
    for shard, names in shards.items():
        shard_path = directory / shard
        if not shard_path.is_file():
            raise FileNotFoundError(f"{source}: shard {shard!r} does not exist")
        held, _ = read_safetensors_header(shard_path)
        for name in held.keys() - names:
            where = weight_map.get(name)
            assigned = f"assigns it to {where!r}" if where is not None else "does not list it"
            _fail(str(shard_path), f"holds tensor {_describe(name)}, but {INDEX_FILE} {assigned}")
        for name in sorted(names - held.keys()):
            _fail(source, f"assigns tensor {_describe(name)} to {shard!r}, which does not hold it")
        tensors.update(held)
    return tensors


# ---- the config against the tensors, before a model exists


@dataclass(frozen=True)
class _Dimension:
    """One dimension of an expected tensor: its size, and the ``config.json`` key (or the
    expression of keys) it follows from, for error messages."""

    size: int
    field: str


def _weights_source(directory: Path) -> Path:
    """The file that lists the checkpoint's tensors: ``model.safetensors``, else the index."""
    single = directory / WEIGHTS_FILE
    return single if single.is_file() else directory / INDEX_FILE


def _require_layer_count(tensors: Mapping[str, TensorSpan], layer: re.Pattern,
                         block_names: set[str], field: str, count: int, config_source: str,
                         weights_source: Path) -> None:
    """The config's layer count (``field``) is the checkpoint's: its per-layer tensor names
    (``layer`` matches the index N and the rest, which must be one of ``block_names``;
    buffers such as ``inv_freq`` do not count) use exactly the indices 0 .. count - 1. Checked
    before anything proportional to ``count`` is made, so a huge count fails at once, and
    what follows is bounded by the tensors present."""
    present = set()
    for name in tensors:
        match = layer.fullmatch(name)
        if match and match.group(2) in block_names:
            present.add(int(match.group(1)))
    if len(present) != count or (present and max(present) != count - 1):
        what = (f"tensors of {len(present)} layer(s), numbered {min(present)} to "
                f"{max(present)}" if present else "no layer's tensors")
        _fail(config_source, f"{field} {count} disagrees with {weights_source}, which holds "
                             f"{what}")


def _require_shape(span: TensorSpan, dimensions: tuple[_Dimension, ...],
                   config_source: str) -> None:
    """``span`` has the shape ``dimensions`` give; else ValueError naming the tensor's file,
    the tensor, each ``config.json`` field whose size disagrees, and both sizes."""
    expected = [dimension.size for dimension in dimensions]
    if list(span.shape) == expected:
        return
    if len(span.shape) == len(expected):
        detail = ", ".join(f"{dimension.field} {dimension.size} vs the tensor's {size}"
                           for dimension, size in zip(dimensions, span.shape, strict=True)
                           if dimension.size != size)
    else:
        detail = (f"[{', '.join(dimension.field for dimension in dimensions)}], "
                  f"{len(expected)} dimension(s), not {len(span.shape)}")
    _fail(str(span.path), f"tensor {span.name!r} has shape {list(span.shape)}, the config "
                          f"needs {expected} ({config_source}: {detail})")


def _family_parameters(config: LlamaMistralConfig):
    """Our parameters of ``config``'s model, as the library creates them, name -> labelled
    shape: the global ones, and one block's (the name after ``blocks.N.``)."""
    width = _Dimension(config.model_width, "hidden_size")
    vocabulary = _Dimension(config.vocabulary_size, "vocab_size")
    feed_forward = _Dimension(config.feed_forward_width, "intermediate_size")
    d = config.resolved_head_width
    query_rows, key_value_rows = config.query_head_count * d, config.key_value_head_count * d
    if config.head_width:
        head = _Dimension(d, "head_dim")
        query = _Dimension(query_rows, "num_attention_heads * head_dim")
        key_value = _Dimension(key_value_rows, "num_key_value_heads * head_dim")
    else:  # d = D / Hq, so the query rows are D
        head = _Dimension(d, "hidden_size / num_attention_heads")
        query = _Dimension(query_rows, "hidden_size")
        key_value = _Dimension(key_value_rows,
                               "num_key_value_heads * hidden_size / num_attention_heads")
    global_parameters = {"token_embedding.weight": (vocabulary, width),
                         "final_norm.scale": (width,)}
    if not config.tie_embeddings:
        global_parameters["language_model_head.weight"] = (vocabulary, width)
    block = {"attention_norm.scale": (width,), "attention.query.weight": (query, width),
             "attention.key.weight": (key_value, width),
             "attention.value.weight": (key_value, width),
             "attention.output.weight": (width, query)}
    if config.query_key_value_bias:
        block.update({"attention.query.bias": (query,), "attention.key.bias": (key_value,),
                      "attention.value.bias": (key_value,)})
    if config.query_key_norm:
        block.update({"attention.query_norm.scale": (head,),
                      "attention.key_norm.scale": (head,)})
    if config.post_block_norms:
        block.update({"post_attention_norm.scale": (width,),
                      "post_feed_forward_norm.scale": (width,)})
    block.update({"feed_forward_norm.scale": (width,),
                  "feed_forward.gate.weight": (feed_forward, width),
                  "feed_forward.up.weight": (feed_forward, width),
                  "feed_forward.down.weight": (width, feed_forward)})
    fused = {}
    if config.architecture == "phi3":
        fused = {
            "self_attn.qkv_proj.weight": (
                _Dimension(query_rows + 2 * key_value_rows,
                           f"{query.field} + 2 * {key_value.field}"), width),
            "mlp.gate_up_proj.weight": (
                _Dimension(2 * config.feed_forward_width, "2 * intermediate_size"), width),
        }
    return global_parameters, block, fused


_LAYER = re.compile(r"model\.layers\.(0|[1-9][0-9]{0,17})\.(.+)")


def _check_tensors(config: LlamaMistralConfig, tensors: dict[str, TensorSpan],
                   config_source: str, weights_source: Path) -> None:
    """Every rule between ``config`` and the checkpoint's tensors, before any model exists:
    ``num_hidden_layers`` equals the layers present, then no tensor but the expected ones
    (``inv_freq`` buffers and, when tied, a copy of the embedding as ``lm_head.weight``
    aside), every expected tensor present, and each with the shape the config implies."""
    architecture, tied = config.architecture, config.tie_embeddings
    global_parameters, block, fused = _family_parameters(config)
    block_expected = {}
    for name, dimensions in block.items():
        hf_name = huggingface_name(f"blocks.0.{name}", architecture).split(".", 3)[3]
        block_expected[hf_name] = fused.get(hf_name, dimensions)
    _require_layer_count(tensors, _LAYER, set(block_expected), "num_hidden_layers",
                         config.block_count, config_source, weights_source)
    # Now bounded by the tensors present: one entry per tensor of the config's model.
    expected = {huggingface_name(name, architecture): dimensions
                for name, dimensions in global_parameters.items()}
    for layer in range(config.block_count):
        for name, dimensions in block_expected.items():
            expected[f"model.layers.{layer}.{name}"] = dimensions
    for name, span in tensors.items():
        if name in expected or _IGNORED.fullmatch(name):
            continue
        embedding_name, head_name = _embedding_and_head(architecture)
        if name == head_name and tied:
            _require_tied_head(span, tensors.get(embedding_name), head_name, embedding_name)
            continue
        _fail(str(span.path), f"unexpected tensor {_describe(name)} (not a parameter of a "
                              f"{'tied ' if tied else ''}{architecture} model)")
    for name in expected:
        if name not in tensors:
            _fail(str(weights_source), f"the checkpoint has no tensor {name!r}")
    for name, dimensions in expected.items():
        _require_shape(tensors[name], dimensions, config_source)


def _plan(names, shapes, tensors: dict[str, TensorSpan],
          config: LlamaMistralConfig) -> list[TensorSpan]:
    """The tensor (or, for Phi-3's fused tensors, the row range) of each of our parameters,
    in list order; the tensors were checked by :func:`_check_tensors`. The model's
    parameters must be the ones :func:`_family_parameters` predicted."""
    global_parameters, block, _ = _family_parameters(config)
    predicted = {name: [d.size for d in dimensions]
                 for name, dimensions in global_parameters.items()}
    for layer in range(config.block_count):
        predicted.update({f"blocks.{layer}.{name}": [d.size for d in dimensions]
                          for name, dimensions in block.items()})
    if predicted != {name: list(shape) for name, shape in zip(names, shapes, strict=True)}:
        raise ValueError(f"the {config.architecture} model's parameters are not the ones its "
                         "config predicts (a defect of this importer)")
    plan = []
    for name in names:
        tensor_name, part = checkpoint_tensor_name(config.architecture, "huggingface", name)
        span = tensors[tensor_name]
        if part is not None:  # a row range of a fused tensor: row-major, so one byte range
            first_row, rows = _fused_rows(config, name, part)
            row_bytes = (span.end - span.begin) // span.shape[0]
            begin = span.begin + first_row * row_bytes
            span = TensorSpan(span.path, span.name, span.dtype, (rows, span.shape[1]), begin,
                              begin + rows * row_bytes)
        plan.append(span)
    return plan


def _require_tied_head(head: TensorSpan, embedding: TensorSpan | None, head_name: str,
                       embedding_name: str) -> None:
    """With tied embeddings a head tensor (``head_name``) must repeat the embedding
    (``embedding_name``) byte for byte."""
    same = (embedding is not None and head.dtype == embedding.dtype
            and head.shape == embedding.shape)
    if same:
        with _mapped(head.path) as head_view, _mapped(embedding.path) as embedding_view:
            same = (head_view[head.begin:head.end]
                    == embedding_view[embedding.begin:embedding.end])  # bytewise, no copy
    if not same:
        _fail(str(head.path), f"tensor {head_name!r} differs from {embedding_name!r} but "
                              "tie_word_embeddings is true")


class _mapped:
    """A file's byte ranges as writable memoryviews (so ctypes reads them in place):
    ``view[begin:end]`` reads that range (unbuffered ``readinto``) into a buffer this object
    reuses,
    so a view is valid until the next slice of the same object. ``len(view)`` is the file's
    size when it was opened. A file that shrinks while it is read (a copy or a download over it
    during start-up) ends a read early, which is a ValueError naming the file and the range,
    never the SIGBUS that copying out of a memory map of vanished pages raises. Peak memory
    is the largest range read."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: io.FileIO | None = None
        self._size = 0
        self._buffer = bytearray()

    def __enter__(self) -> _mapped:
        self._file = io.FileIO(self._path, "r")
        self._size = os.fstat(self._file.fileno()).st_size
        return self

    def __exit__(self, *exception_info) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, item: slice) -> memoryview:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("a file is read by contiguous [begin:end] ranges")
        begin, end, _ = item.indices(self._size)
        size = max(0, end - begin)
        if len(self._buffer) < size:
            self._buffer = bytearray(size)  # a new buffer: views of the old one stay valid
        view = memoryview(self._buffer)[:size]
        done = 0
        self._file.seek(begin)
        while done < size:
            got = self._file.readinto(view[done:])
            if not got:
                raise ValueError(f"{self._path}: the file shrank while it was being read: "
                                 f"bytes [{begin}, {end}) end at {begin + done}")
            done += got
        return view


def _load_weights(model: LlamaMistralTransformer, tensors: dict[str, TensorSpan]) -> None:
    with model.parameters() as parameters:
        plan = _plan(parameters.names, parameters.shapes, tensors, model.config)
        by_file: dict[Path, list[tuple[int, TensorSpan]]] = {}
        for index, span in enumerate(plan):
            by_file.setdefault(span.path, []).append((index, span))
        for path, spans in by_file.items():
            with _mapped(path) as view:
                if len(view) < max(span.end for _, span in spans):
                    raise ValueError(f"{path}: the file shrank while it was being read")
                for index, span in spans:
                    parameters.load_from_bytes(index, span.dtype, view[span.begin:span.end])


# ---- tokenizer and chat template


def _special_id(settings: dict, key: str, config: dict, tokenizer, source: str) -> int | None:
    """``tokenizer_config.json``'s ``bos_token``/``eos_token`` (text or an AddedToken object)
    as an id; else ``config.json``'s ``*_token_id`` (the first of a list); else None."""
    token = settings.get(f"{key}_token")
    if isinstance(token, dict):
        token = token.get("content")
    if token is not None:
        if not isinstance(token, str):
            _fail(source, f"{key}_token must be a string or an AddedToken, not {_json_type(token)}")
        found = tokenizer.find_token(token)
        if found is None:
            _fail(source, f"{key}_token {token!r} is not a token of {TOKENIZER_FILE}")
        return found
    value = config.get(f"{key}_token_id")
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if not _is_json_integer(value) or not 0 <= value < tokenizer.vocabulary_size:
        _fail(f"{source} ({CONFIG_FILE})",
              f"{key}_token_id {_describe(value)} is no token id of {TOKENIZER_FILE}")
    return value


def _chat_template_text(directory: Path, settings: dict, source: str
                        ) -> tuple[str | None, str]:
    """``tokenizer_config.json``'s ``chat_template`` (a string, or the one named "default" of
    a list), else ``chat_template.jinja``, else None; with where it came from, as errors about
    the template name it. A ``chat_template.jinja`` that is not UTF-8 is a ValueError naming
    the file."""
    text = settings.get("chat_template")
    if isinstance(text, list):
        text = next((entry.get("template") for entry in text
                     if isinstance(entry, dict) and entry.get("name") == "default"), None)
        if text is None:
            _fail(source, "chat_template lists no template named 'default'")
    if text is not None:
        if not isinstance(text, str):
            _fail(source, f"chat_template must be a string, not {_json_type(text)}")
        return text, f"{source} (chat_template)"
    jinja = directory / CHAT_TEMPLATE_FILE
    if not jinja.is_file():
        return None, str(jinja)
    data = jinja.read_bytes()
    try:
        return data.decode("utf-8"), str(jinja)
    except UnicodeDecodeError as error:
        _fail(str(jinja), f"is not UTF-8 text: byte {error.start:,} of {len(data):,} "
                          f"({data[error.start]:#04x}) {error.reason}")


def _tokenizer_and_template(directory: Path, config: dict, vocabulary_size: int,
                            default: str | None = "chatml"):
    """The tokenizer and the chat template; without a template, the ``default`` family's
    (None: no template is returned)."""
    tokenizer_path = directory / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise FileNotFoundError(f"{directory}: no {TOKENIZER_FILE}")
    tokenizer = PretrainedTokenizer.from_tokenizer_json(tokenizer_path)
    try:
        if tokenizer.vocabulary_size > vocabulary_size:
            raise ValueError(f"{tokenizer_path}: {tokenizer.vocabulary_size} tokens, more than "
                             f"the model's vocab_size {vocabulary_size}")
        settings_path = directory / TOKENIZER_CONFIG_FILE
        settings = _read_json_object(settings_path) if settings_path.is_file() else {}
        source = str(settings_path)
        special = (_special_id(settings, "bos", config, tokenizer, source),
                   _special_id(settings, "eos", config, tokenizer, source))
        if special != (tokenizer.bos_id, tokenizer.eos_id):
            # tokenizer.json names no bos/eos: the same vocabulary again, with them.
            state = {**tokenizer.state(), "bos_id": special[0], "eos_id": special[1]}
            tokenizer.close()
            tokenizer = PretrainedTokenizer.from_state(state)
        bos, eos = (tokenizer.token_text(i) if i is not None else ""
                    for i in (tokenizer.bos_id, tokenizer.eos_id))
        text, template_source = _chat_template_text(directory, settings, source)
        if text:
            template = PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos,
                                                        source=template_source)
        elif default is not None:
            template = PretrainedChatTemplate.for_family(default, eos_token=eos)
        else:
            template = None
    except BaseException:
        tokenizer.close()
        raise
    return tokenizer, template


# ---- the whole checkpoint


def load_huggingface(directory: str | os.PathLike, maximum_context: int | None = None):
    """The checkpoint in ``directory`` as a PretrainedModel (model on CPU with flash
    attention, materialized when a sliding window is shorter than the context).

    ``maximum_context``: see :func:`read_config` (None keeps ``max_position_embeddings``).
    ValueError naming the file and the tensor or key at fault, FileNotFoundError for a
    missing file; nothing is left open on failure.
    """
    from ..pretrained import PretrainedModel

    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    document = _read_json_object(config_path)
    if _is_gpt2(document):
        from .huggingface_gpt2 import load_gpt2

        return load_gpt2(directory, document, maximum_context)
    config = _config_from_document(document, str(config_path), maximum_context)
    tensors = read_checkpoint_tensors(directory)
    _check_tensors(config, tensors, str(config_path), _weights_source(directory))
    windowed = config.sliding_window is not None and config.sliding_window < config.maximum_context
    model = LlamaMistralTransformer(config, attention="materialized" if windowed else "flash")
    try:
        _load_weights(model, tensors)
        tokenizer, template = _tokenizer_and_template(directory, document,
                                                      config.vocabulary_size)
    except BaseException:
        model.close()
        raise
    return PretrainedModel(model, tokenizer, template, config.architecture, str(directory))


__all__ = [
    "ARCHITECTURES",
    "TensorSpan",
    "huggingface_name",
    "is_gpt2_directory",
    "load_huggingface",
    "read_checkpoint_tensors",
    "read_config",
    "read_safetensors_header",
]
