"""LoRA adapters and packed NF4 weights: configuration and memory statistics.

The model methods that use these live on :class:`~riftco_transformer.DecoderOnlyTransformer`
(``attach_lora``, ``adapter_parameters``, ``merge_lora``, ``quantize_nf4``,
``quantized_memory``, ``packed_quantized_state``, ``load_packed_quantized_state``).
"""

from __future__ import annotations

import ctypes
import math
import struct
from dataclasses import dataclass

from ._abi import (
    LORA_TARGET_FEED_FORWARD_DOWN,
    LORA_TARGET_FEED_FORWARD_EXPAND,
    LORA_TARGET_FEED_FORWARD_GATE,
    LORA_TARGET_FEED_FORWARD_PROJECT,
    LORA_TARGET_FEED_FORWARD_UP,
    LORA_TARGET_KEY,
    LORA_TARGET_LANGUAGE_MODEL_HEAD,
    LORA_TARGET_OUTPUT,
    LORA_TARGET_QUERY,
    LORA_TARGET_VALUE,
    QUANTIZED_MEMORY_FIELDS,
    LoraConfigStruct,
    QuantizedMemoryStatsStruct,
)
from ._errors import check_status
from ._loader import library
from ._validation import UINT32_LIMIT, UINT64_LIMIT, describe_value, require_int, require_real

# Projection names -> the C ABI's target bits (the order is the attach order inside a block).
LORA_TARGETS = {
    "attention.query": LORA_TARGET_QUERY,
    "attention.key": LORA_TARGET_KEY,
    "attention.value": LORA_TARGET_VALUE,
    "attention.output": LORA_TARGET_OUTPUT,
    "feed_forward.expand": LORA_TARGET_FEED_FORWARD_EXPAND,
    "feed_forward.project": LORA_TARGET_FEED_FORWARD_PROJECT,
    "language_model_head": LORA_TARGET_LANGUAGE_MODEL_HEAD,
    # The gated feed-forward of Llama/Mistral models.
    "feed_forward.gate": LORA_TARGET_FEED_FORWARD_GATE,
    "feed_forward.up": LORA_TARGET_FEED_FORWARD_UP,
    "feed_forward.down": LORA_TARGET_FEED_FORWARD_DOWN,
}
_TARGET_NAMES = {bit: name for name, bit in LORA_TARGETS.items()}


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters ``y += (alpha/rank)·(x·Aᵀ)·Bᵀ`` on the named projections
    (``alpha/√rank`` with ``rank_stabilized``: rsLoRA, C ABI 2.13).

    ``rank`` (a positive int; the library checks it against every selected projection),
    ``alpha`` (a finite float > 0, with ``alpha/rank`` finite and > 0 in float32),
    ``targets`` (a non-empty tuple of distinct names from ``LORA_TARGETS``: the projection
    paths inside a block, plus ``"language_model_head"``) and ``random_seed`` (uint32, the
    adapters' own generator). ``dropout`` (a float p in [0, 1), C ABI 2.15): inverted dropout
    on the adapter input in training forwards only, PEFT's ``lora_dropout``; the masks follow
    the model's ``lora_dropout_key``. TypeError/ValueError name the field.
    """

    rank: int = 4
    alpha: float = 8.0
    targets: tuple[str, ...] = ("attention.query", "attention.value")
    random_seed: int = 5489
    rank_stabilized: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:
        dropout = require_real(self.dropout, "dropout")
        if not math.isfinite(dropout) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be finite and in [0, 1), got "
                             f"{describe_value(self.dropout)}")
        if _float32(dropout) >= 1.0:
            raise ValueError(f"dropout must be < 1 in float32, got {describe_value(self.dropout)}")
        object.__setattr__(self, "dropout", dropout)
        if not isinstance(self.rank_stabilized, bool):
            raise TypeError(f"rank_stabilized must be a bool, not "
                            f"{type(self.rank_stabilized).__name__}")
        rank = require_int(self.rank, "rank", 1, UINT64_LIMIT)
        alpha = require_real(self.alpha, "alpha")
        if not math.isfinite(alpha) or alpha <= 0.0:
            raise ValueError(f"alpha must be finite and > 0, got {describe_value(self.alpha)}")
        alpha32 = _float32(alpha) if alpha < 3.4e38 else math.inf
        divisor = math.sqrt(rank) if self.rank_stabilized else rank
        scale = _float32(alpha32 / divisor) if math.isfinite(alpha32) else math.inf
        if not math.isfinite(alpha32) or not math.isfinite(scale) or scale <= 0.0:
            what = "alpha/sqrt(rank)" if self.rank_stabilized else "alpha/rank"
            raise ValueError(
                f"{what} = {describe_value(self.alpha)}/{rank} must be finite and > 0 in "
                "float32"
            )
        targets = self.targets
        if isinstance(targets, (str, bytes)):
            raise TypeError(
                f"targets must be a tuple of projection names, not {type(targets).__name__} "
                f"({describe_value(targets)}); write ({targets!r},)"
            )
        try:
            targets = tuple(targets)
        except TypeError:
            raise TypeError(
                f"targets must be a tuple of projection names, not {type(self.targets).__name__}"
            ) from None
        if not targets:
            raise ValueError("targets must name at least one projection")
        for target in targets:
            if not isinstance(target, str):
                raise TypeError(
                    f"targets entries must be str, not {type(target).__name__} "
                    f"({describe_value(target)})"
                )
            if target not in LORA_TARGETS:
                raise ValueError(
                    f"unknown LoRA target {target!r}; known: {', '.join(LORA_TARGETS)}"
                )
        if len(set(targets)) != len(targets):
            raise ValueError(f"targets repeats a projection: {targets!r}")
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "targets", targets)
        object.__setattr__(
            self, "random_seed", require_int(self.random_seed, "random_seed", 0, UINT32_LIMIT)
        )

    @property
    def target_mask(self) -> int:
        """The C ABI's uint64 target mask."""
        mask = 0
        for target in self.targets:
            mask |= LORA_TARGETS[target]
        return mask

    def _native(self) -> LoraConfigStruct:
        native = LoraConfigStruct()
        check_status(library().rt_lora_config_init(ctypes.byref(native), ctypes.sizeof(native)))
        native.rank = self.rank
        native.alpha = self.alpha
        native.random_seed = self.random_seed
        native.targets = self.target_mask
        native.rank_stabilized = int(self.rank_stabilized)
        native.dropout = self.dropout
        return native

    @classmethod
    def _from_native(cls, native: LoraConfigStruct) -> LoraConfig:
        targets = tuple(name for bit, name in sorted(_TARGET_NAMES.items()) if native.targets & bit)
        return cls(
            rank=native.rank, alpha=native.alpha, targets=targets, random_seed=native.random_seed,
            rank_stabilized=bool(native.rank_stabilized), dropout=native.dropout,
        )


@dataclass(frozen=True)
class QuantizedMemoryStats:
    """Exact byte accounting of a model's packed NF4 weights (all zero when none is packed).

    ``resident_payload_bytes`` counts every byte the backend holds for them, so a hidden
    float32 copy would show there; ``fp32_equivalent_bytes`` is what the dense weights took.
    """

    weight_count: int
    packed_code_bytes: int
    scale_bytes: int
    logical_payload_bytes: int
    resident_payload_bytes: int
    fp32_equivalent_bytes: int
    fp32_scale_bytes: int
    scale_code_bytes: int
    second_level_scale_bytes: int
    scale_offset_bytes: int
    double_quantized_weight_count: int

    @classmethod
    def _from_native(cls, native: QuantizedMemoryStatsStruct) -> QuantizedMemoryStats:
        return cls(**{name: int(getattr(native, name)) for name in QUANTIZED_MEMORY_FIELDS})
