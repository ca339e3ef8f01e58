"""The lifetime contract shared by every native wrapper: close, with, copy, finalizer."""

from __future__ import annotations

import copy
import gc
import pickle
import sys

import pytest

from riftco_transformer import (
    Adam,
    Context,
    DecoderOnlyTransformer,
    Tensor,
    Tokenizer,
    cross_entropy,
)

# name -> (make(model) -> wrapper, use(wrapper) -> anything); each use makes a native call.
WRAPPERS = {
    "Context": (lambda model: Context(), lambda context: context.backend),
    "Tensor": (lambda model: Tensor.zeros(Context(), (2, 2)), lambda tensor: tensor.tolist()),
    "Tokenizer": (lambda model: Tokenizer("abc"), lambda tokenizer: tokenizer.encode("ab")),
    "DecoderOnlyTransformer": (
        lambda model: DecoderOnlyTransformer(model.config),
        lambda created: created([1, 2]).close(),
    ),
    "ParameterList": (lambda model: model.parameters(), lambda parameters: parameters.total_numel),
    "Variable": (lambda model: model([1, 2]), lambda variable: variable.shape),
    "Variable (loss)": (
        lambda model: cross_entropy(model([1, 2]), [2, 3]),
        lambda loss: loss.item(),
    ),
    "Adam": (lambda model: Adam(model.parameters()), lambda optimizer: optimizer.step_count),
}


@pytest.fixture(params=list(WRAPPERS))
def wrapper_kind(request):
    return request.param


@pytest.fixture
def wrapper(model, wrapper_kind):
    make, _ = WRAPPERS[wrapper_kind]
    created = make(model)
    yield created
    created.close()


def use(wrapper_kind, wrapper):
    return WRAPPERS[wrapper_kind][1](wrapper)


def test_close_is_idempotent_and_reported(wrapper_kind, wrapper):
    use(wrapper_kind, wrapper)
    assert wrapper.closed is False
    wrapper.close()
    assert wrapper.closed is True
    wrapper.close()
    assert wrapper.closed is True


def test_use_after_close_is_a_runtime_error_naming_the_class(wrapper_kind, wrapper):
    wrapper.close()
    with pytest.raises(RuntimeError, match=rf"^{type(wrapper).__name__} is closed$"):
        use(wrapper_kind, wrapper)


def test_with_closes_and_a_closed_wrapper_cannot_be_entered(wrapper_kind, wrapper):
    with wrapper as entered:
        assert entered is wrapper
        use(wrapper_kind, entered)
    assert wrapper.closed
    with pytest.raises(RuntimeError, match="is closed"):
        with wrapper:
            pass


@pytest.mark.parametrize("duplicate", [copy.copy, copy.deepcopy, pickle.dumps])
def test_wrappers_cannot_be_copied_or_pickled(wrapper, duplicate):
    with pytest.raises(TypeError, match="cannot be"):
        duplicate(wrapper)


def test_repr_tells_open_from_closed(wrapper):
    assert "closed" not in repr(wrapper)
    wrapper.close()
    assert repr(wrapper) == f"<{type(wrapper).__name__} (closed)>"


def test_an_unclosed_wrapper_is_released_silently_by_its_finalizer(
    model, wrapper_kind, monkeypatch
):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    make, _ = WRAPPERS[wrapper_kind]
    created = make(model)
    finalizer = created._finalizer
    del created
    gc.collect()
    assert not finalizer.alive
    assert unraisable == []


def test_a_garbage_collected_variable_no_longer_pins_its_model(model):
    logits = model([1, 2])
    del logits
    gc.collect()
    assert model.to("cpu") is model


def test_closing_does_not_run_the_release_twice(model):
    variable = model([1, 2])
    finalizer = variable._finalizer
    variable.close()
    assert not finalizer.alive
    del variable
    gc.collect()  # nothing left to release: a double release would crash here
    assert model.to("cpu") is model
