"""Byte and BPE tokenizers: text or raw bytes to uint32 token ids and back."""

from __future__ import annotations

import ctypes
import threading
from array import array
from collections.abc import Sequence
from functools import partial

from ._abi import TOKENIZER_METHOD_BPE, TOKENIZER_METHOD_BYTE, BpeMergeRule, TokenizerOptions
from ._buffers import byte_input, read_sized, token_ids
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._validation import UINT32_LIMIT, UINT64_LIMIT, require_choice, require_int

METHOD_VALUES = {"byte": TOKENIZER_METHOD_BYTE, "bpe": TOKENIZER_METHOD_BPE}
METHOD_NAMES = {value: name for name, value in METHOD_VALUES.items()}
BPE_BASE_VOCABULARY_SIZE = 256  # every byte value is a BPE token

MergeRule = tuple[int, int, int]  # (left id, right id, result id)


class Tokenizer(NativeHandle):
    """An immutable tokenizer fitted on a corpus.

    ``method="byte"`` (the default) gives one token per distinct corpus byte, ids in ascending
    byte order; it cannot encode a byte the corpus lacks. ``method="bpe"`` starts from all 256
    bytes and learns merges (deterministically) until ``vocabulary_size`` tokens exist or no
    pair occurs ``minimum_pair_frequency`` times; the defaults are the C library's (512, 2).

    ``corpus`` is a str (encoded as UTF-8) or any bytes-like object; an empty corpus is a
    native invalid_argument. Passing ``vocabulary_size`` or ``minimum_pair_frequency`` with
    the byte method is a ValueError, as is a BPE ``vocabulary_size`` outside [256, 2**32) or a
    ``minimum_pair_frequency`` below 1.
    """

    _release_function = "rt_tokenizer_release"

    def __init__(
        self,
        corpus: str | bytes,
        method: str = "byte",
        vocabulary_size: int | None = None,
        minimum_pair_frequency: int | None = None,
    ) -> None:
        method_value = require_choice(method, "method", METHOD_VALUES)
        if method_value == TOKENIZER_METHOD_BYTE and (
            vocabulary_size is not None or minimum_pair_frequency is not None
        ):
            raise ValueError(
                "the byte method takes neither vocabulary_size nor minimum_pair_frequency"
            )
        if vocabulary_size is not None:
            vocabulary_size = require_int(
                vocabulary_size, "vocabulary_size", BPE_BASE_VOCABULARY_SIZE, UINT32_LIMIT
            )
        if minimum_pair_frequency is not None:
            minimum_pair_frequency = require_int(
                minimum_pair_frequency, "minimum_pair_frequency", 1, UINT64_LIMIT
            )
        text = corpus.encode("utf-8") if isinstance(corpus, str) else corpus
        data = byte_input(text, "corpus")
        native = library()
        options = TokenizerOptions()
        check_status(
            native.rt_tokenizer_options_init(ctypes.byref(options), ctypes.sizeof(options))
        )
        options.method = method_value
        if vocabulary_size is not None:
            options.vocabulary_size = vocabulary_size
        if minimum_pair_frequency is not None:
            options.minimum_pair_frequency = minimum_pair_frequency
        pointer = ctypes.c_void_p()
        check_status(
            native.rt_tokenizer_create_with_options(
                data, len(data), ctypes.byref(options), ctypes.byref(pointer)
            )
        )
        self._adopt(pointer.value, threading.RLock())

    @classmethod
    def from_state(
        cls,
        method: str,
        byte_vocabulary=(),
        merge_rules: Sequence[MergeRule] = (),
    ) -> Tokenizer:
        """Restore a tokenizer exactly from :meth:`state` (no retraining).

        ``"byte"``: ``byte_vocabulary`` lists the byte of every id in order (bytes-like, or
        ints 0-255). ``"bpe"``: ``merge_rules`` lists ``(left, right, result)`` in training
        order. Giving the other method's state is a ValueError; a state that breaks the
        method's rules (duplicate bytes, results out of sequence...) is a native
        invalid_argument.
        """
        method_value = require_choice(method, "method", METHOD_VALUES)
        native = library()
        pointer = ctypes.c_void_p()
        if method_value == TOKENIZER_METHOD_BYTE:
            if len(merge_rules):
                raise ValueError("a byte tokenizer state has no merge_rules")
            vocabulary = byte_input(_bytes_of(byte_vocabulary), "byte_vocabulary")
            check_status(
                native.rt_tokenizer_create_from_byte_vocabulary(
                    vocabulary, len(vocabulary), ctypes.byref(pointer)
                )
            )
        else:
            if len(byte_vocabulary):
                raise ValueError("a BPE tokenizer state has no byte_vocabulary")
            rules = _merge_rule_array(merge_rules)
            check_status(
                native.rt_tokenizer_create_from_bpe_merges(rules, len(rules), ctypes.byref(pointer))
            )
        return cls._from_pointer(pointer.value, threading.RLock())

    def state(self) -> tuple[str, bytes, tuple[MergeRule, ...]]:
        """``(method, byte_vocabulary, merge_rules)``, the arguments of :meth:`from_state`."""
        with self._native():
            if self.method == "byte":
                return ("byte", self.vocabulary_bytes, ())
            return ("bpe", b"", self.merge_rules)

    @property
    def method(self) -> str:
        """``"byte"`` or ``"bpe"``."""
        return METHOD_NAMES[self._query("rt_tokenizer_get_method", ctypes.c_int32)]

    @property
    def vocab_size(self) -> int:
        """The number of token ids (ids are ``0 .. vocab_size - 1``)."""
        return self._query("rt_tokenizer_vocabulary_size", ctypes.c_uint64)

    vocabulary_size = vocab_size

    @property
    def vocabulary(self) -> tuple[bytes, ...]:
        """The bytes of every token, indexed by id (both methods)."""
        with self._native():
            return tuple(self.token_bytes(token_id) for token_id in range(self.vocab_size))

    @property
    def vocabulary_bytes(self) -> bytes:
        """The byte of every id, in id order (byte method only; BPE: native invalid_argument)."""
        with self._native() as pointer:
            return bytes(
                read_sized(partial(library().rt_tokenizer_vocabulary, pointer), ctypes.c_uint8)
            )

    @property
    def merge_rules(self) -> tuple[MergeRule, ...]:
        """The learned ``(left, right, result)`` merges in training order (byte method: ``()``)."""
        native = library()
        with self._native() as pointer:
            if self.method == "byte":
                return ()
            count = ctypes.c_uint64()
            check_status(native.rt_tokenizer_bpe_merge_count(pointer, ctypes.byref(count)))
            rule = BpeMergeRule()
            rules = []
            for index in range(count.value):
                check_status(native.rt_tokenizer_bpe_merge_rule(pointer, index, ctypes.byref(rule)))
                rules.append((rule.left, rule.right, rule.result))
            return tuple(rules)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (an id past the vocabulary: out_of_range)."""
        token_id = require_int(token_id, "token_id", 0, UINT32_LIMIT)
        with self._native() as pointer:
            return bytes(
                read_sized(
                    partial(library().rt_tokenizer_token_bytes, pointer, token_id), ctypes.c_uint8
                )
            )

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s UTF-8 encoding (a str; use :meth:`encode_bytes` for bytes)."""
        if not isinstance(text, str):
            raise TypeError(f"encode needs a str, not {type(text).__name__} (see encode_bytes)")
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data) -> list[int]:
        """The ids of arbitrary bytes (any bytes-like object; a str is a TypeError).

        With the byte method, a byte the corpus lacked is a native invalid_argument.
        """
        source = byte_input(data, "data")
        # The header guarantees at most one id per input byte.
        ids = (ctypes.c_uint32 * len(source))()
        required = ctypes.c_uint64()
        with self._native() as pointer:
            check_status(
                library().rt_tokenizer_encode(
                    pointer, source, len(source), ids, len(ids), ctypes.byref(required)
                )
            )
        return ids[: required.value]

    def encode_to_array(self, data) -> array:
        """:meth:`encode_bytes` into an ``array('I')`` (no Python int per token: the fast path
        for large corpora)."""
        source = byte_input(data, "data")
        ids = array("I", bytes(4 * len(source)))  # at most one id per input byte
        required = ctypes.c_uint64()
        buffer = (ctypes.c_uint32 * len(ids)).from_buffer(ids) if len(ids) else None
        with self._native() as pointer:
            check_status(
                library().rt_tokenizer_encode(
                    pointer, source, len(source), buffer, len(ids), ctypes.byref(required)
                )
            )
        del buffer  # release the export before resizing
        del ids[required.value :]
        return ids

    def decode_bytes(self, ids) -> bytes:
        """The bytes of one row of ids (a list, ``array('I')`` or 1-D integer numpy array).

        An id past the vocabulary is a native out_of_range.
        """
        row = token_ids(ids, "ids")
        if len(row.shape) != 1:
            raise ValueError(f"ids must be one flat row, got shape {row.shape}")
        with self._native() as pointer:
            decoded = read_sized(
                partial(library().rt_tokenizer_decode, pointer, row.values, len(row.values)),
                ctypes.c_uint8,
            )
        return bytes(decoded)

    def decode(self, ids) -> str:
        """The text of one row of ids; bytes that are not valid UTF-8 raise UnicodeDecodeError
        (a ValueError). Use :meth:`decode_bytes` for binary data."""
        return self.decode_bytes(ids).decode("utf-8")

    def __repr__(self) -> str:
        if self.closed:
            return "<Tokenizer (closed)>"
        return f"<Tokenizer method={self.method!r} vocab_size={self.vocab_size}>"


def _bytes_of(byte_vocabulary) -> bytes | memoryview:
    """A byte vocabulary given as bytes-like, or as a sequence of ints 0-255."""
    if isinstance(byte_vocabulary, (list, tuple)):
        # A valid vocabulary has at most 256 entries, so checking each one costs nothing.
        for index, byte in enumerate(byte_vocabulary):
            require_int(byte, f"byte_vocabulary[{index}]", 0, 256)
        return bytes(byte_vocabulary)
    return byte_vocabulary


def _merge_rule_array(merge_rules: Sequence[MergeRule]) -> ctypes.Array:
    if isinstance(merge_rules, (str, bytes)) or not isinstance(merge_rules, Sequence):
        raise TypeError("merge_rules must be a sequence of (left, right, result) triples")
    rules = (BpeMergeRule * len(merge_rules))()
    for index, rule in enumerate(merge_rules):
        if not isinstance(rule, Sequence) or len(rule) != 3:
            raise ValueError(f"merge_rules[{index}] must be a (left, right, result) triple")
        left, right, result = (
            require_int(token_id, f"merge_rules[{index}][{position}]", 0, UINT32_LIMIT)
            for position, token_id in enumerate(rule)
        )
        rules[index] = BpeMergeRule(left, right, result)
    return rules
