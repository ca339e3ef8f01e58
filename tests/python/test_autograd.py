"""Variables, cross-entropy, and the single-use graph contract."""

from __future__ import annotations

import math

import pytest

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    STATUS_OUT_OF_RANGE,
    STATUS_RUNTIME_ERROR,
    Adam,
    Variable,
    cross_entropy,
)

from support import native_error

VOCABULARY = 32  # the tiny model's


def mean_cross_entropy(logits: list[float], targets: list[int]) -> float:
    """The oracle: mean over positions of logsumexp(row) - row[target], in double precision."""
    total = 0.0
    for position, target in enumerate(targets):
        row = logits[position * VOCABULARY : (position + 1) * VOCABULARY]
        largest = max(row)
        log_sum = largest + math.log(sum(math.exp(value - largest) for value in row))
        total += log_sum - row[target]
    return total / len(targets)


def test_a_loss_is_a_scalar_equal_to_the_mean_cross_entropy_of_its_logits(model):
    targets = [[2, 3, 4], [5, 6, 7]]
    with model([[1, 2, 3], [4, 5, 6]]) as logits, cross_entropy(logits, targets) as loss:
        assert loss.shape == ()
        assert loss.rank == 0
        assert loss.numel == 1
        expected = mean_cross_entropy(logits.tolist(), [2, 3, 4, 5, 6, 7])
        assert loss.item() == pytest.approx(expected, rel=1e-5)
        assert loss.tolist() == [loss.item()]


def test_targets_may_be_flat_for_any_batch(model):
    with model([[1, 2], [3, 4]]) as logits:
        with (
            cross_entropy(logits, [[5, 6], [7, 8]]) as nested,
            cross_entropy(logits, [5, 6, 7, 8]) as flat,
        ):
            assert nested.item() == flat.item()


def test_nested_targets_must_mirror_the_leading_logit_shape(model):
    with model([[1, 2, 3], [4, 5, 6]]) as logits:
        with pytest.raises(ValueError, match="leading shape"):
            cross_entropy(logits, [[1, 2], [3, 4], [5, 6]])


def test_a_wrong_target_count_is_a_native_invalid_argument(model):
    with model([1, 2, 3]) as logits:
        assert native_error(lambda: cross_entropy(logits, [1, 2])).status == STATUS_INVALID_ARGUMENT


def test_a_target_outside_the_vocabulary_is_a_native_out_of_range(model):
    with model([1, 2]) as logits:
        assert (
            native_error(lambda: cross_entropy(logits, [1, VOCABULARY])).status
            == STATUS_OUT_OF_RANGE
        )


def test_cross_entropy_needs_a_variable():
    with pytest.raises(TypeError):
        cross_entropy([[0.0, 1.0]], [1])


def test_item_needs_exactly_one_value(model):
    with model([1, 2]) as logits:
        with pytest.raises(ValueError, match="exactly one value"):
            logits.item()


def test_backward_of_a_non_scalar_is_a_native_invalid_argument(model):
    with model([1, 2]) as logits:
        assert native_error(logits.backward).status == STATUS_INVALID_ARGUMENT


def test_a_second_backward_of_one_graph_is_a_native_runtime_error(model):
    with model([1, 2]) as logits, cross_entropy(logits, [2, 3]) as loss:
        loss.backward()
        error = native_error(loss.backward)
        assert error.status == STATUS_RUNTIME_ERROR
        assert "consumed" in error.detail
        assert loss.item() > 0  # values stay readable


def test_a_graph_built_before_an_optimizer_step_is_stale(model):
    with Adam(model.parameters()) as optimizer:
        with model([1, 2]) as logits, cross_entropy(logits, [2, 3]) as loss:
            loss.backward()
            with model([3, 4]) as old_logits, cross_entropy(old_logits, [4, 5]) as old_loss:
                optimizer.step()
                error = native_error(old_loss.backward)
                assert error.status == STATUS_RUNTIME_ERROR
                assert "epoch" in error.detail
                assert math.isfinite(old_loss.item())
        with model([3, 4]) as logits, cross_entropy(logits, [4, 5]) as fresh_loss:
            fresh_loss.backward()


def test_the_loss_shares_the_model_lock(model):
    with model([1, 2]) as logits, cross_entropy(logits, [2, 3]) as loss:
        assert loss._lock is logits._lock is model._lock


def test_variables_have_no_public_constructor():
    with pytest.raises(TypeError):
        Variable()


def test_numpy_values_have_the_variable_shape(model):
    pytest.importorskip("numpy")
    with model([[1, 2, 3]]) as logits:
        values = logits.numpy()
        assert values.shape == (1, 3, VOCABULARY)
        assert values.ravel().tolist() == pytest.approx(logits.tolist())
