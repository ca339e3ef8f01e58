"""How a program's multilinear map is lowered to a network
(docs/ARCHITECTURE.md, 'Programmed models')."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from ..native._abi import NeuralLoweringOptionsStruct
from ..native._errors import check_status
from ..native._loader import library
from ..native._validation import (
    UINT32_LIMIT,
    UINT64_LIMIT,
    describe_value,
    require_choice,
    require_int,
    require_real,
)

STRATEGIES = {"auto": 0, "dense": 1, "linear": 2, "linear_attention": 3}
UNSUPPORTED_POLICIES = {"reject": 0, "dense_fallback": 1}
PRECISIONS = {"exact_f32": 0, "rounded": 1}
INITIALIZATIONS = {"compiled": 0, "random_uniform": 1}


@dataclass(frozen=True)
class NeuralLoweringConfig:
    """``strategy``: auto | dense | linear | linear_attention; ``unsupported``: reject |
    dense_fallback; ``precision``: exact_f32 (every coefficient must be a float32) | rounded;
    ``initialization``: compiled | random_uniform (U(±random_scale) from ``random_seed``);
    ``trainable``: the coefficients become the parameter ``program.coefficients``;
    ``attention_query_axis``: None (axis 1) or 1 or 2, for linear_attention."""

    strategy: str = "auto"
    unsupported: str = "reject"
    precision: str = "exact_f32"
    initialization: str = "compiled"
    random_scale: float = 0.02
    random_seed: int = 42
    trainable: bool = False
    max_coefficient_elements: int = 1 << 24
    attention_query_axis: int | None = None

    def __post_init__(self) -> None:
        require_choice(self.strategy, "strategy", STRATEGIES)
        require_choice(self.unsupported, "unsupported", UNSUPPORTED_POLICIES)
        require_choice(self.precision, "precision", PRECISIONS)
        require_choice(self.initialization, "initialization", INITIALIZATIONS)
        scale = require_real(self.random_scale, "random_scale")
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"random_scale must be finite and > 0, got {describe_value(scale)}")
        object.__setattr__(self, "random_scale", scale)
        require_int(self.random_seed, "random_seed", 0, UINT32_LIMIT)
        if not isinstance(self.trainable, bool):
            raise TypeError(f"trainable must be a bool, not {type(self.trainable).__name__}")
        require_int(self.max_coefficient_elements, "max_coefficient_elements", 1, UINT64_LIMIT)
        if self.attention_query_axis is not None and require_int(
            self.attention_query_axis, "attention_query_axis", 1, 3
        ) not in (1, 2):
            raise ValueError("attention_query_axis must be None, 1 or 2")

    def _native(self) -> NeuralLoweringOptionsStruct:
        native = NeuralLoweringOptionsStruct()
        check_status(
            library().rt_neural_lowering_options_init(ctypes.byref(native), ctypes.sizeof(native))
        )
        native.strategy = STRATEGIES[self.strategy]
        native.unsupported_policy = UNSUPPORTED_POLICIES[self.unsupported]
        native.precision = PRECISIONS[self.precision]
        native.initialization = INITIALIZATIONS[self.initialization]
        native.random_scale = self.random_scale
        native.random_seed = self.random_seed
        native.trainable = 1 if self.trainable else 0
        native.max_coefficient_elements = self.max_coefficient_elements
        native.attention_query_axis = (
            -1 if self.attention_query_axis is None else self.attention_query_axis
        )
        return native
