"""A model's trainable parameters: names, shapes, and their values as one flat float32 array."""

from __future__ import annotations

import ctypes
from array import array
from functools import partial

from ._abi import DTYPE_BF16, DTYPE_F16, DTYPE_F32
from ._buffers import _ctypes_view, float32_input, read_sized
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._readout import read_array
from ._validation import UINT64_LIMIT, require_int
from .backends import BACKEND_NAMES

# The element types load_from_bytes reads, by their safetensors names: (C ABI value, bytes).
BYTE_DTYPES = {"F32": (DTYPE_F32, 4), "F16": (DTYPE_F16, 2), "BF16": (DTYPE_BF16, 2)}


class ParameterList(NativeHandle):
    """The parameters of one model in canonical order (from ``model.parameters()``).

    The flat order is list order, then each tensor's row-major order. The list shares the
    model's lock and keeps its native state alive, so it stays usable after the model wrapper
    is closed.
    """

    _release_function = "rt_parameter_list_release"

    def __init__(self, *arguments, **keywords) -> None:
        raise TypeError("parameter lists come from model.parameters()")

    def __len__(self) -> int:
        return self._query("rt_parameter_list_count", ctypes.c_uint64)

    @property
    def backend(self) -> str:
        """The backend holding the parameters, e.g. ``"cpu"``."""
        return BACKEND_NAMES[self._query("rt_parameter_list_backend", ctypes.c_int32)]

    @property
    def names(self) -> tuple[str, ...]:
        """The stable name of every parameter, in list order."""
        native = library()
        with self._native() as pointer:
            return tuple(
                # Names are NUL-terminated; the required size counts the NUL.
                read_sized(partial(native.rt_parameter_list_name, pointer, index), ctypes.c_char)
                .raw[:-1]
                .decode("utf-8")
                for index in range(len(self))
            )

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of every parameter, in list order."""
        native = library()
        with self._native() as pointer:
            return tuple(
                tuple(
                    read_sized(
                        partial(native.rt_parameter_list_shape, pointer, index), ctypes.c_uint64
                    )
                )
                for index in range(len(self))
            )

    @property
    def total_numel(self) -> int:
        """The number of scalars in all parameters together."""
        return self._query("rt_parameter_list_total_numel", ctypes.c_uint64)

    def flat_values(self) -> array:
        """Every parameter value in flat order, as a new ``array('f')``."""
        return read_array(self, "rt_parameter_list_copy_to_host_f32")

    def load_flat_values(self, values) -> None:
        """Replace every parameter value (flat order) with ``values``, transactionally.

        ``values``: a float32 buffer, numpy array or sequence of exactly ``total_numel`` finite
        numbers (else native invalid_argument, and nothing changes). Clears gradients and
        invalidates older graphs. While a variable or an Adam optimizer of the model is open,
        this is a native runtime_error.
        """
        data = float32_input(values, "values")
        with self._native() as pointer:
            check_status(
                library().rt_parameter_list_load_from_host_f32(
                    pointer, data.values, len(data.values)
                )
            )

    def load_from_bytes(self, index: int, dtype: str, data) -> None:
        """Replace parameter ``index`` with ``data``: its values as raw little-endian bytes of
        ``dtype`` (``"F32"``, ``"F16"`` or ``"BF16"``, as safetensors names them), row-major,
        converted exactly to float32 in the native library (no Python loop over the values).

        ``data``: any bytes-like object of exactly numel * element size bytes; a writable
        C-contiguous buffer (a ``bytearray``, a copy-on-write ``mmap`` slice) is read in place,
        anything else is copied once. NaN and infinities are loaded as they are (the caller
        decides whether to accept them). Transactional for that parameter; errors are native
        (invalid_argument naming the index, dtype and sizes; out_of_range for the index;
        runtime_error while a variable, Adam optimizer or decode session pins the model).
        """
        if not isinstance(dtype, str) or dtype not in BYTE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(BYTE_DTYPES)} (got {dtype!r})")
        position = require_int(index, "index", 0, UINT64_LIMIT)
        if isinstance(data, str) or not _supports_bytes(data):
            raise TypeError(f"data must be bytes-like, not {type(data).__name__}")
        with memoryview(data) as view:
            byte_count = view.nbytes
        buffer = _ctypes_view(data, ctypes.c_uint8, byte_count)
        with self._native() as pointer:
            check_status(
                library().rt_parameter_list_load_from_bytes(
                    pointer, position, BYTE_DTYPES[dtype][0], buffer, byte_count
                )
            )

    def __repr__(self) -> str:
        if self.closed:
            return "<ParameterList (closed)>"
        return f"<ParameterList len={len(self)} total_numel={self.total_numel}>"


def _supports_bytes(value: object) -> bool:
    try:
        memoryview(value).release()
    except TypeError:
        return False
    return True
