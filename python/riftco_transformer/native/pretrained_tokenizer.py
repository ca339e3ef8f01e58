"""Tokenizers of pretrained models: GPT-2-style byte-level BPE and SentencePiece-style BPE.

Built from a GGUF file's metadata (:meth:`PretrainedTokenizer.from_gguf`), a Hugging Face
``tokenizer.json`` (:meth:`PretrainedTokenizer.from_tokenizer_json`; parsed here with the
standard library) or plain arrays (:meth:`PretrainedTokenizer.from_vocabulary`). Encoding and
decoding run in the native library.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from array import array
from collections.abc import Sequence

from ._abi import STATUS_OUT_OF_RANGE, PretrainedTokenizerInfoStruct, PretrainedVocabularyStruct
from ._buffers import UINT32_TYPECODE, read_sized
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._validation import UINT32_LIMIT, require_int

MODEL_VALUES = {"byte_level_bpe": 0, "sentencepiece_bpe": 1}
PRETOKENIZER_VALUES = {"gpt2": 0, "llama3": 1, "smollm": 2, "qwen2": 3}
SPECIAL_PARSE = 0
SPECIAL_AS_TEXT = 1
TOKEN_TYPE_VALUES = {"normal": 1, "unknown": 2, "control": 3, "user_defined": 4, "unused": 5,
                     "byte": 6}

# The regexes of the Split pre-tokenizers tokenizer.json files use before ByteLevel: Llama 3's,
# and Qwen 2's (the same with single digits).
_SPLIT_PATTERNS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama3",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}


def _adds_dummy_prefix(document: dict, pre_tokenizers: list) -> bool:
    """Whether a SentencePiece-style tokenizer.json puts "\u2581" before the text: a Prepend
    normalizer (Llama 2, Mistral), or an older file's Metaspace pre-tokenizer that adds a
    prefix space. Gemma's only replaces spaces: no prefix."""
    normalizer = document.get("normalizer") or {}
    steps = (normalizer.get("normalizers") or []) if normalizer.get("type") == "Sequence" \
        else [normalizer]
    if any(step.get("type") == "Prepend" for step in steps):
        return True
    return any(p.get("type") == "Metaspace" and (p.get("add_prefix_space") is True or
                                                 p.get("prepend_scheme") in ("always", "first"))
               for p in pre_tokenizers)


def _path_bytes(path) -> bytes:
    encoded = os.fsencode(os.fspath(path))
    if b"\0" in encoded:
        raise ValueError(f"path must not contain NUL bytes (got {path!r})")
    return encoded


def _packed(strings: Sequence[str], name: str):
    """UTF-8 strings packed end to end, with count + 1 offsets."""
    blobs = []
    offsets = array("Q", [0])
    total = 0
    for index, text in enumerate(strings):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] must be a str, not {type(text).__name__}")
        blob = text.encode("utf-8")
        blobs.append(blob)
        total += len(blob)
        offsets.append(total)
    data = b"".join(blobs)
    return (ctypes.c_uint8 * max(1, len(data))).from_buffer_copy(data or b"\0"), offsets


def _unpack_strings(data: bytes) -> list[str]:
    """Strings each stored as a little-endian uint32 byte length, then the UTF-8 bytes."""
    strings = []
    offset = 0
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 4], "little")
        strings.append(data[offset + 4:offset + 4 + length].decode("utf-8"))
        offset += 4 + length
    return strings


def _array_pointer(values: array, ctype):
    address, _ = values.buffer_info()
    return ctypes.cast(address, ctypes.POINTER(ctype))


class PretrainedTokenizer(NativeHandle):
    """A pretrained model's tokenizer.

    ``encode(text)`` -> ids (special tokens in the text become their ids unless
    ``special=False``), ``decode(ids)`` -> str (invalid UTF-8 replaced), ``decode_bytes(ids)``
    -> bytes, ``token_bytes(id)``; ``vocabulary_size``, ``bos_id``, ``eos_id``,
    ``unknown_id`` (None when absent). ``encode_bytes``/``decode_bytes`` make it usable by
    the serving package's generators.
    """

    _release_function = "rt_pretrained_tokenizer_release"

    def _adopt_native(self, pointer: int) -> PretrainedTokenizer:
        self._adopt(pointer, threading.RLock())
        size = ctypes.c_uint64()
        bos, eos, unknown = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        with self._native() as handle:
            native = library()
            check_status(native.rt_pretrained_tokenizer_vocabulary_size(handle, ctypes.byref(size)))
            check_status(native.rt_pretrained_tokenizer_special_ids(
                handle, ctypes.byref(bos), ctypes.byref(eos), ctypes.byref(unknown)))
        self._size = size.value
        self._special = tuple(None if v.value < 0 else v.value for v in (bos, eos, unknown))
        return self

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> PretrainedTokenizer:
        """The tokenizer in a GGUF file's metadata (``tokenizer.ggml.*``)."""
        pointer = ctypes.c_void_p()
        check_status(
            library().rt_pretrained_tokenizer_load_gguf(_path_bytes(path), ctypes.byref(pointer))
        )
        return cls.__new__(cls)._adopt_native(pointer.value)

    @classmethod
    def from_vocabulary(
        cls,
        tokens: Sequence[str],
        *,
        model: str = "byte_level_bpe",
        pretokenizer: str = "gpt2",
        merges: Sequence[str] = (),
        token_types: Sequence[int] | None = None,
        scores: Sequence[float] | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        unknown_id: int | None = None,
        ignore_merges: bool = False,
        add_dummy_prefix: bool = True,
    ) -> PretrainedTokenizer:
        """A tokenizer from plain data: ``tokens[id]`` strings (byte-level alphabet for
        byte-level BPE, ``▁`` for spaces in SentencePiece), ``merges`` as ``"left right"``
        strings in rank order, ``token_types`` (GGUF values: 1 normal, 2 unknown, 3 control,
        4 user-defined, 5 unused, 6 byte) and ``scores`` (SentencePiece)."""
        if model not in MODEL_VALUES:
            raise ValueError(f"model must be one of {', '.join(MODEL_VALUES)} (got {model!r})")
        if pretokenizer not in PRETOKENIZER_VALUES:
            raise ValueError(
                f"pretokenizer must be one of {', '.join(PRETOKENIZER_VALUES)} (got {pretokenizer!r})"
            )
        token_blob, token_offsets = _packed(tokens, "tokens")
        merge_blob, merge_offsets = _packed(merges, "merges")
        native = PretrainedVocabularyStruct()
        native.struct_size = ctypes.sizeof(native)
        native.model = MODEL_VALUES[model]
        native.pretokenizer = PRETOKENIZER_VALUES[pretokenizer]
        native.token_count = len(tokens)
        native.token_bytes = token_blob
        native.token_offsets = _array_pointer(token_offsets, ctypes.c_uint64)
        keep = []
        if token_types is not None:
            types = array("i", [require_int(t, "token_types", 0, 255) for t in token_types])
            if len(types) != len(tokens):
                raise ValueError(f"token_types has {len(types)} entries for {len(tokens)} tokens")
            native.token_types = _array_pointer(types, ctypes.c_int32)
            keep.append(types)
        if scores is not None:
            values = array("f", scores)
            if len(values) != len(tokens):
                raise ValueError(f"scores has {len(values)} entries for {len(tokens)} tokens")
            native.scores = _array_pointer(values, ctypes.c_float)
            keep.append(values)
        native.merge_count = len(merges)
        native.merge_bytes = merge_blob
        native.merge_offsets = _array_pointer(merge_offsets, ctypes.c_uint64)
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("unknown_id", unknown_id)):
            setattr(native, name, -1 if value is None else require_int(value, name, 0, UINT32_LIMIT))
        native.ignore_merges = 1 if ignore_merges else 0
        native.add_dummy_prefix = 1 if add_dummy_prefix else 0
        pointer = ctypes.c_void_p()
        check_status(library().rt_pretrained_tokenizer_create(ctypes.byref(native),
                                                               ctypes.byref(pointer)))
        del keep
        return cls.__new__(cls)._adopt_native(pointer.value)

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike) -> PretrainedTokenizer:
        """A Hugging Face ``tokenizer.json`` with a BPE model: byte-level (GPT-2, Llama 3,
        SmolLM pre-tokenizers) or SentencePiece-style (byte fallback, ``▁`` for spaces).
        Anything else: ValueError naming what is not supported."""
        with open(path, encoding="utf-8") as source:
            document = json.load(source)
        return cls.from_tokenizer_document(document, source=str(path))

    @classmethod
    def from_tokenizer_document(cls, document: dict, source: str = "tokenizer.json"):
        model = document.get("model") or {}
        if model.get("type") != "BPE":
            raise ValueError(f"{source}: model.type {model.get('type')!r} is not supported (BPE)")
        vocab = model.get("vocab")
        if not isinstance(vocab, dict):
            raise ValueError(f"{source}: model.vocab must be an object")
        added = document.get("added_tokens") or []
        size = max([*vocab.values(), *(t["id"] for t in added)], default=-1) + 1
        tokens = [None] * size
        for text, index in vocab.items():
            tokens[index] = text
        types = [1] * size
        for entry in added:
            tokens[entry["id"]] = entry["content"]
            types[entry["id"]] = 3 if entry.get("special") else 4
        missing = [index for index, text in enumerate(tokens) if text is None]
        if missing:
            raise ValueError(f"{source}: token ids {missing[:5]} have no token")
        merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model.get("merges", [])]
        pre = document.get("pre_tokenizer") or {}
        pieces = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
        kinds = [p.get("type") for p in pieces]
        if model.get("byte_fallback"):
            # SentencePiece-style: merges follow from scores; the merge of rank r makes its
            # token score -r, so the highest score is the lowest rank (the same order).
            scores = [0.0] * size
            for rank, merge in enumerate(merges):
                left, right = merge.split(" ", 1)
                merged = vocab.get(left + right)
                if merged is not None and scores[merged] == 0.0:
                    scores[merged] = -float(rank + 1)
            for index, text in enumerate(tokens):
                if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                    types[index] = 6
            unknown = vocab.get(model.get("unk_token")) if model.get("unk_token") else None
            return cls.from_vocabulary(tokens, model="sentencepiece_bpe", token_types=types,
                                       scores=scores, unknown_id=unknown,
                                       add_dummy_prefix=_adds_dummy_prefix(document, pieces))
        if "ByteLevel" not in kinds:
            raise ValueError(f"{source}: pre-tokenizer {kinds} is not supported (ByteLevel)")
        splits = [p for p in pieces if p.get("type") == "Split"]
        if "Digits" in kinds:
            pretokenizer = "smollm"
        elif splits:
            pattern = (splits[0].get("pattern") or {}).get("Regex")
            if len(splits) != 1 or pattern not in _SPLIT_PATTERNS:
                raise ValueError(f"{source}: pre-tokenizer Split pattern {pattern!r} is not "
                                 "supported (Llama 3's or Qwen 2's)")
            pretokenizer = _SPLIT_PATTERNS[pattern]
        else:
            pretokenizer = "gpt2"
        return cls.from_vocabulary(tokens, pretokenizer=pretokenizer, merges=merges,
                                   token_types=types,
                                   ignore_merges=bool(model.get("ignore_merges")))

    @property
    def vocabulary_size(self) -> int:
        return self._size

    @property
    def bos_id(self) -> int | None:
        return self._special[0]

    @property
    def eos_id(self) -> int | None:
        return self._special[1]

    @property
    def unknown_id(self) -> int | None:
        return self._special[2]

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The ids of ``text``; control and added tokens written in it become their ids
        (``special=False``: control tokens are tokenized as plain text)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return self.encode_bytes(text.encode("utf-8"), special).tolist()

    def encode_bytes(self, data: bytes, special: bool = True) -> array:
        """``encode`` of UTF-8 bytes, as ``array('I')`` (ill-formed UTF-8: invalid_argument)."""
        data = bytes(data)
        mode = SPECIAL_PARSE if special else SPECIAL_AS_TEXT
        capacity = len(data) + 8  # a token covers at least one byte, plus dummy prefixes
        ids = array(UINT32_TYPECODE, bytes(4 * capacity))
        required = ctypes.c_uint64()
        native = library()
        with self._native() as handle:
            status = native.rt_pretrained_tokenizer_encode(
                handle, data, len(data), mode, _array_pointer(ids, ctypes.c_uint32), capacity,
                ctypes.byref(required))
            if status == STATUS_OUT_OF_RANGE and required.value > capacity:
                capacity = required.value
                ids = array(UINT32_TYPECODE, bytes(4 * capacity))
                status = native.rt_pretrained_tokenizer_encode(
                    handle, data, len(data), mode, _array_pointer(ids, ctypes.c_uint32),
                    capacity, ctypes.byref(required))
            check_status(status)
        del ids[required.value:]
        return ids

    def encode_to_array(self, data) -> array:
        """``encode_bytes`` (special tokens parsed): the training pipeline's encoder."""
        return self.encode_bytes(data)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes ``ids`` stand for (may end inside a UTF-8 character)."""
        values = array(UINT32_TYPECODE, [require_int(i, "ids", 0, UINT32_LIMIT) for i in ids])
        native = library()
        with self._native() as handle:
            return bytes(read_sized(
                lambda out, capacity, required: native.rt_pretrained_tokenizer_decode(
                    handle, _array_pointer(values, ctypes.c_uint32), len(values), out, capacity,
                    required),
                ctypes.c_uint8))

    def decode(self, ids: Sequence[int]) -> str:
        """``decode_bytes`` as text (ill-formed UTF-8 replaced by U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes as it decodes inside a sequence."""
        token = require_int(token_id, "token_id", 0, UINT32_LIMIT)
        native = library()
        with self._native() as handle:
            return bytes(read_sized(
                lambda out, capacity, required: native.rt_pretrained_tokenizer_token_bytes(
                    handle, token, out, capacity, required),
                ctypes.c_uint8))

    def token_text(self, token_id: int) -> str:
        """One token's vocabulary string."""
        token = require_int(token_id, "token_id", 0, UINT32_LIMIT)
        native = library()
        with self._native() as handle:
            return bytes(read_sized(
                lambda out, capacity, required: native.rt_pretrained_tokenizer_token_text(
                    handle, token, out, capacity, required),
                ctypes.c_uint8)).decode("utf-8")

    def find_token(self, text: str) -> int | None:
        """The id whose vocabulary string is exactly ``text``, or None."""
        data = text.encode("utf-8")
        out = ctypes.c_int64()
        with self._native() as handle:
            check_status(library().rt_pretrained_tokenizer_find_token(
                handle, data, len(data), ctypes.byref(out)))
        return None if out.value < 0 else out.value

    # ---- exact state (what artifacts persist) -------------------------------------------

    def state(self) -> dict:
        """The vocabulary this tokenizer was built from, as plain JSON-ready data;
        :meth:`from_state` rebuilds an identical tokenizer."""
        info = PretrainedTokenizerInfoStruct()
        info.struct_size = ctypes.sizeof(info)
        native = library()
        with self._native() as handle:
            check_status(native.rt_pretrained_tokenizer_info_get(handle, ctypes.byref(info)))
            parts = [bytes(read_sized(
                lambda out, capacity, required, part=part: native.rt_pretrained_tokenizer_export(
                    handle, part, out, capacity, required),
                ctypes.c_uint8)) for part in range(4)]
        model = {value: name for name, value in MODEL_VALUES.items()}[info.model]
        pretokenizers = {value: name for name, value in PRETOKENIZER_VALUES.items()}
        return {
            "model": model,
            "pretokenizer": pretokenizers.get(info.pretokenizer),
            "tokens": _unpack_strings(parts[0]),
            "merges": _unpack_strings(parts[1]),
            "token_types": array("i", parts[2]).tolist(),
            "scores": array("f", parts[3]).tolist(),
            "bos_id": None if info.bos_id < 0 else info.bos_id,
            "eos_id": None if info.eos_id < 0 else info.eos_id,
            "unknown_id": None if info.unknown_id < 0 else info.unknown_id,
            "ignore_merges": bool(info.ignore_merges),
            "add_dummy_prefix": bool(info.add_dummy_prefix),
        }

    @classmethod
    def from_state(cls, state: dict) -> PretrainedTokenizer:
        """The tokenizer :meth:`state` describes (native invalid_argument naming the entry
        when it breaks the vocabulary rules)."""
        return cls.from_vocabulary(
            state["tokens"], model=state["model"], pretokenizer=state["pretokenizer"] or "gpt2",
            merges=state["merges"], token_types=state["token_types"],
            scores=state["scores"] or None, bos_id=state["bos_id"], eos_id=state["eos_id"],
            unknown_id=state["unknown_id"], ignore_merges=state["ignore_merges"],
            add_dummy_prefix=state["add_dummy_prefix"])

    def __repr__(self) -> str:
        if self.closed:
            return "<PretrainedTokenizer (closed)>"
        return f"<PretrainedTokenizer vocabulary_size={self._size}>"


def gguf_metadata_string(path: str | os.PathLike, key: str) -> str | None:
    """A string value of a GGUF file's metadata, or None when the key is absent."""
    encoded_key = key.encode("utf-8")
    encoded_path = _path_bytes(path)
    present = ctypes.c_int32()
    native = library()
    data = read_sized(
        lambda out, capacity, required: native.rt_gguf_metadata_string(
            encoded_path, encoded_key, ctypes.byref(present), out, capacity, required),
        ctypes.c_uint8)
    return bytes(data).decode("utf-8") if present.value else None
