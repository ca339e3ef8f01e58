"""Adam: options, steps and clipping, zeroing, storage layouts, exact state round trips."""

from __future__ import annotations

import dataclasses
import gc
import math
import re
from array import array

import pytest

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    STATUS_RUNTIME_ERROR,
    Adam,
    AdamOptions,
    AdamState,
    AdamStepStats,
    DecoderOnlyTransformer,
    cross_entropy,
)

from support import native_error

TOKENS = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
TARGETS = [[2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]


def train_step(model, optimizer) -> tuple[float, AdamStepStats]:
    """One forward/backward/step on the fixed batch; returns the pre-update loss and stats."""
    with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
        value = loss.item()
        loss.backward()
    return value, optimizer.step()


# ---- options -------------------------------------------------------------------------------


def test_options_have_the_documented_defaults():
    assert AdamOptions() == AdamOptions(
        learning_rate=1e-3,
        beta1=0.9,
        beta2=0.999,
        epsilon=1e-8,
        maximum_gradient_norm=1.0,
        state_storage="contiguous",
        page_size=4096,
    )


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("learning_rate", 0.0, ValueError),
        ("learning_rate", -1e-3, ValueError),
        ("learning_rate", math.inf, ValueError),
        ("learning_rate", "1e-3", TypeError),
        ("beta1", 0.0, ValueError),
        ("beta2", 1.0, ValueError),
        ("beta1", math.nan, ValueError),
        ("epsilon", 0.0, ValueError),
        ("maximum_gradient_norm", 0.0, ValueError),
        ("maximum_gradient_norm", True, TypeError),
        ("state_storage", "sharded", ValueError),
        ("page_size", 0, ValueError),
        ("page_size", 64.0, TypeError),
    ],
)
def test_options_are_validated_at_construction(field, value, error):
    with pytest.raises(error):
        AdamOptions(**{field: value})


def test_an_infinite_maximum_gradient_norm_disables_clipping(model):
    with Adam(model.parameters(), maximum_gradient_norm=math.inf) as optimizer:
        _, stats = train_step(model, optimizer)
        assert stats.gradient_norm > 1.0
        assert stats.clip_scale == 1.0


def test_a_learning_rate_that_rounds_to_zero_in_float32_is_a_native_invalid_argument(model):
    error = native_error(lambda: Adam(model.parameters(), learning_rate=1e-50))
    assert error.status == STATUS_INVALID_ARGUMENT


def test_options_may_be_given_as_keywords_or_as_an_object_but_not_both(model):
    with model.parameters() as parameters:
        with Adam(parameters, learning_rate=1e-2, beta1=0.8) as optimizer:
            assert optimizer.options == AdamOptions(learning_rate=1e-2, beta1=0.8)
        with Adam(parameters, AdamOptions(epsilon=1e-6)) as optimizer:
            assert optimizer.options.epsilon == 1e-6
        with pytest.raises(TypeError):
            Adam(parameters, AdamOptions(), learning_rate=1e-2)
        with pytest.raises(TypeError):
            Adam(parameters, {"learning_rate": 1e-2})
        with pytest.raises(TypeError):
            Adam(parameters, momentum=0.9)
    with pytest.raises(TypeError):
        Adam(model)


# ---- steps ---------------------------------------------------------------------------------


def test_a_temporary_parameter_list_is_enough(model, tiny_config):
    optimizer = Adam(model.parameters())
    gc.collect()
    with optimizer:
        # Tensors: 2 embeddings; per block 2 LayerNorms, 4 attention and 2 feed-forward
        # projections, each with 2 tensors; the final LayerNorm (2) and the head (2).
        assert optimizer.parameter_count == 2 + 16 * tiny_config.block_count + 2 + 2
        _, stats = train_step(model, optimizer)
        assert stats.step == 1


def test_the_optimizer_reports_the_names_and_shapes_it_optimises(model, tiny_config):
    with model.parameters() as parameters:
        names, shapes = parameters.names, parameters.shapes
    with Adam(model.parameters()) as optimizer:
        assert optimizer.parameter_names == names
        assert optimizer.parameter_shapes == shapes
        assert optimizer.parameter_names[0] == "token_embedding.weight"
        assert optimizer.parameter_shapes[0] == (tiny_config.vocabulary_size,
                                                 tiny_config.model_width)


def test_the_optimizer_knows_which_model_it_updates(model, tiny_config):
    other = DecoderOnlyTransformer(tiny_config)
    optimizer = Adam(model.parameters())
    with other, optimizer:
        assert optimizer.owns_parameters_of(model)
        assert not optimizer.owns_parameters_of(other)
        assert not optimizer.owns_parameters_of(object())
        model.close()
        assert optimizer.owns_parameters_of(model)


def test_a_step_reports_the_global_norm_and_the_clip_scale(model):
    with Adam(model.parameters(), maximum_gradient_norm=0.5) as optimizer:
        assert optimizer.step_count == 0
        _, stats = train_step(model, optimizer)
        assert stats.step == optimizer.step_count == 1
        assert stats.gradient_norm > 0.5
        assert stats.clip_scale == pytest.approx(0.5 / stats.gradient_norm, rel=1e-6)


def test_zeroed_gradients_contribute_nothing(model):
    with Adam(model.parameters()) as optimizer, model.parameters() as parameters:
        with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
            loss.backward()
        optimizer.zero_grad()
        before = parameters.flat_values()
        stats = optimizer.step()
        assert (stats.gradient_norm, stats.clip_scale) == (0.0, 1.0)
        assert parameters.flat_values() == before  # zero moments, zero update
        optimizer.zero_gradients()


def test_thirty_steps_on_one_batch_drive_the_loss_down(model):
    with Adam(model.parameters(), learning_rate=1e-2) as optimizer:
        losses = [train_step(model, optimizer)[0] for _ in range(30)]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.5 * losses[0]


def test_the_optimizer_reports_its_storage(model):
    with model.parameters() as parameters, Adam(parameters) as optimizer:
        assert optimizer.backend == "cpu"
        assert optimizer.parameter_count == len(parameters)
        assert optimizer.state_storage == "contiguous"
        assert optimizer.state_page_size == 4096
        # Two float32 moments per trainable scalar.
        assert optimizer.state_payload_bytes == 2 * 4 * parameters.total_numel


def test_paged_storage_splits_each_parameter_into_pages_with_the_same_math(tiny_config):
    page_size = 100
    with (
        DecoderOnlyTransformer(tiny_config) as contiguous_model,
        DecoderOnlyTransformer(tiny_config) as paged_model,
    ):
        with (
            Adam(contiguous_model.parameters()) as contiguous,
            Adam(paged_model.parameters(), state_storage="paged", page_size=page_size) as paged,
            paged_model.parameters() as parameters,
        ):
            assert paged.state_storage == "paged"
            assert paged.state_page_size == page_size
            assert paged.state_page_count == sum(
                math.ceil(math.prod(shape) / page_size) for shape in parameters.shapes
            )
            assert paged.state_payload_bytes == 2 * 4 * parameters.total_numel
            for _ in range(3):
                train_step(contiguous_model, contiguous)
                train_step(paged_model, paged)
            assert paged.state() == contiguous.state()


def test_the_optimizer_outlives_the_model_wrapper(tiny_config):
    model = DecoderOnlyTransformer(tiny_config)
    optimizer = Adam(model.parameters())
    logits = model(TOKENS)
    model.close()
    with optimizer, logits, cross_entropy(logits, TARGETS) as loss:
        loss.backward()
        assert optimizer.step().step == 1


# ---- state ---------------------------------------------------------------------------------


def test_the_state_holds_counters_powers_values_and_moments(model):
    with Adam(model.parameters()) as optimizer, model.parameters() as parameters:
        train_step(model, optimizer)
        train_step(model, optimizer)
        state = optimizer.state()
        assert state.step_count == 2
        assert state.beta1_power == pytest.approx(0.9**2, rel=1e-6)
        assert state.beta2_power == pytest.approx(0.999**2, rel=1e-6)
        assert state.values == parameters.flat_values()
        assert len(state.first_moments) == len(state.second_moments) == parameters.total_numel
        assert all(moment >= 0.0 for moment in state.second_moments)


def test_a_restored_state_resumes_training_exactly(model):
    with Adam(model.parameters(), learning_rate=1e-2) as optimizer:
        train_step(model, optimizer)
        saved = optimizer.state()
        first_run = [train_step(model, optimizer)[0] for _ in range(3)]
        final_state = optimizer.state()
        optimizer.load_state(saved)
        assert optimizer.step_count == 1
        second_run = [train_step(model, optimizer)[0] for _ in range(3)]
        assert second_run == first_run
        assert optimizer.state() == final_state


def test_the_state_needs_a_clean_step_boundary(model):
    with Adam(model.parameters()) as optimizer:
        with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
            loss.backward()
        assert native_error(optimizer.state).status == STATUS_RUNTIME_ERROR
        optimizer.zero_gradients()
        assert optimizer.state().step_count == 0


def test_an_open_variable_blocks_a_state_load(model):
    with Adam(model.parameters()) as optimizer:
        state = optimizer.state()
        with model([1, 2]):
            assert native_error(lambda: optimizer.load_state(state)).status == STATUS_RUNTIME_ERROR
        optimizer.load_state(state)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda state: dataclasses.replace(
            state,
            values=state.values[:-1],
            first_moments=state.first_moments[:-1],
            second_moments=state.second_moments[:-1],
        ),
        lambda state: dataclasses.replace(state, beta1_power=0.5),  # not beta1 ** step_count
        lambda state: dataclasses.replace(state, values=array("f", [math.nan]) * len(state.values)),
    ],
    ids=["wrong-count", "wrong-power", "not-finite"],
)
def test_an_inconsistent_state_is_a_native_invalid_argument_and_changes_nothing(model, corrupt):
    with Adam(model.parameters()) as optimizer:
        train_step(model, optimizer)
        state = optimizer.state()
        error = native_error(lambda: optimizer.load_state(corrupt(state)))
        assert error.status == STATUS_INVALID_ARGUMENT
        assert optimizer.state() == state


def test_state_arguments_are_validated_in_python(model):
    with Adam(model.parameters()) as optimizer:
        state = optimizer.state()
        with pytest.raises(ValueError, match="differ in length"):
            optimizer.load_state(dataclasses.replace(state, first_moments=array("f", [0.0])))
        with pytest.raises(TypeError):
            optimizer.load_state(tuple(dataclasses.astuple(state)))
        with pytest.raises(ValueError):
            optimizer.load_state(dataclasses.replace(state, step_count=-1))
        with pytest.raises(TypeError):
            optimizer.load_state(dataclasses.replace(state, values=array("d", state.values)))


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("beta1_power", "1", TypeError, "beta1_power must be a real number, not str ('1')"),
        ("beta2_power", None, TypeError, "beta2_power must be a real number, not NoneType (None)"),
        ("beta1_power", True, TypeError, "beta1_power must be a real number, not bool (True)"),
        ("beta2_power", 10**400, ValueError, "beta2_power is too large for a float"),
        ("step_count", 1.0, TypeError, "step_count must be an int, not float (1.0)"),
        ("step_count", 2**64, ValueError, "step_count must be in [0, 18446744073709551616)"),
    ],
)
def test_state_scalars_are_validated_when_the_state_is_made(field, value, error, message):
    fields = {"step_count": 0, "beta1_power": 1.0, "beta2_power": 1.0}
    empty = array("f")
    with pytest.raises(error, match=re.escape(message)):
        AdamState(
            **{**fields, field: value}, values=empty, first_moments=empty, second_moments=empty
        )


def test_state_powers_given_as_ints_are_floats():
    empty = array("f")
    state = AdamState(0, 1, 1, empty, empty, empty)
    assert (type(state.beta1_power), type(state.beta2_power)) == (float, float)


def test_a_state_with_a_cyclic_array_is_a_value_error_and_changes_nothing(model):
    with Adam(model.parameters()) as optimizer:
        train_step(model, optimizer)
        state = optimizer.state()
        cyclic: list = []
        cyclic.append(cyclic)
        with pytest.raises(ValueError, match="state.second_moments contains itself"):
            optimizer.load_state(dataclasses.replace(state, second_moments=cyclic))
        assert optimizer.state() == state


def test_a_state_with_a_moment_float32_cannot_hold_is_a_value_error_and_changes_nothing(model):
    with Adam(model.parameters()) as optimizer:
        train_step(model, optimizer)
        state = optimizer.state()
        moments = list(state.first_moments)
        moments[-1] = -1e39
        expected = f"state.first_moments[{len(moments) - 1}] = -1e+39 does not fit in float32"
        with pytest.raises(ValueError, match=re.escape(expected)):
            optimizer.load_state(dataclasses.replace(state, first_moments=moments))
        assert optimizer.state() == state
