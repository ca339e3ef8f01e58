"""Tokenizers of pretrained models: GPT-2-style byte-level BPE and SentencePiece-style BPE.

Built from a GGUF file's metadata (:meth:`PretrainedTokenizer.from_gguf`), a Hugging Face
``tokenizer.json`` (:meth:`PretrainedTokenizer.from_tokenizer_json`; parsed here with the
standard library) or plain arrays (:meth:`PretrainedTokenizer.from_vocabulary`). Encoding and
decoding run in the native library.
"""

from __future__ import annotations

import ctypes
import os
import threading
from array import array
from collections.abc import Sequence

from .._container import json_kind, strict_json
from ._abi import (
    STATUS_INVALID_ARGUMENT,
    STATUS_OUT_OF_RANGE,
    PretrainedTokenizerInfoStruct,
    PretrainedVocabularyStruct,
)
from ._buffers import UINT32_TYPECODE, read_sized
from ._errors import RiftcoTransformerError, check_status
from ._handle import NativeHandle
from ._loader import library
from ._validation import UINT32_LIMIT, describe_value, require_int

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


def _json_kind(value: object) -> str:
    """What a JSON value is, for an error message (values shown by describe_value)."""
    return json_kind(value, describe_value)


class _TokenizerDocument:
    """Typed reads of a parsed ``tokenizer.json``: each rule broken is a ValueError naming the
    file (``source``) and the JSON path of the value, e.g. ``added_tokens[3].id``."""

    _KINDS = {dict: "an object", list: "an array", str: "a string", bool: "true or false"}

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str):
        raise ValueError(f"{self.source}: {path} {message}")

    def optional(self, parent: dict, key: str, path: str, kind: type):
        """``parent[key]`` when it is a ``kind`` (None when absent or null)."""
        value = parent.get(key)
        if value is not None and (not isinstance(value, kind)
                                  or (kind is not bool and isinstance(value, bool))):
            self.fail(path, f"must be {self._KINDS[kind]}, not {_json_kind(value)}")
        return value

    def objects(self, parent: dict, key: str, path: str) -> list[dict]:
        """``parent[key]`` as a list of objects (absent or null: empty)."""
        values = self.optional(parent, key, path, list) or []
        for index, value in enumerate(values):
            if not isinstance(value, dict):
                self.fail(f"{path}[{index}]", f"must be an object, not {_json_kind(value)}")
        return values

    def stage_type(self, stage: dict, path: str) -> str:
        kind = stage.get("type")
        if not isinstance(kind, str):
            self.fail(f"{path}.type", f"must be a string, not {_json_kind(kind)}")
        return kind

    def token_id(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _ID_LIMIT:
            self.fail(path, f"must be a token id (an integer in [0, {_ID_LIMIT})), not "
                            f"{_json_kind(value)}")
        return value

    def token_text(self, text: object, path: str) -> str:
        if not isinstance(text, str):
            self.fail(path, f"must be a string, not {_json_kind(text)}")
        if not text:
            self.fail(path, "is empty (a token has at least one character)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            self.fail(path, f"{describe_value(text)} is not valid Unicode (a lone surrogate at "
                            f"character {error.start})")
        return text


# Token ids are uint32, and the library keeps one id (2**32 - 1) for "no token".
_ID_LIMIT = UINT32_LIMIT - 1


def _vocabulary(reader: _TokenizerDocument, model: dict, added: list[dict]):
    """``model.vocab`` and ``added_tokens`` as ``(tokens, types)`` indexed by id, checked: ids
    non-negative and unique, dense from 0, texts unique. An added token may repeat a vocab
    entry with the same id and text (real files list their special tokens in both)."""
    vocab = reader.optional(model, "vocab", "model.vocab", dict)
    if vocab is None:
        reader.fail("model.vocab", "must be an object (the BPE vocabulary), not null")
    # Whole-vocabulary checks first (a real one has 150 000 or more entries); the entry at
    # fault is looked for only when one fails.
    for text, index in vocab.items():
        if type(index) is not int or not 0 <= index < _ID_LIMIT:  # a bool is no id
            reader.token_id(index, f"model.vocab[{describe_value(text)}]")
    if "" in vocab:
        reader.token_text("", "model.vocab['']")
    try:
        "".join(vocab).encode("utf-8")
    except UnicodeEncodeError:
        for text in vocab:
            reader.token_text(text, f"model.vocab[{describe_value(text)}]")
    text_of_id: dict[int, str] = {index: text for text, index in vocab.items()}
    if len(text_of_id) != len(vocab):
        first: dict[int, str] = {}
        for text, index in vocab.items():
            if index in first:
                reader.fail(f"model.vocab[{describe_value(text)}]", f"= {index} repeats the id "
                            f"of model.vocab[{describe_value(first[index])}]")
            first[index] = text
    types = {}
    added_at_id: dict[int, int] = {}
    added_at_text: dict[str, int] = {}
    for position, entry in enumerate(added):
        path = f"added_tokens[{position}]"
        index = reader.token_id(entry.get("id"), f"{path}.id")
        text = reader.token_text(entry.get("content"), f"{path}.content")
        special = reader.optional(entry, "special", f"{path}.special", bool)
        if index in added_at_id:
            reader.fail(f"{path}.id", f"{index} repeats added_tokens[{added_at_id[index]}].id")
        if text in added_at_text:
            reader.fail(f"{path}.content", f"{describe_value(text)} repeats "
                                           f"added_tokens[{added_at_text[text]}].content")
        in_vocab = text_of_id.get(index)
        if in_vocab is not None and in_vocab != text:
            reader.fail(path, f"gives id {index} to {describe_value(text)}, but model.vocab gives "
                              f"it to {describe_value(in_vocab)}")
        vocab_id = vocab.get(text)
        if vocab_id is not None and vocab_id != index:
            reader.fail(path, f"gives {describe_value(text)} id {index}, but model.vocab gives "
                              f"it id {vocab_id}")
        added_at_id[index] = position
        added_at_text[text] = position
        text_of_id[index] = text
        types[index] = 3 if special else 4
    # Every id from 0 up has a token: checked before a list of the largest id's length is made.
    size = len(text_of_id)
    if size and max(text_of_id) >= size:
        missing = [index for index in range(size) if index not in text_of_id][:5]
        reader.fail("model.vocab", f"and added_tokens leave token ids {missing} without a token "
                                   f"({size} tokens, ids up to {max(text_of_id)})")
    tokens = [text_of_id[index] for index in range(size)]
    return tokens, [types.get(index, 1) for index in range(size)]


def _merges(reader: _TokenizerDocument, model: dict, vocab: dict) -> tuple[list[str], list[int]]:
    """``model.merges`` in rank order as "left right" lines and the ids of their merged
    tokens: each merge a string "left right" or (newer files) a pair of strings, both parts
    and their concatenation tokens of ``model.vocab`` (as the tokenizers package requires),
    no pair twice."""
    merges = reader.optional(model, "merges", "model.merges", list) or []
    lines: list[str] = []
    merged_ids: list[int] = []
    seen: set[str] = set()
    for rank, merge in enumerate(merges):
        if type(merge) is str:
            left, _, right = merge.partition(" ")
            if not left or not right or " " in right:
                reader.fail(f"model.merges[{rank}]", f"{describe_value(merge)} is not \"left "
                                                     "right\" (two non-empty tokens, one space)")
            line = merge
        elif type(merge) is list:
            if len(merge) != 2 or not all(type(part) is str and part for part in merge):
                reader.fail(f"model.merges[{rank}]", "must be two non-empty strings")
            left, right = merge
            if " " in left or " " in right:
                reader.fail(f"model.merges[{rank}]", f"{describe_value(merge)}: a merge of "
                                                     "tokens with a space is not supported")
            line = f"{left} {right}"
        else:
            reader.fail(f"model.merges[{rank}]", "must be a string \"left right\" or an array "
                                                 f"of two strings, not {_json_kind(merge)}")
        merged = vocab.get(left + right)
        if merged is None or left not in vocab or right not in vocab:
            role, text = next((role, text) for role, text in (
                ("left", left), ("right", right), ("merged", left + right)) if text not in vocab)
            reader.fail(f"model.merges[{rank}]", f"{describe_value(merge)}: its {role} token "
                                                 f"{describe_value(text)} is not in model.vocab")
        if line in seen:
            reader.fail(f"model.merges[{rank}]", f"{describe_value(merge)} repeats "
                                                 f"model.merges[{lines.index(line)}]")
        seen.add(line)
        lines.append(line)
        merged_ids.append(merged)
    return lines, merged_ids


def _stages(reader: _TokenizerDocument, document: dict, key: str,
            list_key: str) -> list[tuple[str, dict]]:
    """The normalizer or pre-tokenizer stages as (JSON path, stage): a Sequence's
    ``list_key`` list, one stage, or none (null), each an object with a string ``type``."""
    stage = reader.optional(document, key, key, dict)
    if stage is None:
        return []
    if reader.stage_type(stage, key) != "Sequence":
        return [(key, stage)]
    path = f"{key}.{list_key}"
    stages = [(f"{path}[{index}]", step)
              for index, step in enumerate(reader.objects(stage, list_key, path))]
    for where, step in stages:
        reader.stage_type(step, where)
    return stages


def _adds_dummy_prefix(reader: _TokenizerDocument, normalizers: list[tuple[str, dict]],
                       pre_tokenizers: list[tuple[str, dict]]) -> bool:
    """Whether a SentencePiece-style tokenizer.json puts "\u2581" before the text: a Prepend
    normalizer (Llama 2, Mistral), or an older file's Metaspace pre-tokenizer that adds a
    prefix space. Gemma's only replaces spaces: no prefix."""
    if any(step["type"] == "Prepend" for _, step in normalizers):
        return True
    for path, piece in pre_tokenizers:
        if piece["type"] != "Metaspace":
            continue
        prefix = reader.optional(piece, "add_prefix_space", f"{path}.add_prefix_space", bool)
        scheme = reader.optional(piece, "prepend_scheme", f"{path}.prepend_scheme", str)
        if prefix is True or scheme in ("always", "first"):
            return True
    return False


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
                f"pretokenizer must be one of {', '.join(PRETOKENIZER_VALUES)} "
                f"(got {pretokenizer!r})"
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
            setattr(native, name,
                    -1 if value is None else require_int(value, name, 0, UINT32_LIMIT))
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

        The file is one strict JSON document (UTF-8, no duplicate key, no NaN; nesting too
        deep for the parser is reported as such), then read as :meth:`from_tokenizer_document`
        says. Every problem with its content is a ValueError starting with the path.
        """
        with open(path, "rb") as stream:
            data = stream.read()
        document = strict_json(data, str(path))
        return cls.from_tokenizer_document(document, source=str(path))

    @classmethod
    def from_tokenizer_document(cls, document: dict, source: str = "tokenizer.json"):
        """The tokenizer of a parsed ``tokenizer.json`` (``source`` names it in errors).

        Checked before anything is built, each failure a ValueError naming ``source`` and the
        JSON path and value: every field read has its JSON type; ``model.vocab`` maps texts
        to ids and ``added_tokens`` lists objects with an ``id`` and a ``content``; ids are
        integers >= 0, no id or text is given twice (an added token may repeat a vocab entry
        with the same id and text), and the ids run from 0 without a gap; each merge is
        "left right" or a pair of strings whose parts and concatenation are vocab tokens, no
        pair twice. Unsupported models and pre-tokenizers: ValueError saying what is
        supported. A vocabulary the library still refuses (e.g. a byte-level token outside
        the byte alphabet) is a ValueError naming ``source`` with the library's reason.
        """
        reader = _TokenizerDocument(source)
        if not isinstance(document, dict):
            reader.fail("the document", f"must be a JSON object, not {_json_kind(document)}")
        model = reader.optional(document, "model", "model", dict) or {}
        if model.get("type") != "BPE":
            reader.fail("model.type", f"{describe_value(model.get('type'))} is not supported "
                                      "(BPE)")
        added = reader.objects(document, "added_tokens", "added_tokens")
        tokens, types = _vocabulary(reader, model, added)
        vocab = model["vocab"]
        merges, merged_ids = _merges(reader, model, vocab)
        normalizers = _stages(reader, document, "normalizer", "normalizers")
        pieces = _stages(reader, document, "pre_tokenizer", "pretokenizers")
        kinds = [piece["type"] for _, piece in pieces]
        byte_fallback = reader.optional(model, "byte_fallback", "model.byte_fallback", bool)
        ignore_merges = reader.optional(model, "ignore_merges", "model.ignore_merges", bool)
        unknown_token = reader.optional(model, "unk_token", "model.unk_token", str)
        if byte_fallback:
            # SentencePiece-style: merges follow from scores; the merge of rank r makes its
            # token score -r, so the highest score is the lowest rank (the same order).
            size = len(tokens)
            scores = [0.0] * size
            for rank, merged in enumerate(merged_ids):
                if scores[merged] == 0.0:
                    scores[merged] = -float(rank + 1)
            for index, text in enumerate(tokens):
                if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                    types[index] = 6
            unknown = None
            if unknown_token is not None:
                unknown = vocab.get(unknown_token)
                if unknown is None:
                    reader.fail("model.unk_token", f"{describe_value(unknown_token)} is not in "
                                                   "model.vocab")
            return cls._from_checked(
                source, tokens, model="sentencepiece_bpe", token_types=types, scores=scores,
                unknown_id=unknown,
                add_dummy_prefix=_adds_dummy_prefix(reader, normalizers, pieces))
        if "ByteLevel" not in kinds:
            raise ValueError(f"{source}: pre-tokenizer {kinds} is not supported (ByteLevel)")
        splits = [(path, piece) for path, piece in pieces if piece["type"] == "Split"]
        if "Digits" in kinds:
            pretokenizer = "smollm"
        elif splits:
            path, split = splits[0]
            where = f"{path}.pattern"
            pattern = reader.optional(split, "pattern", where, dict) or {}
            regex = reader.optional(pattern, "Regex", f"{where}.Regex", str)
            if len(splits) != 1 or regex not in _SPLIT_PATTERNS:
                raise ValueError(f"{source}: pre-tokenizer Split pattern {regex!r} is not "
                                 "supported (Llama 3's or Qwen 2's)")
            pretokenizer = _SPLIT_PATTERNS[regex]
        else:
            pretokenizer = "gpt2"
        return cls._from_checked(source, tokens, pretokenizer=pretokenizer,
                                 merges=merges,
                                 token_types=types, ignore_merges=bool(ignore_merges))

    @classmethod
    def _from_checked(cls, source: str, tokens: list[str], **options) -> PretrainedTokenizer:
        """:meth:`from_vocabulary`, a refusal by the library reported as a ValueError naming
        ``source`` (its ``tokens[i]`` is the token of id i)."""
        try:
            return cls.from_vocabulary(tokens, **options)
        except RiftcoTransformerError as error:
            if error.status != STATUS_INVALID_ARGUMENT:
                raise
            raise ValueError(f"{source}: the vocabulary is refused: {error.detail}") from None

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

    def control_tokens(self) -> dict[str, int]:
        """The tokens ``encode`` makes of their text only with special tokens parsed
        (control and unknown tokens, GGUF types 3 and 2): ``{text: id}``. Computed once
        (the tokenizer never changes). Serving's ``encode_chat`` keeps these to a chat
        template's own text; added (user-defined) tokens are cut from any text."""
        cached = getattr(self, "_control_tokens", None)
        if cached is None:
            native = library()
            with self._native() as handle:
                types = array("i", bytes(read_sized(
                    lambda out, capacity, required: native.rt_pretrained_tokenizer_export(
                        handle, 2, out, capacity, required),  # RT_PRETRAINED_PART_TOKEN_TYPES
                    ctypes.c_uint8)))
            controls = {}
            for token_id, token_type in enumerate(types):
                if token_type in (TOKEN_TYPE_VALUES["unknown"], TOKEN_TYPE_VALUES["control"]):
                    try:
                        controls[self.token_text(token_id)] = token_id
                    except UnicodeDecodeError:
                        continue  # not text: no UTF-8 prompt spells it at a character boundary
            cached = self._control_tokens = controls
        return dict(cached)

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
    """A string value of a GGUF file's metadata, or None when the key is absent. GGUF
    strings are UTF-8: bytes that are not (a damaged or hostile file) are a ValueError
    naming the file, the key and the first bad byte."""
    encoded_key = key.encode("utf-8")
    encoded_path = _path_bytes(path)
    present = ctypes.c_int32()
    native = library()
    data = read_sized(
        lambda out, capacity, required: native.rt_gguf_metadata_string(
            encoded_path, encoded_key, ctypes.byref(present), out, capacity, required),
        ctypes.c_uint8)
    if not present.value:
        return None
    data = bytes(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{os.fsdecode(path)}: metadata {key} is not UTF-8 text as GGUF strings are: byte "
            f"{error.start:,} of {len(data):,} ({data[error.start]:#04x}) {error.reason}"
        ) from None
