"""Autograd variables (model outputs and losses) and the cross-entropy losses.

A variable belongs to its model: it shares the model's lock and keeps the model's native state
alive, so it stays usable after the model wrapper is closed. While a variable whose graph no
``backward()`` has consumed is open, the model is pinned (``model.to(...)``, parameter loads,
LoRA attach/merge and NF4 conversion fail with runtime_error); close variables you no longer
need, or use them in ``with`` blocks. Once ``backward()`` consumed a graph, its variables hold
only their values and pin nothing.

Graphs are single-use: ``backward()`` consumes the graph (a second call is a native
runtime_error), and an Adam step or a parameter load makes every older graph fail at
``backward()`` (runtime_error). Values stay readable after either.
"""

from __future__ import annotations

import ctypes
import math
from functools import partial

from ._buffers import byte_input, read_sized, token_ids
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._readout import Float32Readout
from ._validation import UINT64_LIMIT, require_bool, require_int, require_real
from .backends import BACKEND_NAMES


class Variable(Float32Readout, NativeHandle):
    """A node of a model's autograd graph: its values (row-major float32) and ``backward()``.

    Produced by calling a :class:`DecoderOnlyTransformer` and by :func:`cross_entropy` or
    :func:`cross_entropy_time_range`; there is no public constructor.
    """

    _release_function = "rt_variable_release"
    _copy_to_host_function = "rt_variable_copy_to_host_f32"

    def __init__(self, *arguments, **keywords) -> None:
        raise TypeError("variables come from calling a model or from cross_entropy(...)")

    @property
    def backend(self) -> str:
        """The backend holding the values, e.g. ``"cpu"``."""
        return BACKEND_NAMES[self._query("rt_variable_backend", ctypes.c_int32)]

    @property
    def rank(self) -> int:
        """The number of dimensions (0 for a scalar such as a loss)."""
        return self._query("rt_variable_rank", ctypes.c_uint64)

    @property
    def numel(self) -> int:
        """The number of values."""
        return self._query("rt_variable_numel", ctypes.c_uint64)

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions, e.g. ``(batch, time, vocabulary)`` for logits; ``()`` for a loss."""
        with self._native() as pointer:
            return tuple(read_sized(partial(library().rt_variable_shape, pointer), ctypes.c_uint64))

    def item(self) -> float:
        """The single value of a one-element variable (ValueError for any other size)."""
        with self._native():
            numel = self.numel
            if numel != 1:
                raise ValueError(f"item() needs exactly one value; this Variable has {numel}")
            return self.to_array()[0]

    def backward(self) -> None:
        """Compute the gradients of this scalar with respect to the model's parameters.

        Replaces the gradients of the parameters it reaches (they are not accumulated) and
        consumes the graph.
        """
        with self._native() as pointer:
            check_status(library().rt_variable_backward(pointer))

    def backward_scaled(self, scale: float, accumulate: bool = False) -> None:
        """Backward with the seed ``scale`` instead of 1; with ``accumulate`` the gradients are
        ADDED to the pending ones (gradient accumulation over micro-batches: backward each
        micro-batch's mean loss scaled by its share of the batch's counted targets, then one
        optimizer step). Consumes the graph. C ABI 2.13."""
        value = require_real(scale, "scale")
        if not math.isfinite(value):
            raise ValueError(f"scale must be finite, got {scale!r}")
        require_bool(accumulate, "accumulate")
        with self._native() as pointer:
            check_status(library().rt_variable_backward_scaled(pointer, value, int(accumulate)))

    def __repr__(self) -> str:
        if self.closed:
            return "<Variable (closed)>"
        return f"<Variable shape={self.shape} backend={self.backend!r}>"


def cross_entropy(logits: Variable, targets) -> Variable:
    """The mean cross-entropy of ``logits [..., V]`` against one target id per position.

    ``targets`` is a flat row of ``numel / V`` ids, or a 2-D batch nested exactly like the
    logits' leading dimensions (ValueError otherwise). A wrong count is a native
    invalid_argument; an id >= V is a native out_of_range. The result is a scalar variable of
    the same model.
    """
    return _loss("rt_cross_entropy", logits, targets)


def cross_entropy_time_range(logits: Variable, targets, offset: int, count: int) -> Variable:
    """The mean cross-entropy of ``logits [B, T, V]`` over time steps ``[offset, offset+count)``.

    The same slice of every row counts (``B * count`` positions); ``targets`` hold one id per
    position, all ``B * T`` of them, flat or nested ``[B][T]`` as for :func:`cross_entropy`.
    Every target is checked, only the slice's contribute, and ``backward()`` gives the logits
    outside the slice an exactly zero gradient. ``offset`` (>= 0) and ``count`` (> 0) are
    ints (TypeError otherwise, ValueError out of range). Native errors: logits of rank != 3
    or a target count != B*T is invalid_argument; ``offset + count > T`` or an id >= V is
    out_of_range.
    """
    time_offset = require_int(offset, "offset", 0, UINT64_LIMIT)
    time_count = require_int(count, "count", 1, UINT64_LIMIT)
    return _loss("rt_cross_entropy_time_range", logits, targets, time_offset, time_count)


def cross_entropy_masked(logits: Variable, targets, mask) -> Variable:
    """The mean cross-entropy over the positions ``mask`` selects (a response-only loss).

    ``targets`` as for :func:`cross_entropy`; ``mask`` holds one flag per position, 0 or 1,
    flat (bytes-like or a sequence of ints) or as rows matching the targets' nesting. The
    mean runs over the flagged positions and ``backward()`` gives the others an exactly zero
    gradient. Native errors: a count mismatch, a flag > 1 or no flagged position is
    invalid_argument; an id >= V is out_of_range.
    """
    if isinstance(mask, (str,)):
        raise TypeError("mask must hold 0/1 flags, not str")
    if isinstance(mask, (bytes, bytearray, memoryview)):
        flags = bytes(mask)
    else:
        rows = list(mask)
        if rows and not isinstance(rows[0], int):
            flags = b"".join(bytes(row) for row in rows)
        else:
            try:
                flags = bytes(rows)
            except (TypeError, ValueError):
                raise ValueError("mask flags must be ints 0 or 1") from None
    mask_view = byte_input(flags, "mask")
    return _loss("rt_cross_entropy_masked", logits, targets, mask_view, len(flags))


def _loss(function: str, logits: Variable, targets, *window) -> Variable:
    """The scalar loss variable the native ``function(logits, ids, id_count, *window, out)``
    makes, after the checks every loss shares: a Variable, and targets converted and nested
    like the logits' leading shape."""
    if not isinstance(logits, Variable):
        raise TypeError(f"logits must be a Variable, not {type(logits).__name__}")
    target_ids = token_ids(targets, "targets")
    loss = ctypes.c_void_p()
    with logits._native() as pointer:
        if len(target_ids.shape) == 2 and target_ids.shape != logits.shape[:-1]:
            raise ValueError(
                f"targets are nested as {target_ids.shape}, but the logits' leading shape is "
                f"{logits.shape[:-1]}"
            )
        check_status(
            getattr(library(), function)(
                pointer, target_ids.values, len(target_ids.values), *window, ctypes.byref(loss)
            )
        )
    return Variable._from_pointer(loss.value, logits._lock)
