"""An immutable multilinear map T[O, d_1, ..., d_k] (output-major doubles), held natively."""

from __future__ import annotations

import ctypes
import threading

from ..native._buffers import read_sized
from ..native._errors import check_status
from ..native._handle import NativeHandle
from ..native._loader import library
from ..native._validation import UINT64_LIMIT, require_int


def _dimensions(output_dimension, input_dimensions) -> tuple[int, tuple[int, ...]]:
    output = require_int(output_dimension, "output_dimension", 1, UINT64_LIMIT)
    if isinstance(input_dimensions, (str, bytes)):
        raise TypeError("input_dimensions must be a sequence of ints")
    dims = tuple(
        require_int(d, f"input_dimensions[{i}]", 1, UINT64_LIMIT)
        for i, d in enumerate(input_dimensions)
    )
    return output, dims


def _doubles(values, name: str) -> ctypes.Array:
    """A sequence (or buffer) of numbers as a ``double[]``; no dense Python list is built for
    buffers (array('d'), numpy float64 arrays)."""
    try:
        view = memoryview(values)
    except TypeError:
        view = None
    if view is not None and view.format == "d" and view.c_contiguous:
        flat = view.cast("B").cast("d")
        return (ctypes.c_double * len(flat)).from_buffer_copy(flat)
    items = list(values)
    for i, value in enumerate(items):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}[{i}] must be a real number, not {type(value).__name__}")
    return (ctypes.c_double * len(items))(*items)


def _indices(indices, name: str) -> ctypes.Array:
    try:
        view = memoryview(indices)
    except TypeError:
        view = None
    if view is not None and view.format in ("Q", "L") and view.itemsize == 8 and view.c_contiguous:
        flat = view.cast("B").cast("Q")
        return (ctypes.c_uint64 * len(flat)).from_buffer_copy(flat)
    items = [require_int(v, f"{name}[{i}]", 0, UINT64_LIMIT) for i, v in enumerate(indices)]
    return (ctypes.c_uint64 * len(items))(*items)


class MultilinearMap(NativeHandle):
    """``y_o = Σ T[o, j_1..j_k] x¹_{j_1}···xᵏ_{j_k}``; arity 0 is a constant. Immutable.

    Create it with :meth:`from_dense` or :meth:`from_sparse`; a model copies it, so the map
    may be closed once the model exists.
    """

    _release_function = "rt_multilinear_map_release"

    def __init__(self, *arguments, **keywords) -> None:
        raise TypeError("use MultilinearMap.from_dense(...) or MultilinearMap.from_sparse(...)")

    @classmethod
    def from_dense(cls, output_dimension, input_dimensions, values) -> MultilinearMap:
        """Every element, output-major: exactly ``O·Πd_i`` finite numbers."""
        output, dims = _dimensions(output_dimension, input_dimensions)
        data = _doubles(values, "values")
        native_dims = (ctypes.c_uint64 * len(dims))(*dims)
        pointer = ctypes.c_void_p()
        check_status(
            library().rt_multilinear_map_create_dense(
                output, native_dims, len(dims), data, len(data), ctypes.byref(pointer)
            )
        )
        return cls._from_pointer(pointer.value, threading.RLock())

    @classmethod
    def from_sparse(cls, output_dimension, input_dimensions, indices, values) -> MultilinearMap:
        """Non-zero elements at distinct flat output-major ``indices`` (any order); none is the
        zero map. Buffers of uint64 indices and float64 values are passed without building
        Python lists."""
        output, dims = _dimensions(output_dimension, input_dimensions)
        native_indices = _indices(indices, "indices")
        data = _doubles(values, "values")
        if len(native_indices) != len(data):
            raise ValueError(
                f"indices and values must have the same length ({len(native_indices)} vs "
                f"{len(data)})"
            )
        native_dims = (ctypes.c_uint64 * len(dims))(*dims)
        pointer = ctypes.c_void_p()
        check_status(
            library().rt_multilinear_map_create_sparse(
                output,
                native_dims,
                len(dims),
                native_indices,
                data,
                len(data),
                ctypes.byref(pointer),
            )
        )
        return cls._from_pointer(pointer.value, threading.RLock())

    @property
    def output_dimension(self) -> int:
        return self._query("rt_multilinear_map_output_dimension", ctypes.c_uint64)

    @property
    def input_dimensions(self) -> tuple[int, ...]:
        with self._native() as pointer:
            return tuple(
                read_sized(
                    lambda out, capacity, required: library().rt_multilinear_map_input_dimensions(
                        pointer, out, capacity, required
                    ),
                    ctypes.c_uint64,
                )
            )

    @property
    def arity(self) -> int:
        return self._query("rt_multilinear_map_arity", ctypes.c_uint64)

    def values(self) -> tuple[float, ...]:
        """Every element, output-major."""
        with self._native() as pointer:
            return tuple(
                read_sized(
                    lambda out, capacity, required: library().rt_multilinear_map_values(
                        pointer, out, capacity, required
                    ),
                    ctypes.c_double,
                )
            )

    def __repr__(self) -> str:
        if self.closed:
            return "<MultilinearMap (closed)>"
        return f"<MultilinearMap output={self.output_dimension} inputs={self.input_dimensions}>"
