"""TextGenerator and the exact generator sequence: stop sequences, the end token, UTF-8
streaming, context rollover (docs/ARCHITECTURE.md, 'Context rollover'), and the configuration's
rules."""

from __future__ import annotations

import dataclasses

import pytest
from serving_fakes import BigramModel, PieceTokenizer, RecordingEngine, ascii_tokenizer, chain

from riftco_transformer import DecoderOnlyTransformer, Tokenizer
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    Greedy,
    TextGenerator,
)
from riftco_transformer.serving._text import IncrementalText

# ---- incremental text ------------------------------------------------------------------------


def releases(text: IncrementalText, *pieces: bytes) -> list[str]:
    return [text.push(piece) for piece in pieces]


def test_a_multibyte_character_split_across_pieces_is_released_whole():
    text = IncrementalText()
    assert releases(text, b"a\xe2", b"\x82", b"\xac!") == ["a", "", "\u20ac!"]
    assert text.finish() == ""
    assert text.text == "a\u20ac!"


def test_invalid_bytes_become_replacement_characters_at_once_and_a_partial_tail_at_the_end():
    text = IncrementalText()
    assert releases(text, b"\xff", b"ok\xc3") == ["\ufffd", "ok"]
    assert text.finish() == "\ufffd"
    assert text.text == "\ufffdok\ufffd"


def test_text_that_may_start_a_stop_sequence_is_held_until_it_cannot():
    text = IncrementalText(("STOP",))
    assert releases(text, b"abS", b"T", b"x") == ["ab", "", "STx"]
    assert not text.stopped


def test_a_completed_stop_sequence_cuts_the_text_where_it_starts():
    text = IncrementalText(("STOP",))
    assert releases(text, b"abS", b"TO", b"P and more", b"ignored") == ["ab", "", "", ""]
    assert text.stopped and text.stop_sequence == "STOP"
    assert text.finish() == ""
    assert text.text == "ab"


def test_the_earliest_stop_wins_and_overlapping_prefixes_are_released_correctly():
    text = IncrementalText(("cd", "bc"))
    assert releases(text, b"a", b"b", b"cd") == ["a", "", ""]
    assert (text.text, text.stop_sequence) == ("a", "bc")
    text = IncrementalText(("aab",))
    assert releases(text, b"a", b"a", b"a", b"b") == ["", "", "a", ""]
    assert text.text == "a"


def test_finishing_releases_a_held_back_prefix_and_a_stop_may_span_a_split_character():
    text = IncrementalText(("xyz",))
    assert releases(text, b"abx") == ["ab"]
    assert text.finish() == "x"
    text = IncrementalText(("\u00e9!",))
    assert releases(text, b"ok\xc3", b"\xa9", b"!") == ["ok", "", ""]
    assert (text.text, text.stop_sequence) == ("ok", "\u00e9!")


# ---- TextGenerator over scripted models ----------------------------------------------------

# Ids 0-127 are ASCII; 128.. are the pieces below.
PIECES = [b"Hel", b"lo ", b"ST", b"OP", b" more", b"<end>", b"\xe2", b"\x82", b"\xac", b"S",
          b"x"]
HEL, LO, ST, OP, MORE, END, EURO1, EURO2, EURO3, S, X = range(128, 128 + len(PIECES))
PROMPT = b"ab"  # ids 97, 98


def scripted(*continuation: int, maximum_context: int = 64):
    """A generator whose greedy output after PROMPT is ``continuation`` (then id 0s)."""
    tokenizer = ascii_tokenizer(PIECES)
    model = BigramModel(chain(98, *continuation), tokenizer.vocabulary_size, maximum_context)
    engine = RecordingEngine(model)
    return TextGenerator(engine, tokenizer), engine


def test_generation_returns_exact_ids_bytes_and_text_and_ends_at_the_length():
    generator, _ = scripted(HEL, LO, MORE)
    result = generator.generate(PROMPT, max_new_tokens=3)
    assert result.prompt_token_ids == (97, 98)
    assert result.generated_token_ids == (HEL, LO, MORE)
    assert result.token_ids == (97, 98, HEL, LO, MORE)
    assert result.raw_bytes == b"abHello  more"
    assert result.generated_bytes == b"Hello  more"
    assert (result.prompt_text, result.generated_text, result.text) == (
        "ab", "Hello  more", "abHello  more")
    assert (result.finish_reason, result.stop_sequence) == ("length", None)


def test_streamed_events_carry_each_token_and_concatenate_to_the_text():
    generator, _ = scripted(HEL, LO, ST, OP, MORE)
    events = []
    result = generator.generate(PROMPT, max_new_tokens=5, stop="STOP", on_token=events.append)
    assert [(e.index, e.token_id, e.text, e.finish_reason) for e in events] == [
        (0, HEL, "Hel", None),
        (1, LO, "lo ", None),
        (2, ST, "", None),  # "ST" may begin "STOP": held back
        (3, OP, "", "stop"),
    ]
    assert result.generated_text == "Hello " == "".join(e.text for e in events)
    assert result.generated_token_ids == (HEL, LO, ST, OP)  # the stop's tokens are listed
    assert (result.finish_reason, result.stop_sequence) == ("stop", "STOP")


def test_a_false_start_of_a_stop_sequence_is_released_once_it_diverges():
    generator, _ = scripted(HEL, S, X, LO)
    stream = generator.stream(PROMPT, max_new_tokens=4, stop=("STOP", "Sy"))
    assert [event.text for event in stream] == ["Hel", "", "Sx", "lo "]
    assert stream.result.generated_text == "HelSxlo "
    assert stream.result.finish_reason == "length"


def test_the_end_token_ends_generation_without_its_bytes_in_the_text():
    generator, _ = scripted(HEL, LO, END, MORE)
    events = []
    config = GenerationConfig(max_new_tokens=10, end_token_id=END)
    result = generator.generate(PROMPT, config, on_token=events.append)
    assert result.generated_token_ids == (HEL, LO, END)
    assert result.generated_text == "Hello "
    assert result.finish_reason == "end_token"
    assert events[-1].finish_reason == "end_token" and events[-1].text == ""


def test_a_character_split_over_three_tokens_streams_as_one_delta():
    generator, _ = scripted(EURO1, EURO2, EURO3, HEL)
    stream = generator.stream(PROMPT, max_new_tokens=4)
    assert [event.text for event in stream] == ["", "", "\u20ac", "Hel"]
    assert stream.result.generated_text == "\u20acHel"


def test_an_incomplete_character_at_the_end_becomes_one_replacement_character():
    generator, _ = scripted(HEL, EURO1, EURO2)
    stream = generator.stream(PROMPT, max_new_tokens=3)
    assert [event.text for event in stream] == ["Hel", "", "\ufffd"]
    assert stream.result.generated_bytes == b"Hel\xe2\x82"


def test_zero_new_tokens_runs_no_step():
    generator, engine = scripted(HEL)
    result = generator.generate(PROMPT, max_new_tokens=0)
    assert result.generated_token_ids == () and result.finish_reason == "length"
    assert engine.steps == []


def test_prompts_may_be_text_bytes_or_ids_and_the_sampler_may_be_given():
    generator, _ = scripted(HEL, LO)
    expected = generator.generate(PROMPT, max_new_tokens=2)
    assert generator.generate("ab", max_new_tokens=2) == expected
    assert generator.generate([97, 98], max_new_tokens=2, sampler=Greedy()) == expected
    assert generator.generate(bytearray(PROMPT), GenerationConfig(max_new_tokens=2)) == expected


def test_closing_a_stream_early_frees_its_engine_stream():
    generator, engine = scripted(HEL, LO, MORE)
    with generator.stream(PROMPT, max_new_tokens=3) as stream:
        assert next(stream).token_id == HEL
        assert engine.capacity().open_stream_count == 1
        with pytest.raises(RuntimeError, match="not been consumed"):
            stream.result  # noqa: B018
    assert engine.capacity().open_stream_count == 0


def test_bad_prompts_are_rejected_before_any_step():
    generator, engine = scripted(HEL)
    with pytest.raises(ValueError, match="at least one token"):
        generator.generate("")
    with pytest.raises(ValueError, match="prompt token 1 is 500, not below the vocabulary"):
        generator.generate([1, 500])
    with pytest.raises(TypeError, match="prompt must be a str, bytes or a sequence"):
        generator.generate(3.5)
    with pytest.raises(ValueError, match="end_token_id 999 is not below the vocabulary size"):
        generator.generate("ab", end_token_id=999)
    assert engine.steps == []


def test_a_padded_model_vocabulary_never_samples_its_padding_ids():
    # 128 ASCII tokens, 200 model ids: the bigram's favourite after "a" is padding id 150,
    # which no text encodes to; sampling stays within the tokenizer's ids.
    model = BigramModel({ord("a"): 150}, vocabulary_size=200, maximum_context=8)
    generator = TextGenerator(model, ascii_tokenizer())
    greedy = generator.generate("a", max_new_tokens=3)
    assert all(token < 128 for token in greedy.generated_token_ids)
    assert greedy.generated_token_ids[0] == 0  # the best id below 128: all tie, the lowest
    sampled = generator.generate("a", max_new_tokens=20, temperature=5.0, seed=3)
    assert len(sampled.generated_token_ids) == 20
    assert all(token < 128 for token in sampled.generated_token_ids)


def test_the_tokenizer_must_match_the_models_vocabulary():
    model = BigramModel({}, vocabulary_size=10, maximum_context=8)
    with pytest.raises(ValueError, match="the tokenizer has 128 tokens but the model's "
                                         "vocabulary_size is 10"):
        TextGenerator(model, ascii_tokenizer())


# ---- the exact generator sequence and rollover ---------------------------------------------


def test_rollover_resets_and_replays_the_newest_context_tokens():
    tokenizer = PieceTokenizer([bytes([i]) for i in range(16)])
    model = BigramModel({i: i + 1 for i in range(15)}, 16, maximum_context=4)
    engine = RecordingEngine(model)
    result = TextGenerator(engine, tokenizer).generate([1, 2], max_new_tokens=5)
    assert result.generated_token_ids == (3, 4, 5, 6, 7)
    assert [rows[0][1] for rows in engine.steps] == [
        [1, 2],  # prefill
        [3],  # size 3
        [4],  # size 4: full
        [2, 3, 4, 5],  # reset, replay the newest 4 tokens
        [3, 4, 5, 6],  # full again: reset and replay (7, the last sample, is never fed)
    ]
    assert engine.resets == [0, 0]


def test_a_prompt_longer_than_the_context_prefills_only_its_newest_tokens():
    tokenizer = PieceTokenizer([bytes([i]) for i in range(16)])
    model = BigramModel({i: i + 1 for i in range(15)}, 16, maximum_context=4)
    engine = RecordingEngine(model)
    result = TextGenerator(engine, tokenizer).generate([0, 1, 2, 3, 4, 5], max_new_tokens=3)
    assert result.generated_token_ids == (6, 7, 8)
    assert [rows[0][1] for rows in engine.steps] == [[2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]]


def reference_greedy(model, prompt: list[int], count: int) -> list[int]:
    """An independent oracle: one fresh forward over the newest C tokens per new token."""
    ids, context = list(prompt), model.config.maximum_context
    vocabulary = model.config.vocabulary_size
    for _ in range(count):
        window = ids[-context:]
        with model(window) as logits:
            values = logits.tolist()[(len(window) - 1) * vocabulary :]
        ids.append(max(range(vocabulary), key=lambda token: (values[token], -token)))
    return ids[len(prompt) :]


def tiny_byte_setup(tiny_config):
    corpus = "abcdefghijklmnopqrstuvwxyz .,!?\n"
    tokenizer = Tokenizer(corpus)
    model = DecoderOnlyTransformer(
        dataclasses.replace(tiny_config, vocabulary_size=tokenizer.vocab_size))
    return model, tokenizer


def test_the_native_model_through_the_fallback_matches_fresh_forwards_over_the_window(
    tiny_config,
):
    model, tokenizer = tiny_byte_setup(tiny_config)
    with model, tokenizer, TextGenerator(FullForwardEngine(model), tokenizer) as generator:
        prompt = tokenizer.encode("the quick brown fox")  # longer than the context of 8
        result = generator.generate(prompt, max_new_tokens=12)
        assert list(result.generated_token_ids) == reference_greedy(model, prompt, 12)
        short = tokenizer.encode("ab")
        assert list(generator.generate(short, max_new_tokens=10).generated_token_ids) == (
            reference_greedy(model, short, 10))


def test_sampling_with_a_seed_is_reproducible_through_the_generator(tiny_config):
    model, tokenizer = tiny_byte_setup(tiny_config)
    with model, tokenizer, TextGenerator(model, tokenizer) as generator:
        config = GenerationConfig(max_new_tokens=16, temperature=1.5, top_k=10, seed=3)
        first = generator.generate("hello", config)
        assert generator.generate("hello", config) == first
        assert generator.generate("hello", config.replace(seed=4)) != first


# ---- GenerationConfig ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error", "fragment"),
    [
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be in [0,"),
        ({"max_new_tokens": "3"}, TypeError, "max_new_tokens must be an int, not str"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an int, not bool"),
        ({"temperature": -0.5}, ValueError, "temperature must be finite and >= 0, got -0.5"),
        ({"temperature": float("nan")}, ValueError, "temperature must be finite and >= 0"),
        ({"top_k": 5}, ValueError, "temperature 0 is greedy decoding, which takes no top_k"),
        ({"top_p": 0.9}, ValueError, "temperature 0 is greedy decoding, which takes no top_p"),
        ({"temperature": 1.0, "top_k": 0}, ValueError, "top_k must be in [1,"),
        ({"temperature": 1.0, "top_p": 2.0}, ValueError, "top_p must be in (0, 1], got 2.0"),
        ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty must be finite and > 0"),
        ({"seed": -3}, ValueError, "seed must be in [0,"),
        ({"stop": [""]}, ValueError, "stop[0] must not be empty"),
        ({"stop": ["a", 1]}, TypeError, "stop[1] must be a str, not int"),
        ({"stop": b"x"}, TypeError, "stop must be a str or a sequence of str, not bytes"),
        ({"end_token_id": -1}, ValueError, "end_token_id must be in [0,"),
    ],
)
def test_generation_config_rejects_bad_fields_by_name(fields, error, fragment):
    with pytest.raises(error) as caught:
        GenerationConfig(**fields)
    assert fragment in str(caught.value)


def test_generation_config_normalises_stop_sequences_and_picks_its_sampler():
    config = GenerationConfig(stop="END")
    assert config.stop == ("END",)
    assert GenerationConfig(stop=["a", "b", "a"]).stop == ("a", "b")
    assert isinstance(config.make_sampler(), Greedy)
    sampler = GenerationConfig(temperature=0.7, top_k=3, top_p=0.5, seed=9).make_sampler()
    assert (sampler.temperature, sampler.top_k, sampler.top_p, sampler.seed) == (0.7, 3, 0.5, 9)
