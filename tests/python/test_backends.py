"""Backend names, availability, "auto", and the refusal to substitute an unavailable backend."""

from __future__ import annotations

import ctypes

import pytest

from riftco_transformer import (
    STATUS_BACKEND_UNAVAILABLE,
    Context,
    DecoderOnlyTransformer,
    RiftcoTransformerError,
    backend_available,
    cpu_info,
)
from riftco_transformer.native._loader import library
from riftco_transformer.native.backends import BACKEND_NAMES, backend_value

ACCELERATORS = ("metal", "cuda", "tpu")


def unavailable(name: str):
    return pytest.mark.skipif(backend_available(name), reason=f"{name} is available here")


def test_cpu_is_always_available():
    assert backend_available("cpu") is True
    assert backend_available(0) is True


@pytest.mark.parametrize("spelling", ["cpu", "CPU", "  Cpu\t", 0])
def test_backend_names_ignore_case_and_surrounding_space(spelling):
    assert backend_value(spelling) == 0


def test_the_python_names_are_the_librarys_stable_names():
    for value, name in BACKEND_NAMES.items():
        required = ctypes.c_uint64()
        text = ctypes.create_string_buffer(16)
        assert library().rt_backend_name(value, text, len(text), ctypes.byref(required)) == 0
        assert text.value.decode() == name


@pytest.mark.parametrize("backend", [True, False, 1.0, None, b"cpu"])
def test_a_backend_that_is_not_a_name_or_int_is_a_type_error(backend):
    with pytest.raises(TypeError):
        backend_available(backend)
    with pytest.raises(TypeError):
        Context(backend)


@pytest.mark.parametrize("backend", ["gpu", "", "auto", 4, -1])
def test_an_unknown_backend_is_a_value_error(backend):
    with pytest.raises(ValueError):
        backend_available(backend)


@pytest.mark.parametrize("backend", ACCELERATORS)
def test_availability_of_the_accelerators_is_a_bool(backend):
    assert backend_available(backend) in (True, False)


@pytest.mark.parametrize(
    "backend", [pytest.param(name, marks=unavailable(name)) for name in ACCELERATORS]
)
def test_an_unavailable_context_is_refused_not_replaced(backend):
    with pytest.raises(RiftcoTransformerError) as caught:
        Context(backend)
    assert caught.value.status == STATUS_BACKEND_UNAVAILABLE
    assert caught.value.status_name == "backend_unavailable"
    assert backend in caught.value.detail


@pytest.mark.parametrize(
    "backend", [pytest.param(name, marks=unavailable(name)) for name in ACCELERATORS]
)
def test_moving_a_model_to_an_unavailable_backend_changes_nothing(tiny_config, backend):
    with DecoderOnlyTransformer(tiny_config) as model:
        with pytest.raises(RiftcoTransformerError) as caught:
            model.to(backend)
        assert caught.value.status == STATUS_BACKEND_UNAVAILABLE
        assert model.backend == "cpu"


def test_auto_selects_the_first_available_of_tpu_cuda_metal_cpu(tiny_config):
    expected = next(name for name in ("tpu", "cuda", "metal", "cpu") if backend_available(name))
    with Context("auto") as context:
        assert context.backend == expected
    with DecoderOnlyTransformer(tiny_config) as model:
        assert model.to(" AUTO ").backend == expected


def test_a_context_reports_its_backend_by_name():
    with Context() as context:
        assert context.backend == "cpu"
    with Context(0) as context:
        assert context.backend == "cpu"


def test_cpu_info_names_the_gemm_library_its_kernel_and_the_threads():
    info = cpu_info()
    assert info.startswith("gemm=")
    assert "; threads=" in info
    gemm = info[len("gemm="):info.index("; threads=")]
    # A library and the kernel family it dispatched to on this machine, never a bare name.
    assert gemm.startswith(("onednn ", "openblas ", "blocked fallback")), info
    if gemm.startswith(("onednn ", "openblas ")):
        assert "(" in gemm and gemm.endswith(")"), info
    assert int(info.rsplit("=", 1)[1]) >= 1
