"""Sampling rules (docs/ARCHITECTURE.md, 'Sampling'), checked against
hand-computed draws. ``random.Random(0).random()`` is 0.8444218515250481 and
``random.Random(1).random()`` is 0.13436424411240122: the thresholds below are those times
the kept weights' sum."""

from __future__ import annotations

import math

import pytest

from riftco_transformer.serving import Greedy, TemperatureSampler, apply_repetition_penalty

LN2, LN3 = math.log(2), math.log(3)
# Ranked [2, 1, 0] with weights exp(l - ln 3) = [1, 2/3, 1/3] (sum 2) at T = 1.
THIRDS = [0.0, LN2, LN3]


def test_greedy_takes_the_argmax_and_the_lowest_id_on_a_tie():
    assert Greedy().sample([1.0, 3.0, 2.0, 3.0]) == 1
    assert Greedy().sample([-5.0]) == 0
    assert Greedy().sample([0.0, 0.0, 0.0]) == 0


def test_temperature_sampling_returns_the_first_id_whose_cumulative_weight_passes_the_draw():
    # seed 0: threshold 0.8444 * 2 = 1.689; cumulative 1, 1.667, 2.0 -> the third, id 0.
    assert TemperatureSampler(1.0, seed=0).sample(THIRDS) == 0
    # seed 1: threshold 0.2687; the first cumulative weight 1 passes -> id 2.
    assert TemperatureSampler(1.0, seed=1).sample(THIRDS) == 2


def test_a_lower_temperature_sharpens_the_weights():
    # T = 0.5: weights [1, 4/9, 1/9] (sum 14/9); threshold 0.8444 * 1.556 = 1.314 -> id 1.
    assert TemperatureSampler(0.5, seed=0).sample(THIRDS) == 1


def test_top_k_keeps_only_the_highest_ranked_ids():
    # Kept [2, 1] with weights [1, 2/3]; threshold 0.8444 * 5/3 = 1.407 -> id 1.
    assert TemperatureSampler(1.0, top_k=2, seed=0).sample(THIRDS) == 1
    assert TemperatureSampler(1.0, top_k=1, seed=0).sample(THIRDS) == 2


def test_equal_logits_rank_by_id():
    # Ranked [0, 1], weights [1, 1]: seed 0 (threshold 1.689) -> id 1, seed 1 (0.269) -> id 0.
    assert TemperatureSampler(1.0, seed=0).sample([1.0, 1.0]) == 1
    assert TemperatureSampler(1.0, seed=1).sample([1.0, 1.0]) == 0
    assert TemperatureSampler(1.0, top_k=1, seed=0).sample([1.0, 1.0]) == 0


def test_top_p_keeps_the_shortest_ranked_prefix_reaching_the_probability_mass():
    # Probabilities [1/2, 1/3, 1/6] in rank order [2, 1, 0].
    for seed in range(20):
        assert TemperatureSampler(1.0, top_p=0.45, seed=seed).sample(THIRDS) == 2
    # 0.55 needs ids 2 and 1: weights [1, 2/3], threshold 1.407 at seed 0 -> id 1.
    assert TemperatureSampler(1.0, top_p=0.55, seed=0).sample(THIRDS) == 1
    assert TemperatureSampler(1.0, top_p=0.55, seed=1).sample(THIRDS) == 2
    assert TemperatureSampler(1.0, top_p=1.0, seed=0).sample(THIRDS) == 0


def test_top_p_applies_after_top_k():
    # top_k=2 leaves weights [1, 2/3]: probabilities [0.6, 0.4]; top_p 0.5 keeps id 2 alone.
    for seed in range(10):
        assert TemperatureSampler(1.0, top_k=2, top_p=0.5, seed=seed).sample(THIRDS) == 2


def test_a_draw_at_the_very_top_falls_back_to_the_last_kept_id():
    sampler = TemperatureSampler(1.0, top_k=2)
    sampler._random.random = lambda: 1.0  # threshold = the whole sum: no cumulative passes it
    assert sampler.sample(THIRDS) == 1


def test_each_sampler_owns_its_generator_and_a_seed_repeats_its_draws():
    logits = [0.1 * (i % 7) for i in range(32)]
    first = TemperatureSampler(1.3, top_k=20, top_p=0.9, seed=42)
    second = TemperatureSampler(1.3, top_k=20, top_p=0.9, seed=42)
    other = TemperatureSampler(1.3, top_k=20, top_p=0.9, seed=43)
    draws = [first.sample(logits) for _ in range(50)]
    assert draws == [second.sample(logits) for _ in range(50)]
    assert draws != [other.sample(logits) for _ in range(50)]


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_once():
    assert apply_repetition_penalty([2.0, 1.5, -1.0], [0, 0, 2], 2.0) == [1.0, 1.5, -2.0]
    assert apply_repetition_penalty([2.0, -1.0], [], 2.0) == [2.0, -1.0]
    assert apply_repetition_penalty([2.0, -1.0], [0, 1], 1.0) == [2.0, -1.0]


def test_the_repetition_penalty_changes_what_greedy_and_sampling_choose():
    assert Greedy().sample([2.0, 1.5, -1.0], [0]) == 0
    assert Greedy(repetition_penalty=2.0).sample([2.0, 1.5, -1.0], [0]) == 1
    assert Greedy(repetition_penalty=2.0).sample([-1.0, -1.5], [0]) == 1  # -2.0 < -1.5
    # [2, 2] with id 0 penalised to 1: top_k=1 keeps id 1 only.
    assert TemperatureSampler(1.0, top_k=1, repetition_penalty=2.0).sample([2.0, 2.0], [0]) == 1


@pytest.mark.parametrize(
    ("arguments", "error", "fragment"),
    [
        ({"temperature": 0.0}, ValueError, "temperature must be finite and > 0, got 0.0"),
        ({"temperature": -1}, ValueError, "temperature must be finite and > 0, got -1.0"),
        ({"temperature": math.inf}, ValueError, "temperature must be finite and > 0, got inf"),
        ({"temperature": math.nan}, ValueError, "temperature must be finite and > 0, got nan"),
        ({"temperature": "1"}, TypeError, "temperature must be a real number, not str"),
        ({"temperature": True}, TypeError, "temperature must be a real number, not bool"),
        ({"temperature": 1.0, "top_k": 0}, ValueError, "top_k must be in [1,"),
        ({"temperature": 1.0, "top_k": 2.0}, TypeError, "top_k must be an int, not float"),
        ({"temperature": 1.0, "top_p": 0.0}, ValueError, "top_p must be in (0, 1], got 0.0"),
        ({"temperature": 1.0, "top_p": 1.5}, ValueError, "top_p must be in (0, 1], got 1.5"),
        ({"temperature": 1.0, "top_p": math.nan}, ValueError, "top_p must be in (0, 1], got nan"),
        ({"temperature": 1.0, "top_p": "0.5"}, TypeError, "top_p must be a real number"),
        ({"temperature": 1.0, "seed": -1}, ValueError, "seed must be in [0, 18446744073709551616)"),
        ({"temperature": 1.0, "seed": 2**64}, ValueError, "seed must be in [0,"),
        ({"temperature": 1.0, "seed": "7"}, TypeError, "seed must be an int, not str"),
        ({"temperature": 1.0, "repetition_penalty": 0}, ValueError,
         "repetition_penalty must be finite and > 0, got 0.0"),
        ({"temperature": 1.0, "repetition_penalty": math.inf}, ValueError,
         "repetition_penalty must be finite and > 0, got inf"),
    ],
)
def test_sampler_arguments_are_checked_with_their_name_and_value(arguments, error, fragment):
    with pytest.raises(error) as caught:
        TemperatureSampler(**arguments)
    assert fragment in str(caught.value)


def test_greedy_checks_its_penalty():
    with pytest.raises(ValueError, match=r"repetition_penalty must be finite and > 0, got -2.0"):
        Greedy(repetition_penalty=-2)


def test_top_k_above_the_vocabulary_is_a_value_error_when_sampling():
    with pytest.raises(ValueError, match=r"top_k=4 exceeds the vocabulary size 3"):
        TemperatureSampler(1.0, top_k=4).sample(THIRDS)


@pytest.mark.parametrize(
    ("logits", "error", "fragment"),
    [
        ([], ValueError, "logits must not be empty"),
        ([0.0, math.nan], ValueError, "logits[1] must be finite, got nan"),
        ([math.inf], ValueError, "logits[0] must be finite, got inf"),
        ([0.0, -math.inf], ValueError, "logits[1] must be finite, got -inf"),
        (["1"], TypeError, "logits[0] must be a real number, not str"),
        ([True], TypeError, "logits[0] must be a real number, not bool"),
        ("abc", TypeError, "logits must be a sequence of numbers, not str"),
        (None, TypeError, "logits must be a sequence of numbers, not NoneType"),
    ],
)
@pytest.mark.parametrize("sampler", [Greedy(), TemperatureSampler(1.0)], ids=["greedy", "temp"])
def test_bad_logits_are_rejected_by_both_samplers(sampler, logits, error, fragment):
    with pytest.raises(error) as caught:
        sampler.sample(logits)
    assert fragment in str(caught.value)


def test_a_context_id_outside_the_vocabulary_is_rejected():
    with pytest.raises(ValueError, match=r"context id 3 is outside the vocabulary of 3 logits"):
        Greedy(repetition_penalty=1.5).sample(THIRDS, [3])
    with pytest.raises(TypeError, match=r"context ids must be ints, not str"):
        apply_repetition_penalty(THIRDS, ["a"], 1.5)


def test_native_array_rows_take_the_fast_path_with_the_same_answers():
    from array import array

    from riftco_transformer.serving import Greedy, TemperatureSampler

    values = (0.5, 2.0, -1.0, 2.0, 1.5)
    row = array("f", values)
    assert Greedy().sample(row) == Greedy().sample(values) == 1  # tie: the lowest id
    for top_k in (None, 3):
        assert [TemperatureSampler(0.7, top_k=top_k, seed=s).sample(row) for s in range(20)] == [
            TemperatureSampler(0.7, top_k=top_k, seed=s).sample(values) for s in range(20)
        ]
    bad = array("f", [0.0, 1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match=r"logits\[2\] must be finite"):
        Greedy().sample(bad)
    with pytest.raises(ValueError, match=r"logits\[1\] must be finite"):
        Greedy().sample(array("d", [0.0, float("inf")]))
    with pytest.raises(ValueError, match="must not be empty"):
        Greedy().sample(array("f"))
    # A repetition penalty never modifies the caller's row.
    Greedy(repetition_penalty=2.0).sample(row, context_ids=[1])
    assert list(row) == list(values)


def test_greedy_reads_the_librarys_argmax_only_without_a_penalty():
    from riftco_transformer.native.decode import LogitsRow
    from riftco_transformer.serving import Greedy

    row = LogitsRow("f", [0.5, 2.0, 1.0])
    row.argmax, row.all_finite = 0, True  # deliberately not the true argmax: proves the path
    assert Greedy().sample(row) == 0
    assert Greedy(repetition_penalty=4.0).sample(row, context_ids=[1]) == 2  # scans instead
    row.all_finite = False  # an unchecked row is checked again
    assert Greedy().sample(row) == 0
    bad = LogitsRow("f", [0.0, float("nan")])
    bad.argmax, bad.all_finite = 0, False
    with pytest.raises(ValueError, match=r"logits\[1\] must be finite"):
        Greedy().sample(bad)
