"""riftco_transformer.programmed: maps, the model, interventions, traces and lifetimes."""

from __future__ import annotations

import copy
import pickle
from array import array

import pytest
from support import native_error

from riftco_transformer import Adam, cross_entropy
from riftco_transformer.programmed import (
    MultilinearMap,
    NeuralLoweringConfig,
    ProgramAugmentedForwardOptions,
    ProgramAugmentedModel,
    ProgramAugmentedModelConfig,
    ProgramBranch,
    ProgramInputLayout,
    ProgramSteering,
    RepresentationTrace,
)

MODULUS = 3
CONFIG = ProgramAugmentedModelConfig(
    vocabulary_size=6, context_length=3, model_width=8, head_count=2, feed_forward_width=16
)
TOKENS = [[1, 2, 0], [0, 1, 1], [2, 2, 4]]
TARGETS = [2, 0, 1, 1, 1, 2, 2, 1, 4]


def addition_values() -> list[float]:
    values = [0.0] * MODULUS**3
    for i in range(MODULUS):
        for j in range(MODULUS):
            values[((i + j) % MODULUS) * MODULUS * MODULUS + i * MODULUS + j] = 1.0
    return values


def addition_map() -> MultilinearMap:
    return MultilinearMap.from_dense(MODULUS, (MODULUS, MODULUS), addition_values())


def branch(map_: MultilinearMap, **overrides) -> ProgramBranch:
    fields = dict(
        source_length=2,
        target_offset=2,
        inputs=(ProgramInputLayout("source_position", 0, 0), ProgramInputLayout("source_position", 1, 1)),
    )
    fields.update(overrides)
    return ProgramBranch(map_, **fields)


def evaluate(values, dims, inputs):
    """The map in pure Python: y_o = Σ T[o,i,j] x_i z_j."""
    out = len(values) // (dims[0] * dims[1])
    return [
        sum(
            values[o * dims[0] * dims[1] + i * dims[1] + j] * inputs[0][i] * inputs[1][j]
            for i in range(dims[0])
            for j in range(dims[1])
        )
        for o in range(out)
    ]


def test_maps_import_dense_and_sparse_and_report_their_values():
    with addition_map() as dense:
        assert (dense.output_dimension, dense.input_dimensions, dense.arity) == (3, (3, 3), 2)
        assert dense.values() == tuple(addition_values())
    indices = array("Q", [5, 20])
    with MultilinearMap.from_sparse(3, (3, 3), indices, array("d", [2.0, -1.0])) as sparse:
        values = sparse.values()
        assert values[5] == 2.0 and values[20] == -1.0 and sum(map(abs, values)) == 3.0
    with MultilinearMap.from_sparse(2, (4,), [], []) as zero:
        assert zero.values() == (0.0,) * 8
    with MultilinearMap.from_dense(2, (), [1.5, -2.0]) as constant:
        assert constant.arity == 0


@pytest.mark.parametrize(
    ("make", "status"),
    [
        (lambda: MultilinearMap.from_sparse(3, (3,), [1, 1], [1.0, 2.0]), "invalid_argument"),
        (lambda: MultilinearMap.from_sparse(3, (3,), [9], [1.0]), "out_of_range"),
        (lambda: MultilinearMap.from_sparse(3, (3,), [1], [0.0]), "invalid_argument"),
        (lambda: MultilinearMap.from_dense(3, (3,), [1.0] * 8), "invalid_argument"),
        (lambda: MultilinearMap.from_dense(3, (3,), [float("nan")] * 9), "invalid_argument"),
        (lambda: MultilinearMap.from_dense(1 << 20, (1 << 20,), []), "overflow"),
    ],
)
def test_map_import_rules_are_native_errors(make, status):
    assert native_error(make).status_name == status


def test_map_python_checks_and_handle_rules():
    with pytest.raises(ValueError, match="output_dimension"):
        MultilinearMap.from_dense(0, (3,), [])
    with pytest.raises(ValueError, match="input_dimensions"):
        MultilinearMap.from_dense(2, (0,), [])
    with pytest.raises(ValueError, match="same length"):
        MultilinearMap.from_sparse(2, (3,), [1, 2], [1.0])
    with pytest.raises(TypeError):
        MultilinearMap()
    with addition_map() as map_:
        with pytest.raises(TypeError):
            copy.copy(map_)
        with pytest.raises(TypeError):
            pickle.dumps(map_)
    with pytest.raises(RuntimeError, match="closed"):
        map_.values()


def test_config_defaults_and_validation():
    config = ProgramAugmentedModelConfig()
    assert (config.vocabulary_size, config.context_length, config.model_width) == (512, 128, 64)
    assert (config.head_count, config.attention_branch_count, config.feed_forward_width) == (4, 2, 256)
    assert config.random_seed == 42
    assert NeuralLoweringConfig() == NeuralLoweringConfig(
        "auto", "reject", "exact_f32", "compiled", 0.02, 42, False, 1 << 24, None
    )
    with pytest.raises(ValueError, match="attention"):
        ProgramAugmentedModelConfig(attention="sparse")
    with pytest.raises(ValueError, match="strategy"):
        NeuralLoweringConfig(strategy="mlp")
    with pytest.raises(ValueError, match="attention_query_axis"):
        NeuralLoweringConfig(attention_query_axis=3)
    with pytest.raises(TypeError, match="trainable"):
        NeuralLoweringConfig(trainable=1)
    with pytest.raises(ValueError, match="source"):
        ProgramInputLayout("everything")
    with pytest.raises(ValueError, match="batch_roll_shift"):
        ProgramAugmentedForwardOptions(batch_roll_shift=0)


def test_the_program_output_is_the_map_of_the_projected_inputs_and_traces_are_owned():
    with addition_map() as map_:
        model = ProgramAugmentedModel(CONFIG, branch(map_))
    with model:
        assert model.has_program and model.backend == "cpu"
        logits, trace = model.forward(TOKENS, ProgramAugmentedForwardOptions(capture_representations=True))
        with logits:
            assert logits.shape == (3, 3, 6)
            flat = logits.tolist()
    assert isinstance(trace, RepresentationTrace)
    assert trace.names[0] == "embedding.sum" and trace.names[-1] == "logits"
    assert "program.output.raw" in trace and len(trace) == 12
    assert trace["logits"].values == pytest.approx(flat, abs=0)
    x0 = trace["program.input.0.projected"].values
    x1 = trace["program.input.1.projected"].values
    raw = trace["program.output.raw"].values
    for b in range(3):
        expected = evaluate(addition_values(), (3, 3), [x0[b * 3 : b * 3 + 3], x1[b * 3 : b * 3 + 3]])
        assert raw[b * 3 : b * 3 + 3] == pytest.approx(expected, abs=1e-6)
    with pytest.raises(KeyError):
        trace["nope"]
    # Without capture: no trace.
    with ProgramAugmentedModel(CONFIG) as learned:
        logits, none = learned.forward(TOKENS)
        logits.close()
        assert none is None and not learned.has_program


def test_interventions_roll_steer_and_ablate():
    with addition_map() as map_, ProgramAugmentedModel(CONFIG, branch(map_)) as model:
        capture = dict(capture_representations=True)
        _, base = model.forward(TOKENS, ProgramAugmentedForwardOptions(**capture))
        _, rolled = model.forward(
            TOKENS, ProgramAugmentedForwardOptions(**capture, ablate_program_output=True)
        )
        raw = base["program.output.raw"].values
        assert rolled["program.output.raw"].values == raw[6:9] + raw[0:6]
        _, steered = model.forward(
            TOKENS,
            ProgramAugmentedForwardOptions(
                **capture, steering=(ProgramSteering(0, 0, (2.0,) * 8, (1.0,) * 8),)
            ),
        )
        before = base["program.input.0"].values
        assert steered["program.input.0"].values == pytest.approx([2 * v + 1 for v in before], abs=1e-6)
        error = native_error(
            lambda: model.forward(TOKENS, ProgramAugmentedForwardOptions(ablated_program_inputs=(1, 1)))
        )
        assert error.status_name == "invalid_argument"
        error = native_error(
            lambda: model.forward(TOKENS, ProgramAugmentedForwardOptions(steering=(ProgramSteering(0, 0, (1.0,)),)))
        )
        assert "steering" in str(error)


def test_construction_rules_are_native_errors():
    with addition_map() as map_:
        for bad in (
            branch(map_, inputs=(ProgramInputLayout("source_position", 0, 0),)),
            branch(map_, source_offset=2),
            branch(map_, lowering=NeuralLoweringConfig(strategy="linear")),
            branch(map_, output_length=0),
        ):
            assert native_error(lambda: ProgramAugmentedModel(CONFIG, bad)).status_name == (
                "invalid_argument"
            )
    with pytest.raises(TypeError, match="ProgramBranch"):
        ProgramAugmentedModel(CONFIG, program="addition")


def test_training_with_adam_and_the_pinning_lifecycle():
    with addition_map() as map_:
        model = ProgramAugmentedModel(
            CONFIG, branch(map_, lowering=NeuralLoweringConfig(trainable=True))
        )
    with model, model.parameters() as parameters, Adam(parameters, learning_rate=1e-2) as adam:
        assert "program.coefficients" in parameters.names
        assert native_error(lambda: model.to("cpu")).status_name == "runtime_error"
        losses = []
        for _ in range(20):
            logits, _ = model.forward(TOKENS)
            with logits, cross_entropy(logits, TARGETS) as loss:
                losses.append(loss.item())
                loss.backward()
            adam.step()
        assert losses[-1] < losses[0]
