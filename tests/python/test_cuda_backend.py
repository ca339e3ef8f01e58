"""backend="cuda" from Python without a device: the no-device contract the C++ and C suites check.

In a build with the CUDA adapter (the build's facts beside the library say so: support.build_facts)
the library reports cuda unavailable with the reason "no CUDA device visible"; in any build,
contexts and model moves on cuda are refused with the backend-unavailable status, naming the
backend and that reason, and nothing is substituted. With a device visible these report
themselves skipped (the device parity lives in the C++ suites).
"""

from __future__ import annotations

import ctypes

import pytest
from support import build_facts

from riftco_transformer import (
    STATUS_BACKEND_UNAVAILABLE,
    Context,
    DecoderOnlyTransformer,
    RiftcoTransformerError,
    backend_available,
)
from riftco_transformer.native._loader import library
from riftco_transformer.native.backends import backend_value

pytestmark = pytest.mark.skipif(
    backend_available("cuda"), reason="a CUDA device is visible here"
)


def _reason() -> str:
    required = ctypes.c_uint64()
    text = ctypes.create_string_buffer(512)
    status = library().rt_backend_unavailability_reason(
        backend_value("cuda"), text, len(text), ctypes.byref(required))
    assert status == 0
    return text.value.decode("utf-8")


def test_cuda_is_unavailable_with_the_no_device_reason():
    facts = build_facts()
    assert not facts["require_cuda"], \
        "RIFTCO_TRANSFORMER_TEST_REQUIRE_CUDA=ON but no CUDA device is visible"
    if facts["cuda"]:
        assert _reason() == "no CUDA device visible"
    else:
        assert "RIFTCO_TRANSFORMER_ENABLE_CUDA" in _reason()


def test_a_cuda_context_is_refused_naming_the_backend_and_the_reason():
    with pytest.raises(RiftcoTransformerError) as caught:
        Context("cuda")
    assert caught.value.status == STATUS_BACKEND_UNAVAILABLE
    assert "cuda" in caught.value.detail
    assert _reason() in caught.value.detail


def test_moving_a_model_to_cuda_is_refused_and_the_model_stays_on_the_cpu(tiny_config):
    with DecoderOnlyTransformer(tiny_config) as model:
        with pytest.raises(RiftcoTransformerError) as caught:
            model.to("cuda")
        assert caught.value.status == STATUS_BACKEND_UNAVAILABLE
        assert _reason() in caught.value.detail
        assert model.backend == "cpu"
