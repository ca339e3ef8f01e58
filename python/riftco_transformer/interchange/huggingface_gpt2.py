"""Hugging Face ``GPT2LMHeadModel`` checkpoints, mapped onto our GPT decoder.

The directory layout is that of :mod:`.huggingface` (``config.json``, ``model.safetensors``
or a sharded index, ``tokenizer.json``, optional ``tokenizer_config.json``). GPT-2 is the
GPT decoder of docs/ARCHITECTURE.md, 'The decoder', with three differences, each carried by a
:class:`TransformerConfig` field:

* the FFN's GELU is the tanh approximation (``activation_function`` ``gelu_new``,
  ``gelu_fast`` or ``gelu_pytorch_tanh``) -> ``feed_forward_activation="gelu_tanh"``;
  ``gelu`` (exact erf) and ``relu`` map to ours too;
* the head is tied to the token embedding and has no bias (``tie_word_embeddings``, true by
  default) -> ``tie_embeddings=True``. An untied checkpoint's ``lm_head.weight`` loads into
  our head, whose bias is then zero (GPT-2's head has none);
* projections are ``Conv1D`` modules, ``y = x·W + b`` with ``W`` stored ``[in, out]``: each
  is transposed to our ``[out, in]``, and the fused ``c_attn`` ``[D, 3D]`` is split into
  query, key and value (columns ``0:D``, ``D:2D``, ``2D:3D``; its bias likewise).

Names (a ``transformer.`` prefix is optional: ``GPT2Model`` checkpoints have none)::

    wte.weight                     token_embedding.weight
    wpe.weight                     position_embedding.weight (first maximum_context rows)
    h.N.ln_1.{weight,bias}         blocks.N.attention_norm.{scale,bias}
    h.N.attn.c_attn.{weight,bias}  blocks.N.attention.{query,key,value}.{weight,bias}
    h.N.attn.c_proj.{weight,bias}  blocks.N.attention.output.{weight,bias}
    h.N.ln_2.{weight,bias}         blocks.N.feed_forward_norm.{scale,bias}
    h.N.mlp.c_fc.{weight,bias}     blocks.N.feed_forward.expand.{weight,bias}
    h.N.mlp.c_proj.{weight,bias}   blocks.N.feed_forward.project.{weight,bias}
    ln_f.{weight,bias}             final_norm.{scale,bias}
    lm_head.weight                 language_model_head.weight (untied), or the embedding again

The causal-mask buffers ``h.N.attn.bias`` and ``h.N.attn.masked_bias`` are ignored. Values
load exactly (F32, F16 or BF16 widened by the native library). Config keys this decoder
cannot honour (``scale_attn_weights`` false, ``scale_attn_by_inverse_layer_idx``,
``add_cross_attention``, another activation) are a ValueError naming the key; so is a
``maximum_context`` beyond ``n_positions`` (positions are a learned table). As for the
rotary families, the config is checked against the safetensors headers before the model is
made: ``n_layer`` equal to the layers the tensors hold, every tensor present with the shape
``vocab_size``, ``n_positions``, ``n_embd`` and ``n_inner`` imply, nothing unexpected (a
ValueError naming the file, the field and both values).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..native._validation import UINT64_LIMIT, require_int
from ..native.llama import checkpoint_tensor_name
from ..native.model import DecoderOnlyTransformer, TransformerConfig
from ..native.parameters import BYTE_DTYPES
from .huggingface import (
    CONFIG_FILE,
    TensorSpan,
    _Dimension,
    _mapped,
    _positive_float,
    _positive_int,
    _require_layer_count,
    _require_shape,
    _require_tied_head,
    _tokenizer_and_template,
    _weights_source,
    read_checkpoint_tensors,
)
from .safetensors import _describe, _fail, _json_type

ARCHITECTURE = "GPT2LMHeadModel"

# transformers' ACT2FN names -> ours. gelu_new, gelu_fast and gelu_pytorch_tanh are the same
# function, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), written three ways.
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}

_DEFAULT_LAYER_NORM_EPSILON = 1e-5  # GPT2Config's
_PREFIX = "transformer."
# The attention modules' causal-mask buffers, which some checkpoints carry.
_IGNORED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
# A layer's tensor (after the optional prefix): its index, and its name within the layer.
_LAYER = re.compile(r"h\.(0|[1-9][0-9]{0,17})\.(.+)")
# A block's parameters, our names inside the block; the checkpoint's names are the library's
# architecture table's (rt_checkpoint_tensor_name), shared with every other importer.
_BLOCK_PARAMETERS = tuple(f"{module}.{kind}" for module, kinds in (
    ("attention_norm", ("scale", "bias")),
    ("attention.query", ("weight", "bias")),
    ("attention.key", ("weight", "bias")),
    ("attention.value", ("weight", "bias")),
    ("attention.output", ("weight", "bias")),
    ("feed_forward_norm", ("scale", "bias")),
    ("feed_forward.expand", ("weight", "bias")),
    ("feed_forward.project", ("weight", "bias"))) for kind in kinds)


def _name(parameter: str) -> tuple[str, int | None]:
    """GPT2LMHeadModel's tensor (without the optional prefix) holding our ``parameter``, and
    its part of ``c_attn`` (q, k, v) where it is one."""
    return checkpoint_tensor_name("gpt2", "huggingface", parameter)


def read_gpt2_config(
    document: Mapping, source: str, maximum_context: int | None = None
) -> TransformerConfig:
    """A ``GPT2LMHeadModel`` ``config.json`` (already parsed) as our decoder's config.

    ``maximum_context`` (a positive int <= ``n_positions``) shortens the position table; None
    keeps ``n_positions``. ValueError naming the key otherwise.
    """
    width = _positive_int(document, "n_embd", source)
    heads = _positive_int(document, "n_head", source)
    if width % heads != 0:
        _fail(source, f"n_embd {width} is not a multiple of n_head {heads}")
    positions = _positive_int(document, "n_positions", source)
    context = positions
    if maximum_context is not None:
        context = require_int(maximum_context, "maximum_context", 1, UINT64_LIMIT)
        if context > positions:
            raise ValueError(f"{source}: maximum_context {context} exceeds n_positions "
                             f"{positions} (GPT-2 learns one embedding per position)")
    activation = document.get("activation_function", "gelu_new")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        _fail(source, f"activation_function {_describe(activation)} is not supported (one of "
                      f"{', '.join(ACTIVATIONS)})")
    for key, supported in (("scale_attn_weights", True),
                           ("scale_attn_by_inverse_layer_idx", False),
                           ("add_cross_attention", False)):
        value = document.get(key, supported)
        if value is not supported:
            shown = json.dumps(value) if isinstance(value, bool) or value is None else \
                _describe(value)
            _fail(source, f"{key} {shown} is not supported (only {json.dumps(supported)})")
    tied = document.get("tie_word_embeddings", True)
    if not isinstance(tied, bool):
        _fail(source, f"tie_word_embeddings must be true or false, not {_json_type(tied)}")
    inner = _positive_int(document, "n_inner", source, default=4 * width)
    return TransformerConfig(
        vocabulary_size=_positive_int(document, "vocab_size", source),
        maximum_context=context,
        model_width=width,
        head_count=heads,
        block_count=_positive_int(document, "n_layer", source),
        feed_forward_width=inner,
        layer_norm_epsilon=_positive_float(document, "layer_norm_epsilon", source,
                                           _DEFAULT_LAYER_NORM_EPSILON),
        feed_forward_activation=ACTIVATIONS[activation],
        tie_embeddings=tied,
    )


# ---- one recipe per parameter: which tensor, and which part of it, transposed or not


class _Part:
    """How one of our parameters is read from a checkpoint tensor: its whole bytes, a prefix
    of rows, a range of elements (bias slices), a range of columns transposed (Conv1D), or
    zeros (an untied head's bias)."""

    def __init__(self, span: TensorSpan | None, kind: str, begin: int = 0, end: int = 0):
        self.span, self.kind, self.begin, self.end = span, kind, begin, end

    def dtype(self) -> str:
        return self.span.dtype if self.span is not None else "F32"

    def read(self, view: memoryview | None, count: int) -> bytes | memoryview:
        if self.kind == "zeros":
            return bytes(4 * count)
        span = self.span
        size = BYTE_DTYPES[span.dtype][1]
        data = view[span.begin:span.end]
        if self.kind == "whole":
            return data
        if self.kind == "elements":  # [begin, end) of a flat tensor, or a prefix of rows
            return data[self.begin * size:self.end * size]
        # "columns": columns [begin, end) of a row-major [rows, columns] matrix, transposed to
        # [end - begin, rows]. Each output row is one strided column, copied at C speed.
        columns = span.shape[1]
        flat = data.cast("I" if size == 4 else "H")
        return b"".join(flat[column::columns].tobytes()
                        for column in range(self.begin, self.end))


def _recipes(config: TransformerConfig, positions: int, tensors: dict[str, TensorSpan],
             config_source: str, weights_source: Path) -> dict[str, _Part]:
    """Our parameter name -> its _Part, every checkpoint tensor checked against the config
    before any model exists: ``n_layer`` equal to the layers present, each tensor present
    with the exact shape the config implies, nothing unexpected."""
    by_name: dict[str, TensorSpan] = {}
    for name, span in tensors.items():
        short = name[len(_PREFIX):] if name.startswith(_PREFIX) else name
        if short in by_name:
            _fail(str(span.path), f"tensor {_describe(name)} appears with and without the "
                                  f"{_PREFIX!r} prefix")
        by_name[short] = span
    block_names = {_name(f"blocks.0.{local}")[0].split(".", 2)[2] for local in _BLOCK_PARAMETERS}
    _require_layer_count(by_name, _LAYER, block_names, "n_layer", config.block_count,
                         config_source, weights_source)
    embedding_name = _name("token_embedding.weight")[0]
    head_name = _name("language_model_head.weight")[0]
    d = _Dimension(config.model_width, "n_embd")
    f = _Dimension(config.feed_forward_width,
                   "n_inner" if config.feed_forward_width != 4 * d.size else "n_inner (4 * n_embd)")
    v = _Dimension(config.vocabulary_size, "vocab_size")
    fused = _Dimension(3 * d.size, "3 * n_embd")

    used: set[str] = set()

    def tensor(name: str, *dimensions: _Dimension) -> TensorSpan:
        span = by_name.get(name)
        if span is None:
            _fail(str(weights_source), f"the checkpoint has no tensor {name!r} "
                                       f"(nor {_PREFIX + name!r})")
        _require_shape(span, dimensions, config_source)
        used.add(name)
        return span

    recipes: dict[str, _Part] = {
        "token_embedding.weight": _Part(tensor(embedding_name, v, d), "whole"),
    }
    # The first maximum_context rows of the n_positions-row table.
    table = tensor(_name("position_embedding.weight")[0], _Dimension(positions, "n_positions"), d)
    recipes["position_embedding.weight"] = _Part(table, "elements", 0,
                                                  config.maximum_context * d.size)
    # Each matrix's [in, out] widths (Conv1D stores weights transposed) and its bias's width.
    widths = {"attention.query": (d, fused), "attention.key": (d, fused),
              "attention.value": (d, fused), "attention.output": (d, d),
              "feed_forward.expand": (d, f), "feed_forward.project": (f, d)}
    for block in range(config.block_count):
        ours = f"blocks.{block}."
        for local in _BLOCK_PARAMETERS:
            module, kind = local.rsplit(".", 1)
            name, part = _name(ours + local)
            if module.endswith("_norm"):
                recipes[ours + local] = _Part(tensor(name, d), "whole")
                continue
            width_in, width_out = widths[module]
            # q, k and v are parts 0, 1, 2 of c_attn: a third of its columns (or elements).
            begin, end = (0, width_out.size) if part is None else (part * d.size,
                                                                   (part + 1) * d.size)
            if kind == "weight":
                recipes[ours + local] = _Part(tensor(name, width_in, width_out), "columns",
                                              begin, end)
            else:
                span = tensor(name, width_out)
                recipes[ours + local] = (_Part(span, "whole") if part is None
                                         else _Part(span, "elements", begin, end))
    recipes["final_norm.scale"] = _Part(tensor(_name("final_norm.scale")[0], d), "whole")
    recipes["final_norm.bias"] = _Part(tensor(_name("final_norm.bias")[0], d), "whole")
    if config.tie_embeddings:
        head = by_name.get(head_name)
        if head is not None:
            _require_tied_head(head, by_name[embedding_name], head_name, embedding_name)
            used.add(head_name)
    else:
        recipes["language_model_head.weight"] = _Part(tensor(head_name, v, d), "whole")
        recipes["language_model_head.bias"] = _Part(None, "zeros")
    for name, span in by_name.items():
        if name not in used and not _IGNORED.fullmatch(name):
            _fail(str(span.path), f"unexpected tensor {_describe(span.name)} (not a parameter "
                                  f"of a {'tied ' if config.tie_embeddings else ''}GPT-2 model)")
    return recipes


def _load_weights(model: DecoderOnlyTransformer, recipes: dict[str, _Part],
                  source: str) -> None:
    with model.parameters() as parameters:
        names, shapes = parameters.names, parameters.shapes
        if set(names) != set(recipes):
            raise ValueError(f"{source}: the model's parameters {sorted(set(names) ^ set(recipes))}"
                             " have no recipe")  # a mapping defect, not a checkpoint fault
        by_file: dict[Path | None, list[int]] = {}
        for index, name in enumerate(names):
            span = recipes[name].span
            by_file.setdefault(span.path if span is not None else None, []).append(index)
        for path, indices in by_file.items():
            if path is None:
                for index in indices:
                    count = 1
                    for dimension in shapes[index]:
                        count *= dimension
                    parameters.load_from_bytes(
                        index, "F32", recipes[names[index]].read(None, count)
                    )
                continue
            with _mapped(path) as view:
                for index in indices:
                    part = recipes[names[index]]
                    if len(view) < part.span.end:
                        raise ValueError(f"{path}: the file shrank while it was being read")
                    count = 1
                    for dimension in shapes[index]:
                        count *= dimension
                    parameters.load_from_bytes(index, part.dtype(), part.read(view, count))


def load_gpt2(directory: str | os.PathLike, document: Mapping,
              maximum_context: int | None = None):
    """The GPT-2 checkpoint in ``directory`` (``document`` its parsed ``config.json``) as a
    PretrainedModel with architecture ``"gpt"``; see the module docstring."""
    from ..pretrained import PretrainedModel
    from ..serving.chat import PlainChatTemplate

    directory = Path(directory)
    config_source = str(directory / CONFIG_FILE)
    config = read_gpt2_config(document, config_source, maximum_context)
    positions = document["n_positions"]  # checked by read_gpt2_config
    tensors = read_checkpoint_tensors(directory)
    # Every tensor checked against the config before the model is made.
    recipes = _recipes(config, positions, tensors, config_source, _weights_source(directory))
    model = DecoderOnlyTransformer(config, attention="flash")
    try:
        _load_weights(model, recipes, str(directory))
        tokenizer, template = _tokenizer_and_template(directory, dict(document),
                                                      config.vocabulary_size, default=None)
    except BaseException:
        model.close()
        raise
    if template is None:  # GPT-2 has no chat template: plain "role: content" turns
        template = PlainChatTemplate()
    return PretrainedModel(model, tokenizer, template, "gpt", str(directory))


__all__ = ["ACTIVATIONS", "ARCHITECTURE", "load_gpt2", "read_gpt2_config"]
