"""Contexts (a backend selection) and immutable float32 tensors."""

from __future__ import annotations

import ctypes
import threading
from functools import partial

from ._buffers import float32_input, read_sized, uint64_array
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._readout import Float32Readout
from ._validation import shape_dimensions
from .backends import BACKEND_NAMES, backend_value


class Context(NativeHandle):
    """Selects the backend that new tensors are stored on.

    ``backend`` is a backend name or ABI value, or ``"auto"``. An unavailable explicit backend
    raises RiftcoTransformerError (status ``backend_unavailable``). Tensors created from a
    context stay valid after the context is closed.
    """

    _release_function = "rt_context_release"

    def __init__(self, backend: str | int = "cpu") -> None:
        value = backend_value(backend, allow_auto=True)
        pointer = ctypes.c_void_p()
        check_status(library().rt_context_create(value, ctypes.byref(pointer)))
        self._adopt(pointer.value, threading.RLock())

    @property
    def backend(self) -> str:
        """The backend's name, e.g. ``"cpu"``."""
        return BACKEND_NAMES[self._query("rt_context_backend", ctypes.c_int32)]


class Tensor(Float32Readout, NativeHandle):
    """An immutable, row-major float32 tensor on one backend.

    Create one with :meth:`from_data` or :meth:`zeros`, or as the product of two tensors.
    Shape ``()`` is a scalar (one value).
    """

    _release_function = "rt_tensor_release"
    _copy_to_host_function = "rt_tensor_copy_to_host_f32"

    def __init__(self, *arguments, **keywords) -> None:
        raise TypeError("create tensors with Tensor.from_data(...) or Tensor.zeros(...)")

    @classmethod
    def from_data(cls, context: Context, shape, values) -> Tensor:
        """A tensor of ``shape`` holding a copy of ``values`` (row-major).

        ``values``: a float32 buffer or numpy array (any shape, read row-major), a flat
        list/tuple of numbers, a list nested exactly like ``shape``, or a number for shape
        ``()``. A count that differs from the shape's product is a native invalid_argument.
        """
        _require_context(context)
        dimensions = shape_dimensions(shape)
        data = float32_input(values, "values")
        if data.nested_shape is not None and data.nested_shape != dimensions:
            raise ValueError(f"values are nested as {data.nested_shape}, but shape is {dimensions}")
        pointer = ctypes.c_void_p()
        with context._native() as context_pointer:
            check_status(
                library().rt_tensor_create_f32(
                    context_pointer,
                    uint64_array(dimensions),
                    len(dimensions),
                    data.values,
                    len(data.values),
                    ctypes.byref(pointer),
                )
            )
        return cls._from_pointer(pointer.value, threading.RLock())

    @classmethod
    def zeros(cls, context: Context, shape) -> Tensor:
        """A tensor of ``shape`` filled with zeros."""
        _require_context(context)
        dimensions = shape_dimensions(shape)
        pointer = ctypes.c_void_p()
        with context._native() as context_pointer:
            check_status(
                library().rt_tensor_zeros_f32(
                    context_pointer,
                    uint64_array(dimensions),
                    len(dimensions),
                    ctypes.byref(pointer),
                )
            )
        return cls._from_pointer(pointer.value, threading.RLock())

    @property
    def backend(self) -> str:
        """The backend that stores this tensor, e.g. ``"cpu"``."""
        return BACKEND_NAMES[self._query("rt_tensor_backend", ctypes.c_int32)]

    @property
    def rank(self) -> int:
        """The number of dimensions (0 for a scalar)."""
        return self._query("rt_tensor_rank", ctypes.c_uint64)

    @property
    def numel(self) -> int:
        """The number of values (1 for a scalar)."""
        return self._query("rt_tensor_numel", ctypes.c_uint64)

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions, e.g. ``(2, 3)``; ``()`` for a scalar."""
        with self._native() as pointer:
            return tuple(read_sized(partial(library().rt_tensor_shape, pointer), ctypes.c_uint64))

    def matmul(self, other: Tensor) -> Tensor:
        """The product ``[..., M, K] x [..., K, N] -> [..., M, N]`` on the shared backend.

        Mismatched shapes or backends are a native invalid_argument.
        """
        if not isinstance(other, Tensor):
            raise TypeError(f"matmul needs a Tensor, not {type(other).__name__}")
        pointer = ctypes.c_void_p()
        # Take both locks in one global order, so a @ b and b @ a on two threads cannot deadlock;
        # inside them both handles are known to be open.
        first, second = sorted((self, other), key=id)
        with first._native(), second._native():
            check_status(
                library().rt_tensor_matmul(self._pointer, other._pointer, ctypes.byref(pointer))
            )
        return Tensor._from_pointer(pointer.value, threading.RLock())

    def __matmul__(self, other: object) -> Tensor:
        if not isinstance(other, Tensor):
            return NotImplemented
        return self.matmul(other)

    def __repr__(self) -> str:
        if self.closed:
            return "<Tensor (closed)>"
        return f"<Tensor shape={self.shape} backend={self.backend!r}>"


def _require_context(context: object) -> None:
    if not isinstance(context, Context):
        raise TypeError(f"context must be a Context, not {type(context).__name__}")
