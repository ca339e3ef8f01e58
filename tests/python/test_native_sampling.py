"""The library's samplers against the Python reference (docs/ARCHITECTURE.md, 'Sampling'): the
same id, bit for bit, for random rows and every rule (masks, ties, penalties, top-k, top-p,
min-p, greedy), and log-probabilities against a float64 log-softmax. The reference is the
oracle: it computes each double by the operations the documentation states."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from riftco_transformer import RiftcoTransformerError
from riftco_transformer.native.decode import LogitsRow
from riftco_transformer.native.sampling import (
    row_log_probabilities,
    sample_f32_row,
    sampling_options,
)
from riftco_transformer.serving.sampling import Greedy, TemperatureSampler, draw_unit

VOCABULARY = 301


def random_row(generator: random.Random, vocabulary: int = VOCABULARY) -> array:
    values = [generator.gauss(0.0, 3.0) for _ in range(vocabulary)]
    for _ in range(vocabulary // 10):  # ties, which rank by id
        values[generator.randrange(vocabulary)] = values[generator.randrange(vocabulary)]
    return array("f", values)


def random_sampler(generator: random.Random) -> TemperatureSampler:
    return TemperatureSampler(
        temperature=generator.choice([0.2, 0.7, 1.0, 1.6]),
        top_k=generator.choice([None, 1, 5, 40, VOCABULARY]),
        top_p=generator.choice([None, 0.3, 0.9, 0.999, 1.0]),
        seed=generator.randrange(2**64),
        repetition_penalty=generator.choice([1.0, 1.3, 0.8]),
        presence_penalty=generator.choice([0.0, 0.7, -1.5]),
        frequency_penalty=generator.choice([0.0, 0.4, -0.3]),
        min_p=generator.choice([None, 0.0, 0.05, 0.5]),
    )


def test_the_library_draws_the_reference_ids_bit_for_bit():
    generator = random.Random(7)
    for case in range(300):
        row = random_row(generator)
        sampler = random_sampler(generator)
        context = [generator.randrange(VOCABULARY) for _ in range(generator.randrange(0, 30))]
        prompt_length = generator.randrange(0, len(context) + 1)
        mask = None
        if case % 3 == 0:
            mask = bytes(generator.random() < 0.3 for _ in range(VOCABULARY))
            if not any(mask):
                mask = b"\x01" + mask[1:]
        for draw in range(3):
            expected = sampler.sample_reference(row, context, prompt_length=prompt_length,
                                                mask=mask, draw_index=sampler.draws)
            got = sampler.sample(row, context, prompt_length=prompt_length, mask=mask)
            assert got == expected, (case, draw, sampler)
            if mask is not None:
                assert mask[got]
    # The reference path is what a list row takes: the same ids again.
    row = random_row(generator)
    native, reference = TemperatureSampler(0.9, seed=5), TemperatureSampler(0.9, seed=5)
    assert [native.sample(row) for _ in range(20)] == [reference.sample(list(row))
                                                       for _ in range(20)]


def test_penalised_and_masked_greedy_match_the_reference():
    generator = random.Random(8)
    for _ in range(100):
        row = random_row(generator)
        greedy = Greedy(repetition_penalty=generator.choice([1.0, 1.5]),
                        presence_penalty=generator.choice([0.0, 2.0]),
                        frequency_penalty=generator.choice([0.0, -2.0]))
        context = [generator.randrange(VOCABULARY) for _ in range(12)]
        mask = bytes(generator.random() < 0.5 for _ in range(VOCABULARY)) or None
        if mask is not None and not any(mask):
            mask = None
        expected = greedy.sample(list(row), context, prompt_length=4, mask=mask)
        assert greedy.sample(row, context, prompt_length=4, mask=mask) == expected


def test_draws_follow_the_probabilities():
    # Weights [1, 2, 4, 1] at T = 1 (logits ln w): 20,000 draws, each frequency within 4.5
    # standard deviations of its probability.
    row = array("f", [0.0, math.log(2.0), math.log(4.0), 0.0])
    sampler = TemperatureSampler(1.0, seed=11)
    counts = [0, 0, 0, 0]
    draws = 20000
    for _ in range(draws):
        counts[sampler.sample(row)] += 1
    for count, weight in zip(counts, [1, 2, 4, 1]):
        probability = weight / 8
        deviation = math.sqrt(draws * probability * (1 - probability))
        assert abs(count - draws * probability) <= 4.5 * deviation, counts


def test_draw_units_are_splitmix64():
    # splitmix64's first two outputs for state 0 (its published reference sequence).
    assert draw_unit(0, 0) == (0xE220A8397B1DCDAF >> 11) * 2.0**-53
    assert draw_unit(0, 1) == (0x6E789E6AA1B965F4 >> 11) * 2.0**-53
    assert 0.0 <= draw_unit(2**64 - 1, 2**63) < 1.0


def test_log_probabilities_equal_a_float64_log_softmax():
    generator = random.Random(9)
    row = random_row(generator)
    highest = max(row)
    normaliser = highest + math.log(math.fsum(math.exp(value - highest) for value in row))
    value, top = row_log_probabilities(row, 17, 5)
    assert abs(value - (row[17] - normaliser)) <= 1e-12
    ranked = sorted(range(VOCABULARY), key=lambda token: (-row[token], token))[:5]
    assert [token for token, _ in top] == ranked
    for token, logprob in top:
        assert abs(logprob - (row[token] - normaliser)) <= 1e-12
    assert row_log_probabilities(row, 3) == (pytest.approx(row[3] - normaliser, abs=1e-12), ())


def test_the_library_names_what_it_refuses():
    row = array("f", [0.0, 1.0, 2.0])
    options = sampling_options(1.0)
    for arguments, fragment in [
        ((row, options, [0, 3]), "context[1] = 3 is outside the vocabulary of 3"),
        ((row, options, [0], 2), "prompt_length 2 exceeds the 1 context ids"),
        ((row, options, (), 0, b"\x00\x00\x00"), "the token mask allows no token"),
        ((row, sampling_options(1.0, top_k=4)), "top_k 4 exceeds the vocabulary size 3"),
        ((row, sampling_options(-1.0)), "temperature -1 must be finite and >= 0"),
        ((row, sampling_options(1.0, top_p=0.0)), "top_p 0 must be in (0, 1]"),
        ((row, sampling_options(0.0, top_k=2)), "temperature 0 is greedy decoding"),
        ((array("f", [0.0, math.inf]), options), "logits[1] = inf is not finite"),
    ]:
        with pytest.raises(RiftcoTransformerError, match="invalid_argument") as caught:
            sample_f32_row(*arguments)
        assert fragment in str(caught.value), str(caught.value)
    with pytest.raises(RiftcoTransformerError, match="token 3 is outside the vocabulary"):
        row_log_probabilities(row, 3)
    with pytest.raises(RiftcoTransformerError, match="top_count 4 exceeds the vocabulary"):
        row_log_probabilities(row, 0, 4)
    with pytest.raises(TypeError, match="array"):
        sample_f32_row([0.0, 1.0], options)


def test_decode_rows_sample_in_the_library(monkeypatch):
    # A LogitsRow (the decode path's) goes to the library: the reference is never asked.
    row = LogitsRow("f", [0.0, 1.0, 2.0, 3.0])
    row.argmax, row.all_finite = 3, True
    sampler = TemperatureSampler(1.0, top_p=0.9, seed=1)

    def refuse(*arguments, **keywords):
        raise AssertionError("the Python reference ran")

    monkeypatch.setattr(sampler, "sample_reference", refuse)
    assert sampler.sample(row) in (1, 2, 3)


def test_a_batched_step_samples_rows_like_the_row_sampler(model):
    from riftco_transformer import decode_batch
    from riftco_transformer.native.sampling import RowSamplingPlan, decode_batch_sample

    prompts = [[3, 1, 4], [1, 5]]
    twins = [model.decode_session(), model.decode_session()]
    rows = decode_batch(twins, prompts)
    options = sampling_options(0.9, top_p=0.8, seed=42)
    plans = [RowSamplingPlan(log_probability=True, top_count=3),
             RowSamplingPlan(options, context_ids=[3, 3], draw_index=7, vocabulary_limit=20)]
    sessions = [model.decode_session(), model.decode_session()]
    with pytest.raises(RiftcoTransformerError, match=r"rows\[1\].*top_k 25 exceeds"):
        decode_batch_sample(sessions, prompts, [
            plans[0], RowSamplingPlan(sampling_options(1.0, top_k=25), vocabulary_limit=20)])
    assert [session.size for session in sessions] == [0, 0]  # refused before the step
    first, second = decode_batch_sample(sessions, prompts, plans)
    assert first.status == second.status == "sampled"
    assert first.token == sample_f32_row(rows[0], sampling_options(0.0))
    value, top = row_log_probabilities(rows[0], first.token, 3)
    assert first.log_probability == value and first.top == top
    assert second.token == sample_f32_row(array("f", rows[1][:20]), options, [3, 3], 0, None, 7)
    assert second.log_probability is None and second.top == ()
    fed, sampled = decode_batch_sample(sessions, [[9], [2]], [None, plans[0]])
    assert fed.status == "fed" and sampled.status == "sampled"
    assert [session.size for session in sessions] == [4, 3]
