"""Adam with global gradient-norm clipping, and its exact-resume state."""

from __future__ import annotations

import ctypes
import math
from array import array
from dataclasses import dataclass

from ._abi import (
    ADAM_STATE_CONTIGUOUS,
    ADAM_STATE_PAGED,
    LEARNING_RATE_SCHEDULE_CONSTANT,
    LEARNING_RATE_SCHEDULE_WARMUP_COSINE,
    LEARNING_RATE_SCHEDULE_WARMUP_LINEAR,
    AdamOptionsStruct,
    AdamStateStruct,
    AdamStepStatsStruct,
)
from ._buffers import FLOAT32_TYPECODE, float32_input
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._validation import (
    UINT64_LIMIT,
    require_choice,
    require_int,
    require_open_unit_interval,
    require_positive_float,
    require_real,
)
from .backends import BACKEND_NAMES
from .parameters import ParameterList

STATE_STORAGE_VALUES = {"contiguous": ADAM_STATE_CONTIGUOUS, "paged": ADAM_STATE_PAGED}
STATE_STORAGE_NAMES = {value: name for name, value in STATE_STORAGE_VALUES.items()}
SCHEDULE_VALUES = {"constant": LEARNING_RATE_SCHEDULE_CONSTANT,
                   "cosine": LEARNING_RATE_SCHEDULE_WARMUP_COSINE,
                   "linear": LEARNING_RATE_SCHEDULE_WARMUP_LINEAR}


@dataclass(frozen=True)
class AdamOptions:
    """Adam's hyper-parameters (standard bias-corrected Adam; AdamW with ``weight_decay``).

    Each step first scales all gradients by ``clip_scale = min(1, maximum_gradient_norm /
    global_norm)`` (``inf`` disables clipping), then updates
    ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g^2`` and
    ``p -= learning_rate * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)``.

    ``state_storage`` keeps each parameter's moments ``"contiguous"`` or in ``"paged"`` chunks
    of ``page_size`` scalars (same math). ``weight_decay`` λ >= 0 makes it AdamW
    (``p *= 1 - lr_t λ`` before the update; 0 is plain Adam). ``schedule`` scales the rate of
    step t (1-based): ``"constant"``, or, with ``W = warmup_steps``, ``T = total_steps > W``
    and ``f = minimum_fraction`` in [0, 1], a linear warmup ``t / W`` for ``t <= W`` and then
    ``"cosine"`` (``f + (1 - f)(1 + cos(π (t - W) / (T - W))) / 2``) or ``"linear"``
    (``f + (1 - f)(1 - (t - W) / (T - W))``) decay to ``f``, which holds after T. The schedule
    is computed by the library (C ABI 2.13). Out-of-domain values raise TypeError/ValueError
    here.
    """

    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    maximum_gradient_norm: float = 1.0
    state_storage: str = "contiguous"
    page_size: int = 4096
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    minimum_fraction: float = 0.0

    def __post_init__(self) -> None:
        validated = {
            "learning_rate": require_positive_float(self.learning_rate, "learning_rate"),
            "beta1": require_open_unit_interval(self.beta1, "beta1"),
            "beta2": require_open_unit_interval(self.beta2, "beta2"),
            "epsilon": require_positive_float(self.epsilon, "epsilon"),
            "maximum_gradient_norm": require_positive_float(
                self.maximum_gradient_norm, "maximum_gradient_norm", allow_infinity=True
            ),
            "page_size": require_int(self.page_size, "page_size", 1, UINT64_LIMIT),
        }
        require_choice(self.state_storage, "state_storage", STATE_STORAGE_VALUES)
        validated["weight_decay"] = require_real(self.weight_decay, "weight_decay")
        if not (math.isfinite(validated["weight_decay"]) and validated["weight_decay"] >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay!r}")
        require_choice(self.schedule, "schedule", SCHEDULE_VALUES)
        validated["warmup_steps"] = require_int(self.warmup_steps, "warmup_steps", 0, UINT64_LIMIT)
        validated["total_steps"] = require_int(self.total_steps, "total_steps", 0, UINT64_LIMIT)
        validated["minimum_fraction"] = require_real(self.minimum_fraction, "minimum_fraction")
        if self.schedule == "constant":
            for name in ("warmup_steps", "total_steps", "minimum_fraction"):
                if validated[name] != 0:
                    raise ValueError(f"{name} must be 0 with schedule 'constant' (it would be "
                                     f"ignored), got {validated[name]!r}")
        else:
            if validated["total_steps"] <= validated["warmup_steps"]:
                raise ValueError(f"total_steps ({validated['total_steps']}) must exceed "
                                 f"warmup_steps ({validated['warmup_steps']})")
            if not 0.0 <= validated["minimum_fraction"] <= 1.0:
                raise ValueError(f"minimum_fraction must lie in [0, 1], got "
                                 f"{self.minimum_fraction!r}")
        for name, value in validated.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class AdamStepStats:
    """What one :meth:`Adam.step` did.

    ``step`` is the step count after the update, ``gradient_norm`` the global L2 norm of the
    gradients before clipping, ``clip_scale`` the factor applied to every gradient (1 when
    not clipped), ``learning_rate`` the scheduled rate the update used.
    """

    step: int
    gradient_norm: float
    clip_scale: float
    learning_rate: float | None = None


@dataclass(frozen=True)
class AdamState:
    """Adam's logical state, for exact resume: ``Adam.load_state(adam.state())``.

    ``beta1_power``/``beta2_power`` are ``beta^step_count``; ``values``, ``first_moments`` and
    ``second_moments`` hold one float32 per parameter scalar, in the parameter list's flat
    order (the layout is independent of contiguous or paged storage).

    ``step_count`` must be an int in [0, 2**64) and the powers real numbers (TypeError or
    ValueError here, naming the field); whether they agree with the optimizer's betas, and
    the arrays' contents, are checked by :meth:`Adam.load_state`.
    """

    step_count: int
    beta1_power: float
    beta2_power: float
    values: array
    first_moments: array
    second_moments: array

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "step_count", require_int(self.step_count, "step_count", 0, UINT64_LIMIT)
        )
        for name in ("beta1_power", "beta2_power"):
            object.__setattr__(self, name, require_real(getattr(self, name), name))


def _native_options(options: AdamOptions) -> AdamOptionsStruct:
    native_options = AdamOptionsStruct()
    check_status(
        library().rt_adam_options_init(ctypes.byref(native_options), ctypes.sizeof(native_options))
    )
    native_options.learning_rate = options.learning_rate
    native_options.beta1 = options.beta1
    native_options.beta2 = options.beta2
    native_options.epsilon = options.epsilon
    native_options.maximum_gradient_norm = options.maximum_gradient_norm
    native_options.state_storage = STATE_STORAGE_VALUES[options.state_storage]
    native_options.page_size = options.page_size
    native_options.weight_decay = options.weight_decay
    native_options.schedule = SCHEDULE_VALUES[options.schedule]
    native_options.warmup_steps = options.warmup_steps
    native_options.total_steps = options.total_steps
    native_options.minimum_fraction = options.minimum_fraction
    return native_options


class Adam(NativeHandle):
    """Adam over a model's parameters.

    ``Adam(parameters)`` uses the default :class:`AdamOptions`; pass ``options=AdamOptions(...)``
    or the same fields as keywords (``Adam(parameters, learning_rate=1e-2)``), not both.

    The optimizer copies the parameter list (``Adam(model.parameters())`` is safe), shares
    the model's lock and keeps its native state alive. While it is open the model is pinned:
    ``model.to(...)`` and parameter loads fail with runtime_error.
    """

    _release_function = "rt_adam_release"

    def __init__(
        self, parameters: ParameterList, options: AdamOptions | None = None, *,
        sharded_over=None, **option_keywords
    ) -> None:
        """``sharded_over``: a :class:`~riftco_transformer.distributed.DataParallel` to shard
        the moments over its ranks (ZeRO-1, C ABI 2.14): every rank passes the same list; each
        keeps the moments of its share of the parameters and updates only those, and every
        value is gathered after each step. :meth:`step`, :meth:`state` and :meth:`load_state`
        are then collectives (every rank calls them, in the same order), and the state is the
        whole list's, so it moves between world sizes and to or from an unsharded optimizer."""
        if not isinstance(parameters, ParameterList):
            raise TypeError(f"parameters must be a ParameterList, not {type(parameters).__name__}")
        if options is None:
            options = AdamOptions(**option_keywords)
        elif option_keywords:
            raise TypeError("pass either options or keyword options, not both")
        elif not isinstance(options, AdamOptions):
            raise TypeError(f"options must be AdamOptions, not {type(options).__name__}")
        pointer = ctypes.c_void_p()
        if sharded_over is not None:
            from ..distributed import DataParallel

            if not isinstance(sharded_over, DataParallel):
                raise TypeError("sharded_over must be a DataParallel, not "
                                f"{type(sharded_over).__name__}")
            with sharded_over.group._native() as group, parameters._native() as parameter_list:
                check_status(
                    library().rt_adam_create_sharded(
                        group, parameter_list, ctypes.byref(_native_options(options)),
                        ctypes.byref(pointer)
                    )
                )
        else:
            with parameters._native() as parameter_list:
                check_status(
                    library().rt_adam_create(
                        parameter_list, ctypes.byref(_native_options(options)),
                        ctypes.byref(pointer)
                    )
                )
        self._adopt(pointer.value, parameters._lock)
        self.sharded = sharded_over is not None
        self._options = options
        # The optimizer's parameter list is fixed at creation: record what it holds.
        self._parameter_names = parameters.names
        self._parameter_shapes = parameters.shapes

    @property
    def options(self) -> AdamOptions:
        """The options the optimizer was created with."""
        with self._native():
            return self._options

    @property
    def backend(self) -> str:
        """The backend of the parameters and moments, e.g. ``"cpu"``."""
        return BACKEND_NAMES[self._query("rt_adam_backend", ctypes.c_int32)]

    @property
    def step_count(self) -> int:
        """The number of updates made so far."""
        return self._query("rt_adam_step_count", ctypes.c_uint64)

    @property
    def parameter_count(self) -> int:
        """The number of parameter tensors optimised."""
        return self._query("rt_adam_parameter_count", ctypes.c_uint64)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """The names of the optimised parameters, in order (fixed at creation)."""
        with self._native():
            return self._parameter_names

    @property
    def parameter_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the optimised parameters, in order (fixed at creation)."""
        with self._native():
            return self._parameter_shapes

    @property
    def state_bytes_held(self) -> tuple[int, int]:
        """(the moment bytes this process holds, what an unsharded optimizer holds): equal
        unless the optimizer is sharded."""
        held, unsharded = ctypes.c_uint64(), ctypes.c_uint64()
        with self._native() as pointer:
            check_status(library().rt_adam_sharded_state_bytes(pointer, ctypes.byref(held),
                                                               ctypes.byref(unsharded)))
        return held.value, unsharded.value

    def owns_parameters_of(self, model) -> bool:
        """Whether this optimizer updates parameters of ``model`` (a DecoderOnlyTransformer).

        Objects derived from one model share its lock, so this compares locks; it stays true
        after the model wrapper is closed.
        """
        with self._native():
            return getattr(model, "_lock", None) is self._lock

    @property
    def state_storage(self) -> str:
        """``"contiguous"`` or ``"paged"``."""
        return STATE_STORAGE_NAMES[self._query("rt_adam_state_storage", ctypes.c_int32)]

    @property
    def state_page_size(self) -> int:
        """Scalars per moment page."""
        return self._query("rt_adam_state_page_size", ctypes.c_uint64)

    @property
    def state_page_count(self) -> int:
        """The number of moment pages."""
        return self._query("rt_adam_state_page_count", ctypes.c_uint64)

    @property
    def state_payload_bytes(self) -> int:
        """Bytes held by the two moment arrays."""
        return self._query("rt_adam_state_payload_bytes", ctypes.c_uint64)

    def step(self) -> AdamStepStats:
        """Clip and apply the pending gradients in one transactional update.

        Invalidates every graph built before it (their ``backward()`` becomes a native
        runtime_error).
        """
        stats = AdamStepStatsStruct(struct_size=ctypes.sizeof(AdamStepStatsStruct))
        with self._native() as pointer:
            check_status(library().rt_adam_step(pointer, ctypes.byref(stats)))
        return AdamStepStats(stats.step, stats.gradient_norm, stats.clip_scale,
                             stats.learning_rate)

    def zero_gradients(self) -> None:
        """Clear the pending gradients of every parameter."""
        with self._native() as pointer:
            check_status(library().rt_adam_zero_gradients(pointer))

    zero_grad = zero_gradients

    def state(self) -> AdamState:
        """A copy of the logical state (needs a clean step boundary: no pending gradients)."""
        header = AdamStateStruct(struct_size=ctypes.sizeof(AdamStateStruct))
        native = library()
        with self._native() as pointer:
            check_status(native.rt_adam_state_get(pointer, ctypes.byref(header)))
            count = header.value_count
            values, first_moments, second_moments = (
                array(FLOAT32_TYPECODE, bytes(4 * count)) for _ in range(3)
            )
            check_status(
                native.rt_adam_state_copy_to_host_f32(
                    pointer,
                    (ctypes.c_float * count).from_buffer(values),
                    (ctypes.c_float * count).from_buffer(first_moments),
                    (ctypes.c_float * count).from_buffer(second_moments),
                    count,
                )
            )
        return AdamState(
            header.step_count,
            header.beta1_power,
            header.beta2_power,
            values,
            first_moments,
            second_moments,
        )

    def load_state(self, state: AdamState) -> None:
        """Restore a state from :meth:`state`, transactionally (parameters and moments).

        The three arrays must have equal lengths (ValueError); a length other than the
        parameter count, or an open variable of the model, is a native error and nothing
        changes. Invalidates older graphs.
        """
        if not isinstance(state, AdamState):
            raise TypeError(f"state must be an AdamState, not {type(state).__name__}")
        values, first_moments, second_moments = (
            float32_input(getattr(state, name), f"state.{name}").values
            for name in ("values", "first_moments", "second_moments")
        )
        count = len(values)
        if not count == len(first_moments) == len(second_moments):
            raise ValueError(
                "state.values, state.first_moments and state.second_moments differ in length "
                f"({count}, {len(first_moments)}, {len(second_moments)})"
            )
        header = AdamStateStruct(
            struct_size=ctypes.sizeof(AdamStateStruct),
            step_count=state.step_count,
            beta1_power=state.beta1_power,
            beta2_power=state.beta2_power,
            value_count=count,
        )
        with self._native() as pointer:
            check_status(
                library().rt_adam_state_load_from_host_f32(
                    pointer, ctypes.byref(header), values, first_moments, second_moments, count
                )
            )

    def __repr__(self) -> str:
        if self.closed:
            return "<Adam (closed)>"
        return f"<Adam {self._options} step_count={self.step_count}>"
