"""A model's trainable parameters: names, shapes, and their values as one flat float32 array."""

from __future__ import annotations

import ctypes
from array import array
from functools import partial

from ._buffers import float32_input, read_sized
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._readout import read_array
from .backends import BACKEND_NAMES


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

    def __repr__(self) -> str:
        if self.closed:
            return "<ParameterList (closed)>"
        return f"<ParameterList len={len(self)} total_numel={self.total_numel}>"
