"""Bulk data between Python objects and the C ABI, as buffers rather than element loops.

Inputs become ctypes arrays that the native call reads:

* a writable, C-contiguous buffer of the right element type (``array('f')``, a float32 numpy
  array, a ``memoryview`` of either) is passed in place, without a copy, and so is a
  C-contiguous numpy array of that type even when it is read-only;
* another read-only or a non-contiguous buffer of the right element type is copied once;
* a numpy array of another numeric dtype is converted once by numpy;
* a Python sequence of numbers, flat or rectangularly nested (at most 64 levels deep, and never
  containing itself), is converted once by ``array``.

A finite value that float32 cannot hold (magnitude above FLT_MAX after rounding, e.g. ``1e39``
or ``10**400``) is a ValueError naming the argument, the element and the value, on every path:
it is never turned into an infinity silently. Infinities and NaNs themselves pass through.

Per-element ctypes loops and tuples of Python floats never appear on the data path. numpy is
optional: it is only used when the caller already passed a numpy array (it is never imported
here).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import numbers
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import NamedTuple

from ._errors import check_status
from ._validation import UINT32_LIMIT, describe_value

FLOAT32_TYPECODE = "f"
# The array typecode whose items are 4-byte unsigned ints ("I" on every mainstream platform).
UINT32_TYPECODE = next(code for code in "IL" if array(code).itemsize == 4)

FLOAT32_MAX = 3.4028234663852886e38
# numpy 2's dimension limit; a list nested deeper is a mistake (or contains itself).
MAXIMUM_NESTING_DEPTH = 64

_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"
_INTEGER_FORMATS = frozenset("bBhHiIlLqQnN")


def _element_format(view: memoryview) -> str:
    """A buffer's struct format without a native byte-order prefix ("<f" -> "f")."""
    format_ = view.format
    if format_[:1] in ("@", "=", _NATIVE_ORDER):
        format_ = format_[1:]
    return format_


def _is_numpy_array(value: object) -> bool:
    """Whether ``value`` is a numpy array (numpy is not imported: an array implies it is)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def _supports_buffer(value: object) -> bool:
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def _ctypes_view(source: object, element_type: type, count: int) -> ctypes.Array:
    """A ctypes array over ``source``'s memory (writable, C-contiguous) or over one copy of it.

    A C-contiguous numpy array is always viewed in place, read-only ones included: its data
    address comes from ``__array_interface__`` and the ctypes array keeps the numpy array
    alive. (The native calls only read ``const`` inputs.)
    """
    if _is_numpy_array(source) and source.flags.c_contiguous:
        address = source.__array_interface__["data"][0]
        in_place = (element_type * count).from_address(address)
        in_place._source = source  # from_address does not keep the memory's owner alive
        return in_place
    view = memoryview(source)
    array_type = element_type * count
    if not view.c_contiguous:
        return array_type.from_buffer_copy(view.tobytes())
    if view.readonly:
        return array_type.from_buffer_copy(view)
    return array_type.from_buffer(view)


# ---- float32 inputs -----------------------------------------------------------------------


class Float32Input(NamedTuple):
    """Values ready for a ``const float*`` argument."""

    values: ctypes.Array  # of c_float; len() is the element count
    nested_shape: tuple[int, ...] | None  # the nesting of a nested Python sequence, else None


def float32_input(values: object, name: str) -> Float32Input:
    """Convert ``values`` (buffer, numpy array, number or nested sequence) for the C ABI.

    A buffer must hold float32 items (TypeError otherwise: convert it explicitly, e.g. with
    ``array('f', values)``). Bools are rejected (TypeError); nested sequences must be
    rectangular, at most MAXIMUM_NESTING_DEPTH deep and must not contain themselves, and a
    finite value beyond float32's range is rejected naming its index (ValueError).
    """
    if _is_numpy_array(values):
        return Float32Input(_float32_from_numpy(values, name), None)
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be float32 values, not {type(values).__name__}")
    if _supports_buffer(values):
        view = memoryview(values)
        if _element_format(view) != "f":
            raise TypeError(
                f"{name}: a buffer of float32 items is needed, got format {view.format!r} "
                "(convert it first, e.g. array('f', values))"
            )
        return Float32Input(_ctypes_view(values, ctypes.c_float, view.nbytes // 4), None)
    flat, nested_shape = _flatten_rectangular(values, name)
    if bool in map(type, flat):
        raise TypeError(f"{name} must hold real numbers, not bools")
    try:
        converted = array(FLOAT32_TYPECODE, flat)
    except TypeError as error:
        raise TypeError(f"{name} must hold real numbers ({error})") from None
    except OverflowError:  # an int beyond float64's range
        _reject_float32_overflow(flat, nested_shape, name)
        raise  # not reached: the scan names the value
    if any(map(math.isinf, converted)):  # an infinity given, or a finite value that overflowed
        _reject_float32_overflow(flat, nested_shape, name)
    return Float32Input(_ctypes_view(converted, ctypes.c_float, len(converted)), nested_shape)


def _reject_float32_overflow(flat: list, nested_shape: tuple[int, ...] | None, name: str) -> None:
    """Raise ValueError for the first finite value of ``flat`` that float32 cannot hold."""
    for index, value in enumerate(flat):
        try:
            # Standard-size packing raises exactly when float32 rounding turns a finite value
            # into ±inf, as array('f') does silently; float() raises for an int beyond float64.
            struct.pack("<f", float(value))
        except OverflowError:
            position = _nested_position(index, nested_shape)
            message = _float32_overflow_message(name, position, describe_value(value))
            raise ValueError(message) from None


def _float32_overflow_message(name: str, position: tuple[int, ...], value_text: str) -> str:
    element = name + "".join(f"[{axis_index}]" for axis_index in position)
    return (
        f"{element} = {value_text} does not fit in float32 (the largest finite float32 is "
        f"{FLOAT32_MAX!r}; pass inf explicitly if that is meant)"
    )


def _nested_position(flat_index: int, nested_shape: tuple[int, ...] | None) -> tuple[int, ...]:
    """The index of a flat element in the caller's nesting (``()`` for a bare number)."""
    if nested_shape is None:
        return (flat_index,)
    position = []
    for extent in reversed(nested_shape):
        flat_index, axis_index = divmod(flat_index, extent)
        position.append(axis_index)
    return tuple(reversed(position))


def _float32_from_numpy(values, name: str) -> ctypes.Array:
    if values.dtype.kind not in "fiu":
        raise TypeError(f"{name} must have a real numeric dtype, not {values.dtype}")
    numpy = sys.modules["numpy"]
    with numpy.errstate(over="ignore"):  # an overflow is reported below, naming the element
        contiguous = numpy.ascontiguousarray(values, dtype=numpy.float32)
    # Only floats wider than float32 can overflow it (every int64/uint64 fits).
    if values.dtype.kind == "f" and values.dtype.itemsize > 4:
        overflowed = numpy.isinf(contiguous.reshape(values.shape))
        if overflowed.any():
            overflowed &= numpy.isfinite(values)
            if overflowed.any():
                position = tuple(int(axis_index) for axis_index in numpy.argwhere(overflowed)[0])
                raise ValueError(_float32_overflow_message(name, position, str(values[position])))
    return _ctypes_view(contiguous, ctypes.c_float, contiguous.size)


def _flatten_rectangular(values: object, name: str) -> tuple[list, tuple[int, ...] | None]:
    """A flat list of the leaves of a rectangular nest of lists/tuples, and its shape.

    A bare number is one value (shape ``()``); a flat sequence has shape ``None`` (taken as
    row-major data of any shape). Leaves are not inspected here; the array conversion does.
    A nest deeper than MAXIMUM_NESTING_DEPTH or one that contains itself is a ValueError.
    """
    if isinstance(values, numbers.Number):
        return [values], ()
    if not isinstance(values, (list, tuple)):
        raise TypeError(
            f"{name} must be a buffer, a numpy array, a number or a list/tuple of numbers, "
            f"not {type(values).__name__}"
        )
    # In a rectangular nest every list sits at one depth, so a list met again below one of
    # the levels above it contains itself. `enclosing` holds the ids of those levels' lists
    # (all of them stay alive in `values` meanwhile).
    enclosing: set[int] = set()
    parents: list = [values]
    level: list = list(values)
    shape = [len(level)]
    while level and isinstance(level[0], (list, tuple)):
        if len(shape) == MAXIMUM_NESTING_DEPTH:
            raise ValueError(f"{name} is nested more than {MAXIMUM_NESTING_DEPTH} levels deep")
        enclosing.update(map(id, parents))
        row_length = len(level[0])
        for row in level:
            if not isinstance(row, (list, tuple)) or len(row) != row_length:
                raise ValueError(
                    f"{name} must be rectangular: rows at depth {len(shape)} differ in "
                    "length or nesting"
                )
            if id(row) in enclosing:
                raise ValueError(
                    f"{name} contains itself (the {type(row).__name__} at depth {len(shape)} "
                    "also encloses it), so it has no shape"
                )
        shape.append(row_length)
        parents = level
        level = list(itertools.chain.from_iterable(level))
    return level, (tuple(shape) if len(shape) > 1 else None)


# ---- uint32 token ids ---------------------------------------------------------------------


class TokenIds(NamedTuple):
    """Token ids ready for a ``const uint32_t*`` argument."""

    values: ctypes.Array  # of c_uint32, row-major
    shape: tuple[int, ...]  # (time,) for one flat row, (batch, time) for a batch


def token_ids(tokens: object, name: str) -> TokenIds:
    """Convert one flat row or a rectangular 2-D batch of token ids for the C ABI.

    Accepted: lists/tuples of ints (flat, or a list of rows), ``array('I')`` rows and other
    integer buffers, and 1-D/2-D numpy integer arrays. Ids must be ints in [0, 2**32):
    TypeError for floats, bools, text and bytes; ValueError for negative or too large ids,
    a ragged batch or another rank.
    """
    if isinstance(tokens, (str, bytes, bytearray)):
        raise TypeError(
            f"{name} must be integer token ids, not {type(tokens).__name__} "
            "(encode text with a Tokenizer first)"
        )
    if _is_numpy_array(tokens):
        if tokens.ndim not in (1, 2):
            raise ValueError(f"{name} must be 1-D or 2-D, got {tokens.ndim}-D")
        contiguous = _uint32_numpy(tokens, name)
        return TokenIds(
            _ctypes_view(contiguous, ctypes.c_uint32, contiguous.size), tuple(tokens.shape)
        )
    if _supports_buffer(tokens):
        view = memoryview(tokens)
        if view.ndim == 1:
            row = _id_row(tokens, name)
            return TokenIds(_ctypes_view(row, ctypes.c_uint32, len(row)), (len(row),))
        tokens = view.tolist()
    if not isinstance(tokens, Sequence):
        raise TypeError(f"{name} must be a sequence of token ids, not {type(tokens).__name__}")
    if len(tokens) == 0 or isinstance(tokens[0], numbers.Number):
        row = _id_row(tokens, name)
        return TokenIds(_ctypes_view(row, ctypes.c_uint32, len(row)), (len(row),))
    rows = [_id_row(row, f"{name}[{index}]") for index, row in enumerate(tokens)]
    time = len(rows[0])
    if any(len(row) != time for row in rows):
        raise ValueError(f"{name} must be rectangular: rows differ in length")
    flat = array(UINT32_TYPECODE)
    for row in rows:
        flat.extend(row)
    return TokenIds(_ctypes_view(flat, ctypes.c_uint32, len(flat)), (len(rows), time))


def _id_row(row: object, name: str) -> array:
    """One row of ids as ``array('I')`` (shared, not copied, when it already is one)."""
    if isinstance(row, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be integer token ids, not {type(row).__name__}")
    if _is_numpy_array(row):
        if row.ndim != 1:
            raise ValueError(f"{name} must be a 1-D row, got {row.ndim}-D")
        return array(UINT32_TYPECODE, _uint32_numpy(row, name).tobytes())
    if _supports_buffer(row):
        view = memoryview(row)
        if view.ndim != 1 or _element_format(view) not in _INTEGER_FORMATS:
            raise TypeError(f"{name} must be a 1-D buffer of integers, got format {view.format!r}")
        if isinstance(row, array) and row.typecode == UINT32_TYPECODE:
            return row
        row = view.tolist()
    if not isinstance(row, Sequence):
        raise TypeError(f"{name} must be a sequence of token ids, not {type(row).__name__}")
    if bool in map(type, row):
        raise TypeError(f"{name} must hold ints, not bools")
    try:
        return array(UINT32_TYPECODE, row)
    except OverflowError:
        raise ValueError(f"{name}: token ids must be in [0, {UINT32_LIMIT})") from None
    except TypeError as error:
        raise TypeError(f"{name} must hold int token ids ({error})") from None


def _uint32_numpy(values, name: str):
    """A C-contiguous uint32 copy (or the array itself, when it already is one)."""
    if values.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, not {values.dtype}")
    if values.size and (int(values.min()) < 0 or int(values.max()) >= UINT32_LIMIT):
        raise ValueError(f"{name}: token ids must be in [0, {UINT32_LIMIT})")
    numpy = sys.modules["numpy"]
    return numpy.ascontiguousarray(values, dtype=numpy.uint32)


# ---- bytes, shapes and outputs ------------------------------------------------------------


def byte_input(data: object, name: str) -> ctypes.Array:
    """A bytes-like object as a ``const uint8_t*`` argument (its raw bytes; str is rejected)."""
    if isinstance(data, str):
        raise TypeError(f"{name} must be bytes-like, not str (encode it, or use the str API)")
    if not _supports_buffer(data):
        raise TypeError(f"{name} must be bytes-like, not {type(data).__name__}")
    view = memoryview(data)
    if view.c_contiguous:
        view = view.cast("B")
    return _ctypes_view(view, ctypes.c_uint8, view.nbytes)


def uint64_array(values: tuple[int, ...]) -> ctypes.Array:
    """A short tuple of validated ints (a shape) as a ``const uint64_t*`` argument."""
    return (ctypes.c_uint64 * len(values))(*values)


def writable_float32_view(buffer: object, count: int, name: str) -> ctypes.Array:
    """A ctypes view over a caller's writable float32 buffer of exactly ``count`` items."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"{name} must be a writable float32 buffer") from None
    if _element_format(view) != "f":
        raise TypeError(f"{name} must hold float32 items, got format {view.format!r}")
    if view.readonly:
        raise TypeError(f"{name} must be writable")
    if not view.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if view.nbytes != 4 * count:
        raise ValueError(f"{name} must hold exactly {count} float32 values, got {view.nbytes // 4}")
    return (ctypes.c_float * count).from_buffer(view)


def read_sized(call, element_type: type) -> ctypes.Array:
    """Run a ``(out, capacity, *required)`` native call twice: size query, then copy.

    ``call(out, capacity, required_pointer)`` must return a status. The result holds exactly
    the required number of elements. The caller holds the handle's lock across this call.
    """
    required = ctypes.c_uint64()
    check_status(call(None, 0, ctypes.byref(required)))
    count = required.value
    output = (element_type * count)()
    if count:
        check_status(call(output, count, ctypes.byref(required)))
        if required.value != count:
            raise RuntimeError(
                f"native result size changed between the size query ({count}) and the copy "
                f"({required.value})"
            )
    return output
