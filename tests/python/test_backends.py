"""Backend names, availability, "auto", and the refusal to substitute an unavailable backend."""

from __future__ import annotations

import ctypes

import pytest
from support import build_facts

from riftco_transformer import (
    BACKEND_PJRT,
    STATUS_BACKEND_UNAVAILABLE,
    Context,
    DecoderOnlyTransformer,
    RiftcoTransformerError,
    backend_available,
    cpu_info,
)
from riftco_transformer.native._loader import library
from riftco_transformer.native.backends import BACKEND_NAMES, backend_value

ACCELERATORS = ("metal", "cuda", "tpu", "pjrt")


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


@pytest.mark.parametrize("backend", ["gpu", "", "auto", 5, -1])
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


@pytest.mark.parametrize("spelling", ["pjrt", " PJRT\n", 4])
def test_pjrt_is_the_stable_value_4(spelling):
    assert BACKEND_PJRT == 4
    assert backend_value(spelling) == 4
    assert BACKEND_NAMES[4] == "pjrt"


@unavailable("pjrt")
def test_pjrt_is_unavailable_in_a_default_build_naming_its_build_option():
    if build_facts()["tpu"]:
        pytest.skip("this build compiles the PJRT adapter (test_pjrt_backend covers its reasons)")
    assert backend_available("pjrt") is False
    required = ctypes.c_uint64()
    reason = ctypes.create_string_buffer(256)
    status = library().rt_backend_unavailability_reason(
        BACKEND_PJRT, reason, len(reason), ctypes.byref(required)
    )
    assert status == 0
    assert "PJRT" in reason.value.decode()
    assert "RIFTCO_TRANSFORMER_ENABLE_TPU" in reason.value.decode()
    with pytest.raises(RiftcoTransformerError) as caught:
        Context("pjrt")
    assert "RIFTCO_TRANSFORMER_ENABLE_TPU" in caught.value.detail


def test_auto_never_selects_pjrt(monkeypatch):
    # Even where pjrt were the only available backend besides cpu, auto stops at cpu.
    from riftco_transformer.native import backends

    real = backends.backend_available
    monkeypatch.setattr(
        backends, "backend_available", lambda name: name in ("pjrt", "cpu") or real(name)
    )
    assert "pjrt" not in backends.AUTO_PREFERENCE
    assert backend_value("auto", allow_auto=True) != BACKEND_PJRT
    with Context("auto") as context:
        assert context.backend != "pjrt"


def test_a_context_reports_its_backend_by_name():
    with Context() as context:
        assert context.backend == "cpu"
    with Context(0) as context:
        assert context.backend == "cpu"


def test_cpu_info_names_the_gemm_library_its_kernel_and_the_threads():
    info = cpu_info()
    assert info.startswith("gemm=")
    assert "; threads=" in info
    gemm = info[len("gemm="):info.index("; packed=")]
    packed = info[info.index("; packed=") + len("; packed="):info.index("; threads=")]
    # The instruction set each packed-weight family runs on this CPU.
    nf4, blocks = packed.split(", ")
    assert nf4.split(" ")[0] == "nf4", info
    assert blocks.split(" ")[0] == "q8_0/q4_0/q4_1/q5_0/q4_k/q5_k/q6_k/f16/bf16", info
    assert {nf4.split(" ")[1], blocks.split(" ")[1]} <= {"avx512", "avx2", "portable"}, info
    # A library and the kernel family it dispatched to on this machine, never a bare name.
    assert gemm.startswith(("onednn ", "openblas ", "blocked fallback")), info
    if gemm.startswith(("onednn ", "openblas ")):
        assert "(" in gemm and gemm.endswith(")"), info
    assert int(info.rsplit("=", 1)[1]) >= 1
