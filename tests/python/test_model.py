"""The decoder-only transformer: configuration, policies, forward, parameters, pins."""

from __future__ import annotations

import dataclasses
import math
from array import array

import pytest

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    STATUS_OUT_OF_RANGE,
    STATUS_OVERFLOW,
    STATUS_RUNTIME_ERROR,
    Adam,
    DecoderOnlyTransformer,
    TransformerConfig,
    cross_entropy,
)

from support import native_error


def gpt_parameter_count(config: TransformerConfig) -> int:
    """Scalars of a GPT decoder: embeddings, N blocks (2 LayerNorms, 4 attention projections,
    a two-layer feed-forward network), a final LayerNorm and a biased language-model head."""
    V, C, D, F = (
        config.vocabulary_size,
        config.maximum_context,
        config.model_width,
        config.feed_forward_width,
    )
    block = 2 * (2 * D) + 4 * (D * D + D) + (F * D + F) + (D * F + D)
    return V * D + C * D + config.block_count * block + 2 * D + (V * D + V)


# ---- configuration -------------------------------------------------------------------------


def test_the_config_is_frozen_with_the_documented_defaults():
    config = TransformerConfig(16, 8, 16, 4, 1, 32)
    assert config.random_seed == 5489
    assert config.layer_norm_epsilon == 1e-5
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model_width = 32


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"vocabulary_size": 0}, ValueError),
        ({"model_width": -16}, ValueError),
        ({"head_count": 4.0}, TypeError),
        ({"block_count": True}, TypeError),
        ({"feed_forward_width": "32"}, TypeError),
        ({"random_seed": -1}, ValueError),
        ({"random_seed": 2**32}, ValueError),
        ({"layer_norm_epsilon": 0.0}, ValueError),
        ({"layer_norm_epsilon": math.nan}, ValueError),
        ({"layer_norm_epsilon": True}, TypeError),
    ],
)
def test_config_fields_are_validated_at_construction(tiny_config, change, error):
    with pytest.raises(error):
        dataclasses.replace(tiny_config, **change)


def test_a_width_that_heads_do_not_divide_is_a_native_invalid_argument(tiny_config):
    config = dataclasses.replace(tiny_config, model_width=18)
    assert native_error(lambda: DecoderOnlyTransformer(config)).status == STATUS_INVALID_ARGUMENT


@pytest.mark.parametrize("block_count", [2**40, 2**64 - 1])
def test_a_block_count_whose_parameters_cannot_fit_is_a_native_overflow(tiny_config, block_count):
    # Rejected from the config before any block is allocated (the limit is 2^47 bytes).
    config = dataclasses.replace(tiny_config, block_count=block_count)
    error = native_error(lambda: DecoderOnlyTransformer(config))
    assert error.status == STATUS_OVERFLOW
    assert f"block_count {block_count} too large" in error.detail


def test_the_model_needs_a_transformer_config():
    with pytest.raises(TypeError):
        DecoderOnlyTransformer({"vocabulary_size": 8})


# ---- policies and backend -------------------------------------------------------------------


def test_a_new_model_is_on_cpu_with_materialized_attention_and_no_checkpointing(model, tiny_config):
    assert model.config == tiny_config
    assert model.backend == "cpu"
    assert model.full_sequence_attention == "materialized"
    assert model.activation_checkpointing == "disabled"


def test_policies_can_be_chosen_at_construction_and_changed_later(tiny_config):
    with DecoderOnlyTransformer(
        tiny_config, attention="flash", activation_checkpointing="transformer_block"
    ) as model:
        assert model.full_sequence_attention == "flash"
        assert model.activation_checkpointing == "block"
        model.set_full_sequence_attention("materialized")
        model.set_activation_checkpointing("disabled")
        assert model.full_sequence_attention == "materialized"
        assert model.activation_checkpointing == "disabled"
        model.set_activation_checkpointing("block")
        assert model.activation_checkpointing == "block"


@pytest.mark.parametrize(
    ("keywords", "error"),
    [
        ({"attention": "sparse"}, ValueError),
        ({"attention": 1}, TypeError),
        ({"activation_checkpointing": "layer"}, ValueError),
    ],
)
def test_unknown_policies_are_rejected_before_creating_a_model(tiny_config, keywords, error):
    with pytest.raises(error):
        DecoderOnlyTransformer(tiny_config, **keywords)


def test_to_returns_the_model_itself(model):
    assert model.to("cpu") is model
    assert model.to(0) is model


# ---- forward -------------------------------------------------------------------------------


def test_a_flat_row_is_a_batch_of_one(model):
    with model([1, 2, 3]) as logits:
        assert logits.shape == (1, 3, 32)
        assert logits.rank == 3
        assert logits.numel == 96
        assert logits.backend == "cpu"


def test_batches_accept_lists_and_uint32_arrays_with_identical_results(model):
    with (
        model([[1, 2, 3], [4, 5, 6]]) as from_lists,
        model([array("I", [1, 2, 3]), array("I", [4, 5, 6])]) as from_arrays,
    ):
        assert from_lists.shape == (2, 3, 32)
        assert from_lists.to_array() == from_arrays.to_array()


def test_each_row_of_a_batch_is_computed_independently(model):
    with model([[1, 2, 3], [4, 5, 6]]) as batch, model([4, 5, 6]) as second_row:
        assert batch.tolist()[96:] == pytest.approx(second_row.tolist(), abs=1e-5)


def test_numpy_token_batches_are_accepted(model):
    numpy = pytest.importorskip("numpy")
    with model(numpy.array([[1, 2], [3, 4]], dtype=numpy.uint32)) as logits:
        assert logits.numpy().shape == (2, 2, 32)


def test_the_same_seed_gives_the_same_logits(tiny_config):
    with (
        DecoderOnlyTransformer(tiny_config) as first,
        DecoderOnlyTransformer(tiny_config) as second,
    ):
        with first([1, 2]) as a, second([1, 2]) as b:
            assert a.to_array() == b.to_array()
    other_seed = dataclasses.replace(tiny_config, random_seed=8)
    with DecoderOnlyTransformer(tiny_config) as first, DecoderOnlyTransformer(other_seed) as second:
        with first([1, 2]) as a, second([1, 2]) as b:
            assert a.to_array() != b.to_array()


def test_flash_and_materialized_attention_agree(tiny_config):
    tokens = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]]
    with (
        DecoderOnlyTransformer(tiny_config) as materialized,
        DecoderOnlyTransformer(tiny_config, attention="flash") as flash,
    ):
        with materialized(tokens) as expected, flash(tokens) as actual:
            assert actual.tolist() == pytest.approx(expected.tolist(), abs=1e-5)


def test_sequences_longer_than_the_context_are_a_native_invalid_argument(model):
    error = native_error(lambda: model(list(range(9))))
    assert error.status == STATUS_INVALID_ARGUMENT
    assert "maximum context" in error.detail


def test_an_empty_sequence_is_a_native_invalid_argument(model):
    assert native_error(lambda: model([])).status == STATUS_INVALID_ARGUMENT
    assert native_error(lambda: model([[], []])).status == STATUS_INVALID_ARGUMENT


def test_an_id_outside_the_vocabulary_is_a_native_out_of_range(model):
    assert native_error(lambda: model([1, 32])).status == STATUS_OUT_OF_RANGE


@pytest.mark.parametrize(
    ("tokens", "error"),
    [([1, -2], ValueError), ([1, 2.5], TypeError), ([[1, 2], [3]], ValueError), ("ab", TypeError)],
)
def test_malformed_token_batches_are_rejected_in_python(model, tokens, error):
    with pytest.raises(error):
        model(tokens)


# ---- parameters ----------------------------------------------------------------------------


def test_the_parameter_list_describes_every_parameter(model, tiny_config):
    with model.parameters() as parameters:
        assert len(parameters) == len(parameters.names) == len(parameters.shapes)
        assert parameters.backend == "cpu"
        assert parameters.names[0] == "token_embedding.weight"
        assert parameters.shapes[0] == (tiny_config.vocabulary_size, tiny_config.model_width)
        assert len(set(parameters.names)) == len(parameters)
        assert parameters.total_numel == sum(math.prod(shape) for shape in parameters.shapes)
        assert parameters.total_numel == gpt_parameter_count(tiny_config)
        assert len(parameters.flat_values()) == parameters.total_numel
    assert model.parameter_count == gpt_parameter_count(tiny_config)


def test_loaded_values_replace_the_parameters(model):
    with model.parameters() as parameters:
        zeros = array("f", bytes(4 * parameters.total_numel))
        parameters.load_flat_values(zeros)
        assert parameters.flat_values() == zeros
        with model([1, 2]) as logits:
            # All weights and biases zero: every logit is zero.
            assert logits.tolist() == [0.0] * 64


@pytest.mark.parametrize("fault", ["short", "non-finite"])
def test_a_rejected_load_changes_nothing(model, fault):
    with model.parameters() as parameters:
        before = parameters.flat_values()
        values = array("f", before)
        if fault == "short":
            values.pop()
        else:
            values[len(values) // 2] = math.inf
        error = native_error(lambda: parameters.load_flat_values(values))
        assert error.status == STATUS_INVALID_ARGUMENT
        assert parameters.flat_values() == before


def test_loaded_values_that_float32_cannot_hold_change_nothing(model):
    with model.parameters() as parameters:
        before = parameters.flat_values()
        too_large = list(before)
        too_large[3] = 1e39
        with pytest.raises(ValueError, match=r"values\[3\] = 1e\+39 does not fit in float32"):
            parameters.load_flat_values(too_large)
        assert parameters.flat_values() == before


def test_loaded_values_that_contain_themselves_change_nothing(model):
    with model.parameters() as parameters:
        before = parameters.flat_values()
        cyclic: list = []
        cyclic.append(cyclic)
        with pytest.raises(ValueError, match="values contains itself"):
            parameters.load_flat_values(cyclic)
        assert parameters.flat_values() == before


def test_an_open_variable_pins_the_model(model):
    with model.parameters() as parameters, model([1, 2]) as logits:
        values = parameters.flat_values()
        assert (
            native_error(lambda: parameters.load_flat_values(values)).status == STATUS_RUNTIME_ERROR
        )
        assert native_error(lambda: model.to("cpu")).status == STATUS_RUNTIME_ERROR
        logits.close()
        parameters.load_flat_values(values)
        assert model.to("cpu") is model


def test_an_open_optimizer_pins_the_model(model):
    with model.parameters() as parameters:
        values = parameters.flat_values()
        with Adam(parameters):
            assert native_error(lambda: model.to("cpu")).status == STATUS_RUNTIME_ERROR
            error = native_error(lambda: parameters.load_flat_values(values))
            assert error.status == STATUS_RUNTIME_ERROR
        parameters.load_flat_values(values)


def test_a_pin_diagnostic_names_the_failing_function_once(model):
    # The boundary prefixes "<function>: " to every message; the pin check must not repeat it.
    with model([1, 2]):
        detail = native_error(lambda: model.to("cpu")).detail
    assert detail.startswith("rt_model_to: ")
    assert detail.count("rt_model_to") == 1, detail


def test_derived_objects_outlive_the_model_wrapper(tiny_config):
    model = DecoderOnlyTransformer(tiny_config)
    parameters = model.parameters()
    optimizer = Adam(model.parameters())
    logits = model([[1, 2, 3]])
    model.close()
    assert model.closed
    with pytest.raises(RuntimeError, match="DecoderOnlyTransformer is closed"):
        model([1])
    with parameters, optimizer, logits:
        with cross_entropy(logits, [[2, 3, 4]]) as loss:
            loss.backward()
        assert optimizer.step().step == 1
        assert len(parameters.flat_values()) == gpt_parameter_count(tiny_config)


def test_huge_finite_weights_name_non_finite_activations_not_an_internal_op(model):
    with model.parameters() as parameters:
        parameters.load_flat_values(array("f", [1e12]) * parameters.total_numel)
    error = native_error(lambda: model([1, 2, 3]))
    # A domain error of the model (the C ABI reports domain errors as invalid_argument).
    assert error.status == STATUS_INVALID_ARGUMENT
    assert "non-finite activations in block 0" in str(error)
    assert "DecoderOnlyTransformer::forward" in str(error)
