"""Byte and BPE tokenizers: vocabularies, strict and binary-safe round trips, state restore."""

from __future__ import annotations

import re
from array import array

import pytest

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    STATUS_OUT_OF_RANGE,
    Tokenizer,
)

from support import native_error

# ---- byte method ---------------------------------------------------------------------------


def test_the_byte_method_is_the_default_and_sorts_the_distinct_bytes():
    with Tokenizer(b"cab\na") as tokenizer:
        assert tokenizer.method == "byte"
        assert tokenizer.vocab_size == tokenizer.vocabulary_size == 4
        assert tokenizer.vocabulary_bytes == b"\nabc"
        assert tokenizer.vocabulary == (b"\n", b"a", b"b", b"c")
        assert tokenizer.merge_rules == ()
        assert tokenizer.encode("abc\n") == [1, 2, 3, 0]


def test_a_str_corpus_is_encoded_as_utf8():
    with Tokenizer("é") as tokenizer:
        # "é" is b"\xc3\xa9"; ids follow ascending byte order.
        assert tokenizer.vocabulary_bytes == b"\xa9\xc3"
        assert tokenizer.encode("é") == [1, 0]
        assert tokenizer.decode([1, 0]) == "é"


def test_a_byte_the_corpus_lacked_is_a_native_invalid_argument():
    with Tokenizer("abc") as tokenizer:
        assert native_error(lambda: tokenizer.encode("abd")).status == STATUS_INVALID_ARGUMENT


def test_the_byte_method_takes_no_bpe_options():
    with pytest.raises(ValueError):
        Tokenizer("abc", vocabulary_size=300)
    with pytest.raises(ValueError):
        Tokenizer("abc", method="byte", minimum_pair_frequency=2)


def test_the_byte_vocabulary_query_fails_natively_on_a_bpe_tokenizer():
    with Tokenizer("abc", method="bpe") as tokenizer:
        assert native_error(lambda: tokenizer.vocabulary_bytes).status == STATUS_INVALID_ARGUMENT


# ---- BPE -----------------------------------------------------------------------------------


def test_bpe_learns_ab_from_repeated_ab_and_encodes_greedily():
    with Tokenizer("abababab", method="bpe", vocabulary_size=257) as tokenizer:
        assert tokenizer.method == "bpe"
        assert tokenizer.vocab_size == 257
        assert tokenizer.merge_rules == ((ord("a"), ord("b"), 256),)
        assert tokenizer.token_bytes(256) == b"ab"
        assert tokenizer.encode("abababab") == [256] * 4
        assert tokenizer.encode("aba") == [256, ord("a")]


def test_bpe_encodes_bytes_its_corpus_never_had():
    with Tokenizer("hello hello", method="bpe") as tokenizer:
        assert tokenizer.encode_bytes(b"\x00\xff") == [0, 255]
        assert tokenizer.decode_bytes([0, 255]) == b"\x00\xff"


def test_bpe_defaults_are_the_library_defaults_and_the_vocabulary_is_a_cap():
    corpus = "the quick brown fox jumps over the lazy dog " * 20
    with (
        Tokenizer(corpus, method="bpe") as default,
        Tokenizer(corpus, method="bpe", vocabulary_size=512, minimum_pair_frequency=2) as explicit,
    ):
        assert default.merge_rules == explicit.merge_rules
        assert 256 < default.vocab_size <= 512


def test_the_vocabulary_lists_every_token_as_bytes():
    with Tokenizer("abababab", method="bpe", vocabulary_size=257) as tokenizer:
        vocabulary = tokenizer.vocabulary
        assert len(vocabulary) == 257
        assert vocabulary[:256] == tuple(bytes([value]) for value in range(256))
        assert vocabulary[256] == b"ab"


@pytest.mark.parametrize(
    ("keywords", "error"),
    [
        ({"vocabulary_size": 255}, ValueError),
        ({"vocabulary_size": 2**32}, ValueError),
        ({"vocabulary_size": 300.0}, TypeError),
        ({"vocabulary_size": True}, TypeError),
        ({"minimum_pair_frequency": 0}, ValueError),
        ({"method": "wordpiece"}, ValueError),
        ({"method": "BPE"}, ValueError),
    ],
)
def test_tokenizer_options_are_validated_in_python(keywords, error):
    options = {"method": "bpe", **keywords}
    with pytest.raises(error):
        Tokenizer("abc", **options)


@pytest.mark.parametrize("method", ["byte", "bpe"])
def test_an_empty_corpus_is_a_native_invalid_argument(method):
    assert native_error(lambda: Tokenizer(b"", method=method)).status == STATUS_INVALID_ARGUMENT


# ---- strict and binary-safe APIs -------------------------------------------------------------


def test_binary_round_trips_keep_every_byte_including_nul():
    data = bytes(range(256)) + b"\x00\x00"
    for tokenizer in (Tokenizer(data), Tokenizer(data, method="bpe", vocabulary_size=300)):
        with tokenizer:
            ids = tokenizer.encode_bytes(data)
            assert tokenizer.decode_bytes(ids) == data
            assert tokenizer.decode_bytes(array("I", ids)) == data
            assert tokenizer.encode_bytes(bytearray(data)) == ids
            assert tokenizer.encode_bytes(memoryview(data)) == ids


def test_text_round_trips_through_the_strict_utf8_api():
    text = "naïve café, 東京\n"
    with Tokenizer(text, method="bpe", vocabulary_size=270) as tokenizer:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_decode_rejects_invalid_utf8_and_decode_bytes_does_not():
    with Tokenizer(b"\xff\xfe") as tokenizer:
        with pytest.raises(ValueError):
            tokenizer.decode([0])
        with pytest.raises(UnicodeDecodeError):
            tokenizer.decode([1, 0])
        assert tokenizer.decode_bytes([1, 0]) == b"\xff\xfe"


def test_the_str_and_bytes_apis_do_not_mix():
    with Tokenizer("abc") as tokenizer:
        with pytest.raises(TypeError):
            tokenizer.encode(b"abc")
        with pytest.raises(TypeError):
            tokenizer.encode_bytes("abc")


def test_empty_inputs_encode_and_decode_to_empty_outputs():
    with Tokenizer("abc", method="bpe") as tokenizer:
        assert tokenizer.encode("") == []
        assert tokenizer.decode([]) == ""
        assert tokenizer.decode_bytes([]) == b""


def test_unknown_ids_are_a_native_out_of_range():
    with Tokenizer("abc") as tokenizer:
        assert native_error(lambda: tokenizer.decode([3])).status == STATUS_OUT_OF_RANGE
        assert native_error(lambda: tokenizer.token_bytes(3)).status == STATUS_OUT_OF_RANGE


@pytest.mark.parametrize(
    ("token_id", "error"), [(-1, ValueError), (2**32, ValueError), (1.0, TypeError)]
)
def test_ids_outside_uint32_are_rejected_in_python(token_id, error):
    with Tokenizer("abc") as tokenizer:
        with pytest.raises(error):
            tokenizer.token_bytes(token_id)
        with pytest.raises(error):
            tokenizer.decode([token_id])


def test_decode_needs_one_flat_row():
    with Tokenizer("abc") as tokenizer:
        with pytest.raises(ValueError):
            tokenizer.decode([[0, 1], [1, 2]])


# ---- state ---------------------------------------------------------------------------------


def test_a_byte_state_restores_the_same_tokenizer():
    with Tokenizer(b"zyx\x00") as original:
        state = original.state()
        assert state == ("byte", b"\x00xyz", ())
        with Tokenizer.from_state(*state) as restored:
            assert restored.vocabulary == original.vocabulary
            assert restored.encode_bytes(b"xyz\x00") == original.encode_bytes(b"xyz\x00")
    with Tokenizer.from_state("byte", [ord("b"), ord("a")]) as from_ints:
        assert from_ints.encode("ab") == [1, 0]


def test_a_bpe_state_restores_the_same_tokenizer():
    corpus = "low lower lowest slow " * 10
    with Tokenizer(corpus, method="bpe", vocabulary_size=280) as original:
        method, byte_vocabulary, merge_rules = original.state()
        assert (method, byte_vocabulary) == ("bpe", b"")
        assert merge_rules == original.merge_rules and len(merge_rules) > 0
        with Tokenizer.from_state(method, merge_rules=merge_rules) as restored:
            assert restored.vocabulary == original.vocabulary
            assert restored.encode(corpus) == original.encode(corpus)


def test_an_empty_merge_table_is_the_plain_byte_level_bpe():
    with Tokenizer.from_state("bpe") as tokenizer:
        assert tokenizer.vocab_size == 256
        assert tokenizer.encode("hi") == [ord("h"), ord("i")]


@pytest.mark.parametrize(
    ("method", "byte_vocabulary", "merge_rules"),
    [
        ("byte", b"aa", ()),  # a repeated byte
        ("byte", b"", ()),  # empty
        ("bpe", (), [(97, 98, 257)]),  # results must be 256, 257, ...
        ("bpe", (), [(97, 98, 256), (97, 98, 257)]),  # a repeated pair
        ("bpe", (), [(256, 97, 256)]),  # an operand that is not older than its result
    ],
)
def test_an_invalid_state_is_a_native_invalid_argument(method, byte_vocabulary, merge_rules):
    error = native_error(lambda: Tokenizer.from_state(method, byte_vocabulary, merge_rules))
    assert error.status == STATUS_INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (("byte", b"ab", [(97, 98, 256)]), ValueError),  # the other method's state
        (("bpe", b"ab"), ValueError),
        (("bpe", (), [(97, 98)]), ValueError),  # not a triple
        (("bpe", (), [(97, -98, 256)]), ValueError),
        (("bpe", (), [(97, 98.0, 256)]), TypeError),
        (("bpe", (), "abc"), TypeError),
        (("byte", [256]), ValueError),  # not a byte
        (("byte", [True]), TypeError),
        (("unigram",), ValueError),
    ],
)
def test_state_arguments_are_validated_in_python(arguments, error):
    with pytest.raises(error):
        Tokenizer.from_state(*arguments)


@pytest.mark.parametrize(
    ("byte_vocabulary", "error", "message"),
    [
        ([1, 2.0], TypeError, "byte_vocabulary[1] must be an int, not float (2.0)"),
        ([300], ValueError, "byte_vocabulary[0] must be in [0, 256), got 300"),
        ((97, -1), ValueError, "byte_vocabulary[1] must be in [0, 256), got -1"),
        ([97, "b"], TypeError, "byte_vocabulary[1] must be an int, not str ('b')"),
        ([False], TypeError, "byte_vocabulary[0] must be an int, not bool (False)"),
    ],
)
def test_a_byte_vocabulary_of_ints_names_the_element_that_is_not_a_byte(
    byte_vocabulary, error, message
):
    with pytest.raises(error, match=re.escape(message)):
        Tokenizer.from_state("byte", byte_vocabulary)
