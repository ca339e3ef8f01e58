"""The ctypes transcription matches c_api.h, and native failures become RiftcoTransformerError."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

import riftco_transformer
from riftco_transformer import Context, RiftcoTransformerError, Tensor, Tokenizer
from riftco_transformer.native import _abi
from riftco_transformer.native._loader import library

REPOSITORY = Path(__file__).resolve().parents[2]
HEADER = (REPOSITORY / "include" / "riftco_transformer" / "c_api.h").read_text()


def header_defines(prefix: str) -> dict[str, int]:
    return {
        name: int(value, 0)
        for name, value in re.findall(rf"#define {prefix}(\w*) (0x[0-9a-fA-F]+|\d+)u?\b", HEADER)
    }


def test_status_constants_match_the_header():
    for name, value in header_defines("RT_STATUS_").items():
        assert getattr(riftco_transformer, f"STATUS_{name}") == value, name


def test_backend_constants_match_the_header():
    assert {f"BACKEND_{name}": value for name, value in header_defines("RT_BACKEND_").items()} == {
        "BACKEND_CPU": riftco_transformer.BACKEND_CPU,
        "BACKEND_METAL": riftco_transformer.BACKEND_METAL,
        "BACKEND_CUDA": riftco_transformer.BACKEND_CUDA,
        "BACKEND_TPU": riftco_transformer.BACKEND_TPU,
        "BACKEND_PJRT": riftco_transformer.BACKEND_PJRT,
    }


def test_abi_version_matches_the_header_and_the_loaded_library():
    versions = header_defines("RT_ABI_VERSION")
    assert riftco_transformer.ABI_VERSION == versions[""] == 0x0002000F
    assert riftco_transformer.ABI_VERSION_MAJOR == versions["_MAJOR"]
    assert riftco_transformer.ABI_VERSION_MINOR == versions["_MINOR"]
    loaded = library().rt_abi_version()
    assert loaded >> 16 == riftco_transformer.ABI_VERSION_MAJOR
    assert loaded & 0xFFFF >= riftco_transformer.ABI_VERSION_MINOR


def test_every_header_function_has_exactly_one_prototype():
    declared = set(re.findall(r"RT_CALL\s+(rt_\w+)\(", HEADER))  # clang-format may break the line
    assert declared == set(_abi.PROTOTYPES)


def test_struct_layouts_have_the_sizes_the_header_implies():
    # Sizes added up by hand from the header's field lists (all naturally aligned).
    assert ctypes.sizeof(_abi.TokenizerOptions) == 8 + 4 + 4 + 8 + 8
    assert ctypes.sizeof(_abi.BpeMergeRule) == 3 * 4
    assert ctypes.sizeof(_abi.TransformerConfigStruct) == 8 + 6 * 8 + 4 + 4 + 4 + 4
    # rt_adam_options: 2.4 ends at 48; 2.13 appends weight_decay, schedule, reserved3,
    # warmup_steps, total_steps, minimum_fraction.
    assert ctypes.sizeof(_abi.AdamOptionsStruct) == 8 + 5 * 4 + 4 + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 8 + 8
    assert _abi.AdamOptionsStruct.weight_decay.offset == 48
    assert _abi.AdamOptionsStruct.minimum_fraction.offset == 80
    # rt_adam_step_stats: 2.13 appends the step's learning rate after 32 bytes.
    assert ctypes.sizeof(_abi.AdamStepStatsStruct) == 8 + 8 + 8 + 8 + 8
    assert _abi.AdamStepStatsStruct.learning_rate.offset == 32
    # rt_lora_config: 2.13 appends rank_stabilized and reserved2 after 40 bytes.
    assert ctypes.sizeof(_abi.LoraConfigStruct) == 56  # 48 in 2.13; 2.15 appended dropout
    assert _abi.LoraConfigStruct.rank_stabilized.offset == 40
    assert _abi.LoraConfigStruct.dropout.offset == 48
    assert _abi.LoraConfigStruct.reserved3.offset == 52
    assert ctypes.sizeof(_abi.AdamStateStruct) == 8 + 8 + 8 + 8 + 8
    # rt_llama_mistral_config: 2.10 ends at 184, 2.11 at 232 (after the frequency factors),
    # 2.12 appends the GPT-2 choices (four int32 enums, three uint32 flags, reserved).
    llama = _abi.LlamaMistralConfigStruct
    assert llama.rope_original_context.offset + 8 == 184
    assert llama.rope_frequency_factor_count.offset == 224
    assert llama.positions.offset == 232
    assert [name for name, _ in llama._fields_][-8:] == [
        "positions", "norm", "feed_forward", "plain_activation", "output_bias",
        "feed_forward_bias", "head_bias", "reserved"]
    assert ctypes.sizeof(llama) == 232 + 8 * 4 == 264


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (0, "ok"),
        (1, "invalid_argument"),
        (2, "out_of_range"),
        (3, "overflow"),
        (4, "backend_unavailable"),
        (5, "out_of_memory"),
        (6, "runtime_error"),
        (255, "unknown_error"),
        (42, "unrecognized status"),
    ],
)
def test_status_names_are_the_stable_lower_case_names(status, name):
    assert library().rt_status_string(status).decode() == name


def test_a_native_failure_carries_status_name_and_copied_detail(context):
    with pytest.raises(RiftcoTransformerError) as caught:
        Tensor.from_data(context, (2, 3), [1.0] * 5)
    error = caught.value
    assert isinstance(error, RuntimeError)
    assert error.status == riftco_transformer.STATUS_INVALID_ARGUMENT
    assert error.status_name == "invalid_argument"
    assert "rt_tensor_create_f32" in error.detail and "5 values" in error.detail
    assert str(error) == f"invalid_argument: {error.detail}"
    # The detail was copied: later successful calls (which clear the thread's text) keep it.
    Tensor.zeros(context, (1,)).close()
    assert library().rt_last_error() == b""
    assert "5 values" in error.detail


def test_python_side_validation_raises_before_any_native_call(context):
    with pytest.raises(RiftcoTransformerError):
        Tensor.from_data(context, (2, 3), [1.0] * 5)
    native_text = library().rt_last_error()
    # Any status-returning native call would clear the thread's error text.
    with pytest.raises(TypeError):
        Tensor.from_data(context, (2, True), [1.0, 2.0])
    with pytest.raises(TypeError):
        Tokenizer(["not", "bytes"])
    assert library().rt_last_error() == native_text


def test_overflowing_sizes_are_the_overflow_status(context):
    with pytest.raises(RiftcoTransformerError) as caught:
        Tensor.zeros(context, (1 << 40, 1 << 30))
    assert caught.value.status == riftco_transformer.STATUS_OVERFLOW


def test_the_package_root_exports_exactly_the_public_api():
    # No legacy aliases: the documented names and nothing else.
    assert set(riftco_transformer.__all__) == {
        "ABI_VERSION",
        "ABI_VERSION_MAJOR",
        "ABI_VERSION_MINOR",
        "BACKEND_CPU",
        "BACKEND_CUDA",
        "BACKEND_METAL",
        "BACKEND_PJRT",
        "BACKEND_TPU",
        "STATUS_BACKEND_UNAVAILABLE",
        "STATUS_INVALID_ARGUMENT",
        "STATUS_OK",
        "STATUS_OUT_OF_MEMORY",
        "STATUS_OUT_OF_RANGE",
        "STATUS_OVERFLOW",
        "STATUS_RUNTIME_ERROR",
        "STATUS_UNKNOWN_ERROR",
        "Adam",
        "AdamOptions",
        "AdamState",
        "AdamStepStats",
        "CausalLanguageModel",
        "Context",
        "DecodeSession",
        "DecoderOnlyTransformer",
        "KvCachePool",
        "LlamaMistralConfig",
        "LlamaMistralTransformer",
        "LORA_TARGETS",
        "LoraConfig",
        "ParameterList",
        "PretrainedModel",
        "PretrainedTokenizer",
        "QuantizedMemoryStats",
        "RiftcoTransformerError",
        "Tensor",
        "Tokenizer",
        "TransformerConfig",
        "Variable",
        "backend_available",
        "cpu_info",
        "cross_entropy",
        "cross_entropy_masked",
        "cross_entropy_time_range",
        "decode_batch",
        "load_pretrained",
        "__version__",
    }
    assert riftco_transformer.__version__ == "0.1.0"
    assert Context is riftco_transformer.native.Context
