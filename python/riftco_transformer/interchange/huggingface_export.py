"""Rotary-family models to Hugging Face checkpoint directories, as transformers saves them.

:func:`export_huggingface` writes a ``.rift`` bundle of a :class:`LlamaMistralTransformer`
(Llama, Mistral, Qwen 2, Qwen 3, Gemma 2, Gemma 3 text, Phi-3), or a loaded
:class:`PretrainedModel` of one, as a directory that transformers' ``AutoModelForCausalLM`` and
``tokenizers`` read: it is the inverse of our importer (:mod:`.huggingface`), so
``load_huggingface`` (or ``load_pretrained``) of the directory gives the same logits and the
same token ids.

What is written:

* ``config.json``: ``architectures`` and ``model_type`` of the family (``Gemma3ForCausalLM``
  as ``gemma3_text``), the dimensions, ``head_dim``, ``rms_norm_eps``, ``rope_theta`` and
  ``rope_scaling`` (linear, llama3 or yarn, by ``rope_type``; transformers 4.x keys, which
  transformers 5 standardizes), ``max_position_embeddings`` (the model's context),
  ``tie_word_embeddings``, ``sliding_window`` (Mistral, Phi-3, Gemma; Qwen's
  ``use_sliding_window`` false), Gemma's ``layer_types``, soft caps and
  ``query_pre_attn_scalar`` (Gemma 3 also ``rope_local_base_freq``), ``torch_dtype`` and the
  bos/eos ids. Qwen 2's q/k/v biases are implied by the family (its config has no key);
* ``model.safetensors``: every parameter under its Hugging Face name (the library's
  architecture table, :func:`~.huggingface.huggingface_name`), Phi-3's ``qkv_proj`` and
  ``gate_up_proj`` fused in the importer's row order (q, k, v; gate, up), no ``lm_head`` when
  the embeddings are tied, Gemma's norm weights as the w of their (1 + w) form, which is what
  our parameters hold and what Hugging Face checkpoints store. ``dtype="f32"`` is exact;
  ``"bf16"`` and ``"f16"`` round every tensor to nearest even (a finite value beyond the
  format's range is a ValueError, as transformers would store an infinity);
* ``generation_config.json`` (bos/eos ids);
* ``tokenizer.json`` (a byte-level BPE: ``model.vocab`` with every token, the merges in rank
  order, ``ignore_merges``, the pre-tokenizer our tokenizer runs: GPT-2's ByteLevel regex,
  SmolLM's Digits + ByteLevel, Llama 3's or Qwen 2's Split regex + ByteLevel; control tokens
  as special ``added_tokens``, user-defined ones as non-special; a ByteLevel decoder; no
  normalizer and no post-processor, as our encoder adds no token of its own) and
  ``tokenizer_config.json`` (bos/eos/unk token texts, ``chat_template`` when the model has
  one).

What is refused, before anything is written (ValueError naming it):

* the GPT decoder (``riftco_decoder_v1``) and the GPT-2 preset (this exporter writes the
  rotary families; GPT-2 directories are another layout);
* a tokenizer of our own training (byte or BPE: a Hugging Face directory needs a pretrained
  vocabulary) and a SentencePiece-style one (``sentencepiece_bpe``: tokenizers' BPE would need
  merges derived from the scores, which this exporter does not yet write exactly);
* a byte-level vocabulary whose read-back differs: token types other than normal, control and
  user-defined (tokenizer.json has no unknown, unused or byte tokens in a byte-level BPE);
* any config field that config.json cannot express: the document is built, read back by the
  importer's own rules (``_config_from_document``) and compared field by field with the
  model's config (Llama 3 scaling kept as GGUF's frequency factors, a window on Llama or Qwen,
  an attention scale outside Gemma, a flag a family does not have, ...).

Bundles hold merged, dense weights (capture refuses LoRA adapters and packed NF4 weights).
The files are written into a temporary sibling directory renamed to ``directory`` at the end,
so a failure leaves nothing behind; an existing ``directory`` must be empty.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import struct
import sys
from array import array
from dataclasses import fields
from pathlib import Path

from ..artifacts import ModelBundle
from ..native import LlamaMistralConfig
from ..native.llama import checkpoint_tensor_name
from ..native.pretrained_tokenizer import _SPLIT_PATTERNS, TOKEN_TYPE_VALUES, PretrainedTokenizer
from .gguf_export import _ROPE_FIELDS, require_family, rotary_bundle
from .huggingface import (
    CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    _config_from_document,
    _fused_rows,
)

__all__ = ["HUGGINGFACE_DTYPES", "export_huggingface", "huggingface_config_document"]

GENERATION_CONFIG_FILE = "generation_config.json"
# dtype -> (safetensors dtype, config.json torch_dtype, bytes per value)
HUGGINGFACE_DTYPES = {"f32": ("F32", "float32", 4), "bf16": ("BF16", "bfloat16", 2),
                      "f16": ("F16", "float16", 2)}

# Each family's config.json: architectures entry and model_type.
_FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
}
_GEMMA = ("gemma2", "gemma3")
# Families whose config.json has a sliding_window the importer (and transformers) read.
_WINDOWED = ("mistral", "phi3", "gemma2", "gemma3")
_QWEN = ("qwen2", "qwen3")

# The Split regex of each pre-tokenizer that tokenizer.json spells with one (the importer's
# table, inverted: the same strings are recognised on the way back).
_SPLIT_REGEX = {name: regex for regex, name in _SPLIT_PATTERNS.items()}
_BYTE_LEVEL_TYPES = {TOKEN_TYPE_VALUES["normal"], TOKEN_TYPE_VALUES["control"],
                     TOKEN_TYPE_VALUES["user_defined"]}

_CHUNK = 1 << 16  # values converted per step


def _f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


# ---- config.json ----------------------------------------------------------------------------


def _rope_scaling(config: LlamaMistralConfig) -> dict | None:
    kind = config.rope_scaling
    if kind == "none":
        return None
    if kind == "frequency_factors":
        raise ValueError("rope_scaling='frequency_factors' (a GGUF file's rope_freqs.weight) "
                         "cannot be written to config.json, which names a scaling rule "
                         "(linear, llama3, yarn), not the factors")
    scaling = {"rope_type": kind, "factor": config.rope_scaling_factor}
    if kind == "llama3":
        scaling.update(low_freq_factor=config.rope_low_frequency_factor,
                       high_freq_factor=config.rope_high_frequency_factor,
                       original_max_position_embeddings=config.rope_original_context)
    elif kind == "yarn":
        scaling.update(original_max_position_embeddings=config.rope_original_context,
                       beta_fast=config.rope_yarn_beta_fast,
                       beta_slow=config.rope_yarn_beta_slow)
        if config.rope_yarn_attention_factor != 0.0:  # 0: the default 0.1·ln(factor) + 1
            scaling["attention_factor"] = config.rope_yarn_attention_factor
    return scaling


def huggingface_config_document(config: LlamaMistralConfig, dtype: str = "f32",
                                bos_id: int | None = None,
                                eos_id: int | None = None) -> dict:
    """The ``config.json`` document of a model of ``config`` (no check that it reads back:
    :func:`export_huggingface` does that). ValueError for an architecture without one."""
    require_family(config, "Hugging Face", _FAMILIES)
    architecture = config.architecture
    if dtype not in HUGGINGFACE_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(HUGGINGFACE_DTYPES)} (got {dtype!r})")
    class_name, model_type = _FAMILIES[architecture]
    document = {
        "architectures": [class_name],
        "model_type": model_type,
        "vocab_size": config.vocabulary_size,
        "hidden_size": config.model_width,
        "intermediate_size": config.feed_forward_width,
        "num_hidden_layers": config.block_count,
        "num_attention_heads": config.query_head_count,
        "num_key_value_heads": config.key_value_head_count,
        "head_dim": config.resolved_head_width,
        "max_position_embeddings": config.maximum_context,
        "rms_norm_eps": config.rms_norm_epsilon,
        "rope_theta": config.rope_theta,
        "rope_scaling": _rope_scaling(config),
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "torch_dtype": HUGGINGFACE_DTYPES[dtype][1],
        "use_cache": True,
    }
    if architecture in _GEMMA:
        document["hidden_activation"] = "gelu_pytorch_tanh"
    else:
        document["hidden_act"] = "silu"
    if architecture in ("llama", "mistral", "qwen3"):
        document["attention_bias"] = False
    if architecture == "llama":
        document["mlp_bias"] = False
    if architecture in _WINDOWED:
        document["sliding_window"] = config.sliding_window
    elif architecture in _QWEN:
        document.update(use_sliding_window=False, sliding_window=None)
    if architecture in _GEMMA:
        period = config.sliding_window_period
        blocks = config.block_count
        document["layer_types"] = [
            "sliding_attention" if period and (index + 1) % period else "full_attention"
            for index in range(blocks)]
        scale = config.attention_scale
        document["query_pre_attn_scalar"] = (config.resolved_head_width if scale == 0.0
                                             else scale ** -2)
        document["attn_logit_softcapping"] = config.attention_logit_softcap or None
        document["final_logit_softcapping"] = config.final_logit_softcap or None
    if architecture == "gemma3":
        document["rope_local_base_freq"] = config.rope_local_theta
        if config.sliding_window_period:
            document["sliding_window_pattern"] = config.sliding_window_period
    return document


def _inexpressible(config: LlamaMistralConfig, read: LlamaMistralConfig) -> list[str]:
    """The fields of ``config`` that config.json would not give back (``read``), as text."""
    problems = []
    for field in fields(LlamaMistralConfig):
        name = field.name
        ours, theirs = getattr(config, name), getattr(read, name)
        if name == "random_seed":
            continue  # the seed only drew the initial weights
        if name == "head_width":
            ours, theirs = config.resolved_head_width, read.resolved_head_width
        elif name in _ROPE_FIELDS and config.rope_scaling not in _ROPE_FIELDS[name]:
            continue  # a field the model's RoPE does not read
        elif name == "attention_scale":
            # query_pre_attn_scalar s gives s**-0.5, computed: equal as the library's float32
            ours, theirs = _f32(ours), _f32(theirs)
        if ours != theirs:
            problems.append(f"{name}={getattr(config, name)!r} (config.json would give "
                            f"{getattr(read, name)!r})")
    return problems


# ---- tokenizer.json -------------------------------------------------------------------------


def _byte_level_pre_tokenizer(pretokenizer: str) -> dict:
    def byte_level(use_regex: bool) -> dict:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": use_regex}

    if pretokenizer == "gpt2":
        return byte_level(True)
    if pretokenizer == "smollm":
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level(True)]}
    if pretokenizer in _SPLIT_REGEX:
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": _SPLIT_REGEX[pretokenizer]},
             "behavior": "Isolated", "invert": False},
            byte_level(False)]}
    raise ValueError(f"pre-tokenizer {pretokenizer!r} has no tokenizer.json form")


def _tokenizer_documents(state: dict, maximum_context: int) -> tuple[dict, dict]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of a bundle's tokenizer state,
    checked to read back (with the importer's own reader) to the same vocabulary, merges,
    token types, pre-tokenizer and ``ignore_merges``. ValueError for what they cannot hold."""
    method = state.get("method")
    if method != "pretrained":
        raise ValueError(f"the tokenizer is one of our own training ({method!r}), which a "
                         "Hugging Face directory cannot hold: export needs a pretrained "
                         "tokenizer (tokenizer.json is a byte-level BPE vocabulary)")
    if state["model"] != "byte_level_bpe":
        raise ValueError(f"the tokenizer model {state['model']!r} (SentencePiece-style BPE) is "
                         "not supported by the Hugging Face export: tokenizer.json would need "
                         "BPE merges derived from its scores, which this exporter does not "
                         "write exactly (only byte_level_bpe tokenizers are exported)")
    tokens = list(state["tokens"])
    types = list(state["token_types"]) or [TOKEN_TYPE_VALUES["normal"]] * len(tokens)
    strange = [(index, kind) for index, kind in enumerate(types) if kind not in _BYTE_LEVEL_TYPES]
    if strange:
        index, kind = strange[0]
        raise ValueError(f"token {index} ({tokens[index]!r}) has token type {kind}, which a "
                         "byte-level tokenizer.json cannot hold (only normal, control and "
                         f"user-defined tokens; {len(strange)} token(s) of other types)")
    pretokenizer = state["pretokenizer"] or "gpt2"
    added = [{"id": index, "content": tokens[index], "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False,
              "special": kind == TOKEN_TYPE_VALUES["control"]}
             for index, kind in enumerate(types) if kind != TOKEN_TYPE_VALUES["normal"]]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _byte_level_pre_tokenizer(pretokenizer),
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": bool(state["ignore_merges"]),
                  "vocab": {text: index for index, text in enumerate(tokens)},
                  "merges": list(state["merges"])},
    }
    if len(document["model"]["vocab"]) != len(tokens):
        raise ValueError("the tokenizer repeats a token text, which tokenizer.json's vocab (a "
                         "map from text to id) cannot hold")
    with PretrainedTokenizer.from_tokenizer_document(document, TOKENIZER_FILE) as read:
        back = read.state()
    for key in ("tokens", "merges", "token_types", "pretokenizer", "ignore_merges"):
        theirs = back[key]
        ours = {"token_types": types, "pretokenizer": pretokenizer,
                "ignore_merges": bool(state["ignore_merges"])}.get(key, state[key])
        if ours != theirs:
            raise ValueError(f"the tokenizer's {key} cannot be written to tokenizer.json: "
                             "the importer would read it back differently")
    settings = {"tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": maximum_context,
                "clean_up_tokenization_spaces": False}
    for key, field in (("bos_token", "bos_id"), ("eos_token", "eos_id"),
                       ("unk_token", "unknown_id")):
        if state[field] is not None:
            settings[key] = tokens[state[field]]
    if state.get("chat_template"):
        settings["chat_template"] = state["chat_template"]
    return document, settings


# ---- model.safetensors ----------------------------------------------------------------------


def _plan(bundle: ModelBundle, config: LlamaMistralConfig) -> list[tuple[str, tuple, list]]:
    """The checkpoint's tensors in order: ``(name, shape, parts)``, each part a bundle
    parameter; Phi-3's fused tensors list theirs in the importer's row order."""
    architecture = config.architecture
    plan, fused = [], {}
    for spec in bundle.parameters:
        name, part = checkpoint_tensor_name(architecture, "huggingface", spec.name)
        if part is None:
            plan.append((name, tuple(spec.shape), [spec]))
            continue
        first_row, rows = _fused_rows(config, spec.name, part)
        if tuple(spec.shape) != (rows, spec.shape[1]):
            raise AssertionError(f"{spec.name} has shape {spec.shape}, not {rows} rows")
        entry = fused.get(name)
        if entry is None:
            entry = fused[name] = [name, {}]
            plan.append(entry)
        entry[1][part] = (first_row, spec)
    result = []
    for entry in plan:
        if isinstance(entry, tuple):
            result.append(entry)
            continue
        name, parts = entry
        ordered = [parts[index] for index in sorted(parts)]
        row = 0
        for first_row, spec in ordered:
            if first_row != row:
                raise AssertionError(f"{name}: {spec.name} starts at row {first_row}, not {row}")
            row += spec.shape[0]
        columns = ordered[0][1].shape[1]
        result.append((name, (row, columns), [spec for _, spec in ordered]))
    return result


def _little_endian(values: array) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


def _bf16(values: array, name: str) -> bytes:
    """float32 ``values`` as bfloat16, rounded to nearest even (NaN stays a quiet NaN)."""
    bits = array("I")
    if bits.itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte "I"
        raise AssertionError("array('I') is not 32-bit")
    bits.frombytes(values.tobytes())
    rounded = array("H", [
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) if b & 0x7F800000 != 0x7F800000
        else (b >> 16) | (0x40 if b & 0x7FFFFF else 0)
        for b in bits])
    infinities = bits.count(0x7F800000) + bits.count(0xFF800000)
    if rounded.count(0x7F80) + rounded.count(0xFF80) != infinities:
        largest = max(abs(value) for value in values if math.isfinite(value))
        raise ValueError(f"tensor {name!r} has a value of magnitude {largest:g}, which rounds "
                         "to an infinity in bfloat16: export it as f32")
    return _little_endian(rounded)


def _f16(values: array, name: str) -> bytes:
    try:  # in chunks: struct.pack takes the values as arguments
        return b"".join(struct.pack(f"<{len(chunk)}e", *chunk) for chunk in (
            values[start:start + _CHUNK] for start in range(0, len(values), _CHUNK)))
    except (OverflowError, struct.error):
        largest = max(abs(value) for value in values if math.isfinite(value))
        raise ValueError(f"tensor {name!r} has a value of magnitude {largest:g}, beyond "
                         "float16's range (65504): export it as f32") from None


def _tensor_bytes(values: array, dtype: str, name: str) -> bytes:
    if dtype == "f32":
        return _little_endian(values)
    converted = []
    for start in range(0, len(values), _CHUNK):
        chunk = values[start:start + _CHUNK]
        converted.append(_bf16(chunk, name) if dtype == "bf16" else _f16(chunk, name))
    return b"".join(converted)


def _write_safetensors(path: Path, bundle: ModelBundle, plan, dtype: str) -> None:
    safetensors_dtype, _, size = HUGGINGFACE_DTYPES[dtype]
    header, offset = {}, 0
    for name, shape, _ in plan:
        end = offset + math.prod(shape) * size
        header[name] = {"dtype": safetensors_dtype, "shape": list(shape),
                        "data_offsets": [offset, end]}
        offset = end
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    weights = bundle._weights
    with open(path, "wb") as stream:
        stream.write(len(encoded).to_bytes(8, "little"))
        stream.write(encoded)
        for name, _, parts in plan:
            for spec in parts:  # a fused tensor's parts are consecutive rows
                values = weights[spec.offset:spec.offset + spec.count]
                stream.write(_tensor_bytes(values, dtype, name))
        stream.flush()
        os.fsync(stream.fileno())


def _write_json(path: Path, document: dict) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2, ensure_ascii=False)
        stream.write("\n")


# ---- the entry point ------------------------------------------------------------------------


def _require_free(destination: Path, what: str = "Hugging Face export") -> None:
    if destination.exists() or destination.is_symlink():
        if not destination.is_dir() or destination.is_symlink():
            raise ValueError(f"{destination} exists and is not a directory")
        if any(destination.iterdir()):
            raise ValueError(f"{destination} exists and is not empty: {what} writes a new "
                             "directory")


def write_directory(destination: Path, fill, what: str) -> Path:
    """Publish the directory ``fill(temporary)`` writes as ``destination``: the files go into
    a temporary sibling directory renamed to ``destination`` at the end, so a failure leaves
    nothing behind; an existing ``destination`` must be an empty directory (ValueError naming
    ``what`` writes it otherwise). Returns ``destination``."""
    _require_free(destination, what)
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = destination.parent / (f".{destination.name}.{os.getpid()}."
                                      f"{secrets.token_hex(6)}.partial")
    temporary.mkdir()  # the umask's permissions, as any new directory
    try:
        fill(temporary)
        _require_free(destination, what)
        if destination.exists():
            destination.rmdir()  # empty: checked just above
        os.rename(temporary, destination)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return destination


def export_huggingface(source, directory, dtype: str = "f32") -> Path:
    """Write ``source`` (a :class:`ModelBundle`, a ``.rift`` path or a loaded
    :class:`PretrainedModel` of a rotary family) as the Hugging Face checkpoint directory
    ``directory`` (created; an existing one must be empty); see the module docstring.
    ``dtype`` is ``"f32"`` (exact), ``"bf16"`` or ``"f16"`` (rounded to nearest even).
    Returns the directory's path. ValueError for what the directory cannot express, before
    anything is written; any later failure removes what was written."""
    if dtype not in HUGGINGFACE_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(HUGGINGFACE_DTYPES)} (got {dtype!r})")
    destination = Path(os.fspath(directory))
    _require_free(destination)
    bundle = rotary_bundle(source, "Hugging Face", _FAMILIES)
    config = bundle.config
    state = bundle.tokenizer_state
    tokenizer_document, settings = _tokenizer_documents(state, config.maximum_context)
    document = huggingface_config_document(config, dtype, state.get("bos_id"),
                                           state.get("eos_id"))
    # The read-back: what the importer (and, by its rules, transformers) makes of the file.
    read = _config_from_document(json.loads(json.dumps(document)), CONFIG_FILE, None)
    problems = _inexpressible(config, read)
    if problems:
        raise ValueError(f"this {config.architecture} model cannot be written as a Hugging "
                         "Face config.json, whose readers would give it another config: "
                         + "; ".join(problems))
    plan = _plan(bundle, config)
    generation = {"_from_model_config": True}
    for key, field in (("bos_token_id", "bos_id"), ("eos_token_id", "eos_id")):
        if state.get(field) is not None:
            generation[key] = state[field]

    def fill(temporary: Path) -> None:
        _write_json(temporary / CONFIG_FILE, document)
        _write_json(temporary / GENERATION_CONFIG_FILE, generation)
        _write_json(temporary / TOKENIZER_FILE, tokenizer_document)
        _write_json(temporary / TOKENIZER_CONFIG_FILE, settings)
        _write_safetensors(temporary / WEIGHTS_FILE, bundle, plan, dtype)

    return write_directory(destination, fill, "Hugging Face export")
