"""Reading a handle's float32 values to the host.

Tensors, variables and parameter lists expose their values through one
``rt_*_copy_to_host_f32(handle, out, capacity, *required)`` function each. The element count is
queried and the copy made under one acquisition of the handle's lock, so the destination
always matches the values it receives.
"""

from __future__ import annotations

import ctypes
from array import array

from ._buffers import FLOAT32_TYPECODE, writable_float32_view
from ._errors import check_status
from ._loader import library


def copy_to_host(wrapper, function_name: str, destination_for_count) -> None:
    """Copy ``wrapper``'s values into ``destination_for_count(count)`` (a ctypes float array)."""
    copy = getattr(library(), function_name)
    required = ctypes.c_uint64()
    with wrapper._native() as pointer:
        check_status(copy(pointer, None, 0, ctypes.byref(required)))
        count = required.value
        check_status(copy(pointer, destination_for_count(count), count, ctypes.byref(required)))


def read_array(wrapper, function_name: str) -> array:
    """``wrapper``'s values as a new ``array('f')``.

    The array is allocated by repetition (one allocation, filled by doubling memcpy) and then
    written by the native copy. Most of the time goes to the kernel mapping the new array's
    pages; ``copy_to`` into a reused buffer, or ``numpy()``, avoids that.
    """
    allocated: list[array] = []

    def allocate(count: int) -> ctypes.Array:
        values = array(FLOAT32_TYPECODE, [0.0]) * count if count else array(FLOAT32_TYPECODE)
        allocated.append(values)
        return (ctypes.c_float * count).from_buffer(values)

    copy_to_host(wrapper, function_name, allocate)
    return allocated[-1]


class Float32Readout:
    """Mixin for a :class:`NativeHandle` holding a row-major float32 array of some ``shape``.

    Subclasses name their copy function in ``_copy_to_host_function`` and provide ``shape``.
    """

    _copy_to_host_function: str

    def to_array(self) -> array:
        """Every value, row-major, as a new ``array('f')``."""
        return read_array(self, self._copy_to_host_function)

    def tolist(self) -> list[float]:
        """Every value, row-major, as a flat list of floats."""
        return self.to_array().tolist()

    def copy_to(self, buffer) -> None:
        """Write every value, row-major, into ``buffer`` without intermediate copies.

        ``buffer`` must be a writable, C-contiguous buffer of exactly ``numel`` float32 items
        (``array('f')``, a float32 numpy array, a ``memoryview``...): TypeError/ValueError
        otherwise, and nothing is written.
        """
        copy_to_host(
            self,
            self._copy_to_host_function,
            lambda count: writable_float32_view(buffer, count, "buffer"),
        )

    def numpy(self):
        """The values as a new float32 numpy array of this object's shape.

        Raises ImportError when numpy is not installed (numpy is optional; ``to_array()``
        needs nothing).
        """
        try:
            import numpy
        except ImportError:
            raise ImportError(
                f"{type(self).__name__}.numpy() needs numpy, which is not installed; "
                "use to_array() or tolist() instead"
            ) from None
        result = numpy.empty(self.shape, dtype=numpy.float32)
        self.copy_to(result)
        return result
