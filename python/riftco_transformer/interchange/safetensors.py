"""Safetensors files of float32 tensors: a strict reader and a deterministic writer.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian unsigned header
length N, N bytes of UTF-8 JSON, then the data buffer. The JSON is an object that maps each
tensor name to ``{"dtype": ..., "shape": [...], "data_offsets": [begin, end]}`` (byte offsets
into the data buffer, which starts right after the header) and may hold one ``"__metadata__"``
object of string values. The header may end in spaces so that the data starts aligned.

Only ``F32`` tensors are supported, in both directions.

Reading (:func:`read_safetensors`, :func:`parse_safetensors`) accepts what the format allows
and nothing else: a header of at most :data:`SAFETENSORS_MAXIMUM_HEADER_BYTES` holding at most
:data:`SAFETENSORS_MAXIMUM_TENSORS` tensors, no duplicate keys, no unknown fields, every
tensor's byte span exactly its shape's size, the spans tiling the data buffer exactly (no
overlap, no gap, no trailing or missing byte), finite values only. Every malformed input is a
ValueError whose message starts with the source (the path, or ``"<bytes>"``) and names the
field or tensor at fault, whatever the bytes are; sizes a header claims are checked against
the real buffer before anything is allocated. Dimensions and offsets must fit in 64 bits (the
reference implementation's ``usize``).

Writing (:func:`write_safetensors`, :func:`encode_safetensors`) is deterministic, the same
tensors and metadata giving the same bytes: the tensors' data in the given order, contiguous
and little-endian, then a compact JSON header with sorted keys, padded with spaces so that the
data starts 8-byte aligned. Everything is validated before the first byte is written, and the
file is published atomically (see ``riftco_transformer._files``): a failed write leaves the
destination as it was.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import reprlib
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn

from .._container import (
    DuplicateKeyError,
    NonStandardConstantError,
    json_kind,
    reject_constant,
    unique_keys,
)
from .._files import atomic_write

SAFETENSORS_MAXIMUM_TENSORS = 8192
SAFETENSORS_MAXIMUM_HEADER_BYTES = 100 * 1024 * 1024

METADATA_KEY = "__metadata__"
F32 = "F32"
_F32_BYTES = 4
_LENGTH_BYTES = 8
_ALIGNMENT = 8
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")
# Dimensions and offsets are u64 in the reference implementation (usize on 64-bit machines).
_INTEGER_LIMIT = 1 << 64

_BIG_ENDIAN = sys.byteorder == "big"
_NATIVE_ORDER = ">" if _BIG_ENDIAN else "<"
_SWAPPED_ORDER = "<" if _BIG_ENDIAN else ">"
# Buffer formats converted to float32 element by element (float64 and the integer types).
_CONVERTIBLE_FORMATS = frozenset("dbBhHiIlLqQnN")

_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60
_SHORT_REPR.maxlist = 8


@dataclass(frozen=True)
class SafetensorsTensor:
    """One float32 tensor of a safetensors file.

    ``values`` is an ``array('f')`` of ``prod(shape)`` elements in row-major order, in this
    machine's byte order (one element for the 0-d shape ``()``, none when a dimension is 0).
    """

    name: str
    shape: tuple[int, ...]
    values: array


# ---- Writing.


def write_safetensors(
    path: str | os.PathLike, tensors: Mapping, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` (and ``metadata``) as the safetensors file ``path``; returns its Path.

    ``tensors`` maps each name (a non-empty str other than ``"__metadata__"``) to ``(shape,
    values)`` or to a :class:`SafetensorsTensor` (whose ``name`` is then ignored). ``shape`` is
    a tuple (or list) of non-negative ints; ``values`` holds ``prod(shape)`` finite numbers,
    flat and row-major: a buffer (``array('f')``, a ``memoryview``, a numpy array; float32 is
    taken without conversion, float64 and integer buffers are rounded to float32) or a
    sequence of numbers. ``metadata`` maps str to str.

    TypeError for an argument of the wrong type; ValueError (naming the tensor, and for a
    non-finite value its flat index) for a wrong value, including one that rounds to an
    infinity in float32. The file is written atomically, and only after everything is
    validated. See the module docstring for the layout.
    """
    prefix, buffers = _prepare(tensors, metadata)

    def write(stream: BinaryIO) -> None:
        stream.write(prefix)
        for buffer in buffers:
            stream.write(buffer)

    return atomic_write(path, write)


def encode_safetensors(tensors: Mapping, metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes :func:`write_safetensors` would write for ``tensors`` and ``metadata``."""
    prefix, buffers = _prepare(tensors, metadata)
    return b"".join([prefix, *buffers])


def _prepare(tensors: object, metadata: object) -> tuple[bytes, list[memoryview]]:
    """The validated file: its length prefix and header, and each tensor's little-endian data."""
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"tensors must be a mapping of name -> (shape, values), not {type(tensors).__name__}"
        )
    if len(tensors) > SAFETENSORS_MAXIMUM_TENSORS:
        raise ValueError(
            f"{len(tensors)} tensors exceed the maximum of {SAFETENSORS_MAXIMUM_TENSORS}"
        )
    header: dict[str, object] = {}
    buffers: list[memoryview] = []
    offset = 0
    for name, entry in tensors.items():
        _check_writer_name(name)
        shape, values = _unpack_entry(name, entry)
        shape = _writer_shape(name, shape)
        flat = _float32_values(name, values)
        count = _bounded_product(shape, _INTEGER_LIMIT)
        if count != len(flat):
            holds = f"{count}" if count is not None else "more than 2**64"
            raise ValueError(
                f"tensor {_describe(name)}: shape {_describe(shape)} holds {holds} elements, "
                f"but its values have {len(flat)}"
            )
        index = _first_non_finite(flat)
        if index is not None:
            raise ValueError(
                f"tensor {_describe(name)}: element {index} is {flat[index]} as float32; only "
                "finite values can be written"
            )
        end = offset + _F32_BYTES * count
        header[name] = {"dtype": F32, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
        buffers.append(_little_endian_bytes(flat))
    checked_metadata = _writer_metadata(metadata)
    if checked_metadata:
        header[METADATA_KEY] = checked_metadata
    encoded = json.dumps(
        header, separators=(",", ":"), sort_keys=True, ensure_ascii=False
    ).encode("utf-8")
    encoded += b" " * (-len(encoded) % _ALIGNMENT)
    if len(encoded) > SAFETENSORS_MAXIMUM_HEADER_BYTES:
        raise ValueError(
            f"the header would be {len(encoded)} bytes, more than the maximum of "
            f"{SAFETENSORS_MAXIMUM_HEADER_BYTES}"
        )
    return len(encoded).to_bytes(_LENGTH_BYTES, "little") + encoded, buffers


def _check_writer_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(
            f"tensor names must be str, not {type(name).__name__} ({_describe(name)})"
        )
    if not name:
        raise ValueError("tensor names must not be empty")
    if name == METADATA_KEY:
        raise ValueError(f"{METADATA_KEY!r} is reserved for the metadata, not a tensor name")
    _require_utf8(name, f"tensor name {_describe(name)}")


def _unpack_entry(name: str, entry: object) -> tuple[object, object]:
    if isinstance(entry, SafetensorsTensor):
        return entry.shape, entry.values
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return entry[0], entry[1]
    raise TypeError(
        f"tensor {_describe(name)} must map to (shape, values) or a SafetensorsTensor, not "
        f"{type(entry).__name__}"
    )


def _writer_shape(name: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):
        raise TypeError(
            f"tensor {_describe(name)}: shape must be a tuple of ints, not {type(shape).__name__}"
        )
    dimensions = []
    for axis, dimension in enumerate(shape):
        if isinstance(dimension, bool) or not isinstance(dimension, numbers.Integral):
            raise TypeError(
                f"tensor {_describe(name)}: shape[{axis}] must be an int, not "
                f"{type(dimension).__name__} ({_describe(dimension)})"
            )
        if not 0 <= int(dimension) < _INTEGER_LIMIT:
            raise ValueError(
                f"tensor {_describe(name)}: shape[{axis}] must be in [0, 2**64), got "
                f"{_describe(int(dimension))}"
            )
        dimensions.append(int(dimension))
    return tuple(dimensions)


def _float32_values(name: str, values: object) -> memoryview | array:
    """``values`` as a flat float32 sequence (a memoryview of format "f" or an array("f")).

    Float32 data in this machine's byte order is taken without a copy when it is contiguous.
    """
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(
            f"tensor {_describe(name)}: values must be numbers (array('f'), a memoryview, a "
            f"list), not {type(values).__name__}"
        )
    try:
        view = memoryview(values)
    except TypeError:
        view = None
    if view is not None:
        format_ = view.format
        if format_[:1] in ("@", "=", _NATIVE_ORDER):
            format_ = format_[1:]
        if format_ == "f":
            if view.c_contiguous:
                return view.cast("B").cast("f")
            return memoryview(view.tobytes()).cast("f")
        if format_ == _SWAPPED_ORDER + "f":
            swapped = array("f")
            swapped.frombytes(view.tobytes())
            swapped.byteswap()
            return swapped
        if format_ in _CONVERTIBLE_FORMATS:
            return array("f", memoryview(view.tobytes()).cast(format_))
        raise TypeError(
            f"tensor {_describe(name)}: values have buffer format {view.format!r}; pass "
            "float32, float64 or integer data"
        )
    if not isinstance(values, Sequence):
        raise TypeError(
            f"tensor {_describe(name)}: values must be a buffer or a sequence of numbers, not "
            f"{type(values).__name__}"
        )
    try:
        return array("f", values)
    except OverflowError as error:
        raise ValueError(f"tensor {_describe(name)}: a value is out of range ({error})") from None
    except TypeError as error:
        raise TypeError(
            f"tensor {_describe(name)}: values must be a flat sequence of numbers ({error})"
        ) from None


def _little_endian_bytes(flat: memoryview | array) -> memoryview:
    if _BIG_ENDIAN:
        swapped = array("f")
        swapped.frombytes(flat)
        swapped.byteswap()
        flat = swapped
    return memoryview(flat).cast("B")


def _writer_metadata(metadata: object) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of str -> str, not {type(metadata).__name__}")
    checked = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"metadata must map str to str, got {_describe(key)} -> {_describe(value)}"
            )
        _require_utf8(key, f"metadata key {_describe(key)}")
        _require_utf8(value, f"metadata[{_describe(key)}]")
        checked[key] = value
    return checked


def _require_utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{what} cannot be encoded as UTF-8 ({error.reason})") from None


# ---- Reading.


def read_safetensors(
    path: str | os.PathLike,
) -> tuple[dict[str, SafetensorsTensor], dict[str, str]]:
    """The tensors and metadata of the safetensors file ``path`` (see :func:`parse_safetensors`).

    TypeError for a ``path`` that is no str or os.PathLike, FileNotFoundError when the file does
    not exist, IsADirectoryError when it is a directory; ValueError (starting with the path)
    when it is not a valid file.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    source = Path(path)
    if source.is_dir():
        raise IsADirectoryError(f"path {str(source)!r} is a directory, not a file")
    return parse_safetensors(source.read_bytes(), source=str(source))


def parse_safetensors(
    data: bytes | bytearray | memoryview, source: str = "<bytes>"
) -> tuple[dict[str, SafetensorsTensor], dict[str, str]]:
    """The tensors and metadata of the safetensors file whose bytes are ``data``.

    Returns ``(tensors, metadata)``: the tensors by name in data order (by offset; zero-size
    tensors sharing an offset in header order), and the ``__metadata__`` strings (empty when
    the file has none). ``data`` is only read. Every rule of the module docstring that the
    bytes break is a ValueError starting with ``f"{source}: "``; TypeError when ``data`` is
    no bytes-like object.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, not {type(source).__name__}")
    if isinstance(data, str):
        raise TypeError("data must be bytes-like, not str")
    try:
        original = memoryview(data)
    except TypeError:
        raise TypeError(f"data must be bytes-like, not {type(data).__name__}") from None
    # Released on the way out, even by an exception: a ValueError kept by the caller (its
    # traceback holds this frame) must not keep a bytearray locked against resizing.
    with original:
        if original.ndim == 1 and original.format == "B" and original.c_contiguous:
            return _parse(original, source)
        return _parse(memoryview(original.tobytes()), source)


def _parse(view: memoryview, source: str) -> tuple[dict[str, SafetensorsTensor], dict[str, str]]:
    """:func:`parse_safetensors` of a flat byte view."""
    header, header_length = _parse_header(view, source)
    metadata = _reader_metadata(header, source)
    entries = [
        (*_reader_entry(name, entry, source), name)
        for name, entry in header.items()
        if name != METADATA_KEY
    ]
    entries.sort(key=lambda entry: (entry[1], entry[2]))  # stable: ties in header order
    data_start = _LENGTH_BYTES + header_length
    _check_tiling(entries, len(view) - data_start, source)
    tensors = {}
    for shape, begin, end, name in entries:
        values = array("f")
        values.frombytes(view[data_start + begin : data_start + end])
        if _BIG_ENDIAN:
            values.byteswap()
        index = _first_non_finite(values)
        if index is not None:
            _fail(
                source,
                f"tensor {_describe(name)}: element {index} is {values[index]}; only finite "
                "values are allowed",
            )
        tensors[name] = SafetensorsTensor(name, shape, values)
    return tensors, metadata


def _parse_header(view: memoryview, source: str) -> tuple[dict[str, object], int]:
    """The header object of a file and its length in bytes."""
    if len(view) < _LENGTH_BYTES:
        _fail(source, f"the file is {len(view)} bytes, too short for the 8-byte header length")
    length = int.from_bytes(view[:_LENGTH_BYTES], "little")
    if length == 0:
        _fail(source, "the header length is 0 (the header must be a JSON object)")
    if length > SAFETENSORS_MAXIMUM_HEADER_BYTES:
        _fail(
            source,
            f"the header length {length} exceeds the maximum of "
            f"{SAFETENSORS_MAXIMUM_HEADER_BYTES} bytes",
        )
    if length > len(view) - _LENGTH_BYTES:
        _fail(
            source,
            f"the header length {length} runs past the end of the file (only "
            f"{len(view) - _LENGTH_BYTES} bytes follow it)",
        )
    try:
        text = str(view[_LENGTH_BYTES : _LENGTH_BYTES + length], "utf-8")
    except UnicodeDecodeError as error:
        _fail(
            source,
            f"the header is not valid UTF-8 (at header byte {error.start}: {error.reason})",
        )
    try:
        header = json.loads(text, object_pairs_hook=unique_keys, parse_constant=reject_constant)
    except DuplicateKeyError as error:
        _fail(source, f"the header has the key {_describe(error.key)} twice")
    except NonStandardConstantError as error:
        _fail(source, f"the header is not valid JSON ({error.constant} is no JSON value)")
    except RecursionError:
        _fail(source, "the header is not valid JSON (nested too deeply)")
    except ValueError as error:  # json.JSONDecodeError, or an integer with too many digits
        _fail(source, f"the header is not valid JSON ({error})")
    if not isinstance(header, dict):
        _fail(source, f"the header must be a JSON object, not {_json_type(header)}")
    for name in header:
        _reader_text(name, f"the key {_describe(name)}", source)
    tensor_count = len(header) - (METADATA_KEY in header)
    if tensor_count > SAFETENSORS_MAXIMUM_TENSORS:
        _fail(
            source,
            f"the header lists {tensor_count} tensors, more than the maximum of "
            f"{SAFETENSORS_MAXIMUM_TENSORS}",
        )
    return header, length


def _reader_metadata(header: dict[str, object], source: str) -> dict[str, str]:
    if METADATA_KEY not in header:
        return {}
    metadata = header[METADATA_KEY]
    if not isinstance(metadata, dict):
        _fail(source, f"{METADATA_KEY} must be an object of strings, not {_json_type(metadata)}")
    for key, value in metadata.items():
        if not isinstance(value, str):
            _fail(
                source,
                f"{METADATA_KEY}[{_describe(key)}] must be a string, not {_json_type(value)}",
            )
        _reader_text(key, f"the {METADATA_KEY} key {_describe(key)}", source)
        _reader_text(value, f"{METADATA_KEY}[{_describe(key)}]", source)
    return dict(metadata)


def _reader_entry(name: str, entry: object, source: str) -> tuple[tuple[int, ...], int, int]:
    """One header entry as ``(shape, begin, end)``, each field checked on its own and the span
    checked against the shape."""
    tensor = f"tensor {_describe(name)}"
    if not isinstance(entry, dict):
        _fail(source, f"{tensor} must be an object, not {_json_type(entry)}")
    unknown = [key for key in entry if key not in _ENTRY_KEYS]
    if unknown:
        _fail(
            source,
            f"{tensor} has unknown field(s) {', '.join(map(_describe, unknown))} (only dtype, "
            "shape and data_offsets are allowed)",
        )
    for key in _ENTRY_KEYS:
        if key not in entry:
            _fail(source, f"{tensor} has no {key}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        _fail(source, f"{tensor}: dtype must be a string, not {_json_type(dtype)}")
    if dtype != F32:
        _fail(source, f"{tensor}: dtype {_describe(dtype)} is not supported (only F32 is)")
    shape = entry["shape"]
    if not isinstance(shape, list):
        _fail(source, f"{tensor}: shape must be an array of integers, not {_json_type(shape)}")
    for axis, dimension in enumerate(shape):
        if not _is_json_integer(dimension):
            _fail(
                source, f"{tensor}: shape[{axis}] must be an integer, not {_json_type(dimension)}"
            )
        if not 0 <= dimension < _INTEGER_LIMIT:
            _fail(source, f"{tensor}: shape[{axis}] is {_describe(dimension)}, not in [0, 2**64)")
    offsets = entry["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2:
        _fail(
            source,
            f"{tensor}: data_offsets must be an array of two integers, not "
            f"{_describe(offsets) if isinstance(offsets, list) else _json_type(offsets)}",
        )
    for position, offset in zip(("begin", "end"), offsets, strict=True):
        if not _is_json_integer(offset):
            _fail(
                source,
                f"{tensor}: data_offsets {position} must be an integer, not {_json_type(offset)}",
            )
    begin, end = offsets
    if not 0 <= begin <= end < _INTEGER_LIMIT:
        _fail(
            source,
            f"{tensor}: data_offsets [{_describe(begin)}, {_describe(end)}] must satisfy "
            "0 <= begin <= end < 2**64",
        )
    span = end - begin
    count = _bounded_product(shape, _INTEGER_LIMIT)
    if count is None or _F32_BYTES * count != span:
        needs = f"{_F32_BYTES * count}" if count is not None else "more than 2**64"
        _fail(
            source,
            f"{tensor}: data_offsets [{begin}, {end}] span {span} bytes, but F32 shape "
            f"{_describe(shape)} needs {needs}",
        )
    return tuple(shape), begin, end


def _check_tiling(entries: list, buffer_length: int, source: str) -> None:
    """Whether the spans (sorted by offset) cover the data buffer exactly, once each."""
    covered = 0
    previous = None
    for _shape, begin, end, name in entries:
        if begin > covered:
            where = (
                f"between tensors {_describe(previous)} and"
                if previous is not None
                else "before tensor"
            )
            _fail(
                source,
                f"bytes [{covered}, {begin}) of the data buffer belong to no tensor ({where} "
                f"{_describe(name)})",
            )
        if begin < covered:
            _fail(
                source,
                f"tensors {_describe(previous)} and {_describe(name)} overlap (data_offsets of "
                f"{_describe(name)} begin at {begin}, before {covered})",
            )
        if end > buffer_length:
            _fail(
                source,
                f"tensor {_describe(name)} ends at byte {end} of the data buffer, but the file "
                f"holds only {buffer_length} data bytes ({end - buffer_length} missing)",
            )
        covered = end
        previous = name
    if covered < buffer_length:
        after = f"after tensor {_describe(previous)}" if previous is not None else "with no tensors"
        _fail(
            source,
            f"{buffer_length - covered} trailing bytes in the data buffer {after} (the tensors "
            f"cover {covered} of {buffer_length} bytes)",
        )


def _reader_text(text: str, what: str, source: str) -> None:
    """A ValueError when ``text`` holds a lone surrogate (a JSON escape like "\\ud800", which
    is no Unicode text: the reference implementation rejects it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _fail(source, f"{what} holds a lone surrogate escape (not valid Unicode)")


def _is_json_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: object) -> str:
    """What a JSON value is, for an error message (values shown by _describe)."""
    return json_kind(value, _describe)


def _fail(source: str, message: str) -> NoReturn:
    raise ValueError(f"{source}: {message}")


# ---- Shared.


def _bounded_product(dimensions: Sequence[int], limit: int) -> int | None:
    """``prod(dimensions)``, or None when it exceeds ``limit`` (never computing a huge one)."""
    if 0 in dimensions:
        return 0
    product = 1
    for dimension in dimensions:
        product *= dimension
        if product > limit:
            return None
    return product


def _first_non_finite(values: memoryview | array) -> int | None:
    """The index of the first NaN or infinity in ``values``, or None when all are finite."""
    if math.isfinite(sum(values)):  # float32 magnitudes cannot overflow a double's sum
        return None
    for index, value in enumerate(values):
        if not math.isfinite(value):
            return index
    return None


def _describe(value: object) -> str:
    """``value`` for an error message: its repr, shortened."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    return _SHORT_REPR.repr(value)
