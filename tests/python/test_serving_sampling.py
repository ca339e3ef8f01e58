"""Sampling rules (docs/ARCHITECTURE.md, 'Sampling'), checked against
hand-computed draws. ``draw_unit(seed, 0)`` is 0.8833108082136426 for seed 0 (splitmix64's
first output for state 0 is 0xE220A8397B1DCDAF, whose top 53 bits times 2**-53 give it),
0.11345034205715454 for seed 3 and 0.43145581774497377 for seed 4: the thresholds below are
those times the kept weights' sum, walked in ascending id order."""

from __future__ import annotations

import math

import pytest

from riftco_transformer.serving import Greedy, TemperatureSampler, apply_repetition_penalty
from riftco_transformer.serving import sampling
from riftco_transformer.serving.sampling import draw_unit

LN2, LN3 = math.log(2), math.log(3)
# Ranked [2, 1, 0] with weights exp(l - ln 3) = [1, 2/3, 1/3] (sum 2) at T = 1.
THIRDS = [0.0, LN2, LN3]


def test_greedy_takes_the_argmax_and_the_lowest_id_on_a_tie():
    assert Greedy().sample([1.0, 3.0, 2.0, 3.0]) == 1
    assert Greedy().sample([-5.0]) == 0
    assert Greedy().sample([0.0, 0.0, 0.0]) == 0


def test_temperature_sampling_returns_the_first_id_whose_cumulative_weight_passes_the_draw():
    # Weights by id [1/3, 2/3, 1] (sum 2); cumulative in id order 1/3, 1, 2.
    # seed 0: threshold 0.8833 * 2 = 1.767 -> id 2; seed 4: 0.863 -> id 1; seed 3: 0.227 -> 0.
    assert TemperatureSampler(1.0, seed=0).sample(THIRDS) == 2
    assert TemperatureSampler(1.0, seed=4).sample(THIRDS) == 1
    assert TemperatureSampler(1.0, seed=3).sample(THIRDS) == 0


def test_draws_are_numbered_per_sampler():
    assert draw_unit(0, 0) == (0xE220A8397B1DCDAF >> 11) * 2.0**-53
    sampler = TemperatureSampler(1.0, seed=0)
    # draw 1 of seed 0: 0.4315 * 2 = 0.863 -> id 1 (cumulative 1/3, 1).
    assert draw_unit(0, 1) == 0.43152799704850997
    assert [sampler.sample(THIRDS), sampler.sample(THIRDS)] == [2, 1]
    assert sampler.draws == 2


def test_a_lower_temperature_sharpens_the_weights():
    # T = 0.5: weights [1/9, 4/9, 1] (sum 14/9); seed 3: threshold 0.1135 * 1.556 = 0.1765,
    # past 1/9 -> id 1 (id 0 at T = 1 above).
    assert TemperatureSampler(0.5, seed=3).sample(THIRDS) == 1


def test_top_k_keeps_only_the_highest_ranked_ids():
    # Kept ids 1, 2 with weights [2/3, 1] (sum 5/3): seed 0 threshold 1.472 -> id 2; seed 3
    # threshold 0.189 -> id 1.
    assert TemperatureSampler(1.0, top_k=2, seed=0).sample(THIRDS) == 2
    assert TemperatureSampler(1.0, top_k=2, seed=3).sample(THIRDS) == 1
    assert TemperatureSampler(1.0, top_k=1, seed=3).sample(THIRDS) == 2


def test_equal_logits_rank_by_id():
    # Weights [1, 1]: seed 0 (threshold 1.767) -> id 1, seed 3 (0.227) -> id 0; top_k=1 keeps
    # the lower id.
    assert TemperatureSampler(1.0, seed=0).sample([1.0, 1.0]) == 1
    assert TemperatureSampler(1.0, seed=3).sample([1.0, 1.0]) == 0
    assert TemperatureSampler(1.0, top_k=1, seed=0).sample([1.0, 1.0]) == 0


def test_top_p_keeps_the_shortest_ranked_prefix_reaching_the_probability_mass():
    # Probabilities [1/6, 1/3, 1/2] by id, ranked [2, 1, 0].
    for seed in range(20):
        assert TemperatureSampler(1.0, top_p=0.45, seed=seed).sample(THIRDS) == 2
    # 0.55 needs ids 2 and 1: as top_k=2 above.
    assert TemperatureSampler(1.0, top_p=0.55, seed=0).sample(THIRDS) == 2
    assert TemperatureSampler(1.0, top_p=0.55, seed=3).sample(THIRDS) == 1
    assert TemperatureSampler(1.0, top_p=1.0, seed=3).sample(THIRDS) == 0  # off


def test_top_p_applies_after_top_k():
    # top_k=2 leaves weights [1, 2/3]: probabilities [0.6, 0.4]; top_p 0.5 keeps id 2 alone.
    for seed in range(10):
        assert TemperatureSampler(1.0, top_k=2, top_p=0.5, seed=seed).sample(THIRDS) == 2


def test_a_draw_at_the_very_top_falls_back_to_the_last_kept_id_of_positive_weight(monkeypatch):
    # A threshold of the whole sum, which no running sum passes (u < 1 makes it rare, not
    # impossible: u * total can round up to the total).
    monkeypatch.setattr(sampling, "draw_unit", lambda seed, index: 1.0)
    assert TemperatureSampler(1.0, top_k=2).sample(THIRDS) == 2
    # The last id weighs exp(-1e6) = 0: the fallback skips it.
    assert TemperatureSampler(1.0).sample([0.0, 0.0, -1e6]) == 1


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
