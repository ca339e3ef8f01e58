"""The ctypes client of the riftco_transformer C ABI 2.10 (no third-party dependencies).

Every class here wraps one native handle (see ``_handle.NativeHandle`` for the shared lifetime
and thread-safety contract); bulk data crosses as buffers (see ``_buffers``). The native
library is located and checked on first use (see ``_loader``).
"""

from ._abi import (
    ABI_VERSION,
    ABI_VERSION_MAJOR,
    ABI_VERSION_MINOR,
    BACKEND_CPU,
    BACKEND_CUDA,
    BACKEND_METAL,
    BACKEND_PJRT,
    BACKEND_TPU,
    STATUS_BACKEND_UNAVAILABLE,
    STATUS_INVALID_ARGUMENT,
    STATUS_OK,
    STATUS_OUT_OF_MEMORY,
    STATUS_OUT_OF_RANGE,
    STATUS_OVERFLOW,
    STATUS_RUNTIME_ERROR,
    STATUS_UNKNOWN_ERROR,
)
from ._errors import RiftcoTransformerError
from .adam import Adam, AdamOptions, AdamState, AdamStepStats
from .autograd import Variable, cross_entropy, cross_entropy_masked, cross_entropy_time_range
from .backends import backend_available, cpu_info
from .decode import DecodeSession, KvCachePool, decode_batch
from .llama import LlamaMistralConfig, LlamaMistralTransformer
from .lora import LORA_TARGETS, LoraConfig, QuantizedMemoryStats
from .model import CausalLanguageModel, DecoderOnlyTransformer, TransformerConfig
from .parameters import ParameterList
from .pretrained_tokenizer import PretrainedTokenizer
from .tensor import Context, Tensor
from .tokenizer import Tokenizer

__all__ = [
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
]
