"""cross_entropy_time_range: the loss over one time slice of every row, against a pure-Python
and (when importable) a PyTorch oracle; its argument conversion and every error rule."""

from __future__ import annotations

import math

import pytest

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    STATUS_OUT_OF_RANGE,
    Adam,
    DecoderOnlyTransformer,
    cross_entropy,
    cross_entropy_time_range,
)

from support import native_error

VOCABULARY = 32  # the tiny model's
TOKENS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
TARGETS = [[2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13]]
BATCH, TIME = 2, 6
SLICES = [(0, 1), (1, 3), (2, 4), (5, 1), (0, TIME)]


def sliced_cross_entropy(logits: list[float], targets: list[int], offset: int, count: int) -> float:
    """The oracle: mean over b and t in [offset, offset+count) of logsumexp(row) - row[target],
    in double precision, over flat logits [B, T, V] and flat targets [B, T]."""
    total = 0.0
    for b in range(BATCH):
        for t in range(offset, offset + count):
            position = b * TIME + t
            row = logits[position * VOCABULARY : (position + 1) * VOCABULARY]
            largest = max(row)
            log_sum = largest + math.log(sum(math.exp(value - largest) for value in row))
            total += log_sum - row[targets[position]]
    return total / (BATCH * count)


def flat(rows: list[list[int]]) -> list[int]:
    return [value for row in rows for value in row]


@pytest.mark.parametrize(("offset", "count"), SLICES)
def test_the_loss_is_the_mean_cross_entropy_of_the_slice(model, offset, count):
    with model(TOKENS) as logits, cross_entropy_time_range(logits, TARGETS, offset, count) as loss:
        assert loss.shape == ()
        expected = sliced_cross_entropy(logits.tolist(), flat(TARGETS), offset, count)
        assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_the_whole_time_range_equals_cross_entropy(model):
    with (
        model(TOKENS) as logits,
        cross_entropy_time_range(logits, TARGETS, 0, TIME) as ranged,
        cross_entropy(logits, TARGETS) as whole,
    ):
        assert ranged.item() == pytest.approx(whole.item(), rel=1e-6)


def test_targets_may_be_flat_nested_or_numpy(model):
    with model(TOKENS) as logits, cross_entropy_time_range(logits, TARGETS, 1, 2) as nested:
        with cross_entropy_time_range(logits, flat(TARGETS), 1, 2) as flat_loss:
            assert flat_loss.item() == nested.item()
        numpy = pytest.importorskip("numpy")
        with cross_entropy_time_range(
            logits, numpy.array(TARGETS, dtype=numpy.int64), numpy.int64(1), 2
        ) as from_numpy:
            assert from_numpy.item() == nested.item()


def test_targets_outside_the_slice_do_not_change_the_loss(model):
    changed = [row[:] for row in TARGETS]
    for row in changed:
        row[0] = (row[0] + 9) % VOCABULARY
        row[5] = (row[5] + 4) % VOCABULARY
    with (
        model(TOKENS) as logits,
        cross_entropy_time_range(logits, TARGETS, 1, 4) as reference,
        cross_entropy_time_range(logits, changed, 1, 4) as other,
    ):
        assert other.item() == reference.item()


def _parameters_after_a_step(tiny_config, targets) -> list[float]:
    with DecoderOnlyTransformer(tiny_config) as trained:
        parameters = trained.parameters()
        with Adam(parameters, learning_rate=1e-2) as adam:
            with trained(TOKENS) as logits, cross_entropy_time_range(logits, targets, 2, 3) as loss:
                loss.backward()
            adam.step()
        return parameters.flat_values()


def test_backward_ignores_the_targets_outside_the_slice(tiny_config):
    outside = [row[:] for row in TARGETS]
    inside = [row[:] for row in TARGETS]
    for row in outside:
        row[1] = (row[1] + 3) % VOCABULARY
    inside[1][3] = (inside[1][3] + 1) % VOCABULARY
    reference = _parameters_after_a_step(tiny_config, TARGETS)
    assert _parameters_after_a_step(tiny_config, outside) == reference
    assert _parameters_after_a_step(tiny_config, inside) != reference


def test_the_loss_matches_pytorch_on_every_slice(model):
    torch = pytest.importorskip("torch")
    with model(TOKENS) as logits:
        z = torch.tensor(logits.tolist(), dtype=torch.float64).reshape(BATCH, TIME, VOCABULARY)
        y = torch.tensor(TARGETS)
        for offset, count in SLICES:
            window = slice(offset, offset + count)
            expected = torch.nn.functional.cross_entropy(
                z[:, window, :].reshape(-1, VOCABULARY), y[:, window].reshape(-1)
            )
            with cross_entropy_time_range(logits, TARGETS, offset, count) as loss:
                assert loss.item() == pytest.approx(expected.item(), rel=1e-5), (offset, count)


# ---- Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, "1", None, True, [1]])
def test_offset_and_count_must_be_ints(model, bad):
    with model(TOKENS) as logits:
        with pytest.raises(TypeError, match="offset must be an int"):
            cross_entropy_time_range(logits, TARGETS, bad, 1)
        with pytest.raises(TypeError, match="count must be an int"):
            cross_entropy_time_range(logits, TARGETS, 0, bad)


def test_a_negative_offset_or_a_count_below_one_is_a_value_error(model):
    with model(TOKENS) as logits:
        with pytest.raises(ValueError, match="offset must be in"):
            cross_entropy_time_range(logits, TARGETS, -1, 1)
        with pytest.raises(ValueError, match="count must be in"):
            cross_entropy_time_range(logits, TARGETS, 0, 0)
        with pytest.raises(ValueError, match="offset must be in"):
            cross_entropy_time_range(logits, TARGETS, 1 << 64, 1)


def test_logits_must_be_a_variable():
    with pytest.raises(TypeError, match="logits must be a Variable"):
        cross_entropy_time_range([[[0.0, 1.0]]], [1], 0, 1)


def test_logits_of_another_rank_are_a_native_invalid_argument(model):
    with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as scalar:
        error = native_error(lambda: cross_entropy_time_range(scalar, [0], 0, 1))
        assert error.status == STATUS_INVALID_ARGUMENT
        assert "rank 3" in error.detail


@pytest.mark.parametrize(
    ("offset", "count"), [(0, TIME + 1), (4, 3), (TIME, 1), ((1 << 64) - 1, 2)]
)
def test_a_range_past_the_end_is_a_native_out_of_range(model, offset, count):
    with model(TOKENS) as logits:
        error = native_error(lambda: cross_entropy_time_range(logits, TARGETS, offset, count))
        assert error.status == STATUS_OUT_OF_RANGE
        assert f"exceeds T = {TIME}" in error.detail


def test_a_target_count_other_than_batch_times_time_is_a_native_invalid_argument(model):
    sliced = [row[1:3] for row in TARGETS]  # B*count ids: the slice's targets only
    with model(TOKENS) as logits:
        error = native_error(lambda: cross_entropy_time_range(logits, flat(sliced), 1, 2))
        assert error.status == STATUS_INVALID_ARGUMENT
        assert "4 targets given" in error.detail
        with pytest.raises(ValueError, match="leading shape"):
            cross_entropy_time_range(logits, sliced, 1, 2)


def test_a_target_outside_the_vocabulary_is_a_native_out_of_range_even_outside_the_slice(model):
    targets = flat(TARGETS)
    targets[11] = VOCABULARY  # b = 1, t = 5: outside [1, 3)
    with model(TOKENS) as logits:
        error = native_error(lambda: cross_entropy_time_range(logits, targets, 1, 2))
        assert error.status == STATUS_OUT_OF_RANGE
        assert f"targets[11] = {VOCABULARY}" in error.detail
