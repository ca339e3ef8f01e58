"""The two on-disk building blocks of our artifacts: canonical JSON and deterministic ZIP.

Canonical JSON (:func:`canonical_json`) is UTF-8 with sorted keys, compact separators and no
NaN or infinity, so equal content gives equal bytes, and a SHA-256 over those bytes is a
content-derived identity. :func:`strict_json` is its reader: it rejects duplicate keys,
NaN/Infinity literals, invalid UTF-8 and anything but one JSON document.

The ZIP writer (:func:`write_stored_zip`) stores members uncompressed, in the order given,
with a fixed timestamp (1980-01-01 00:00), zero attributes and no extra fields, so the same
members give the same bytes on every platform. The reader (:func:`read_stored_zip`) accepts
exactly that shape and nothing else: the expected member names in the expected order,
stored, no gaps or overlaps between the local records, the central directory and the end
record, matching local and central headers, and every CRC-32 verified. Any deviation is a
ValueError naming the member and the field. Members and the archive stay below 4 GiB (no
ZIP64).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import BinaryIO

# ---- canonical JSON ------------------------------------------------------------------------


def canonical_json(value: object) -> bytes:
    """``value`` as canonical JSON bytes (ValueError for NaN/infinity or unserialisable data)."""
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"cannot write canonical JSON: {error}") from None
    return text.encode("utf-8")


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


class DuplicateKeyError(ValueError):
    """A JSON object names ``key`` twice (raised by :func:`unique_keys`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


class NonStandardConstantError(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``, which JSON does not have (raised by
    :func:`reject_constant`)."""

    def __init__(self, constant: str) -> None:
        super().__init__(f"{constant} is not valid JSON (non-finite numbers are not allowed)")
        self.constant = constant


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s ``object_pairs_hook`` for strict readers: a key given twice is a
    :class:`DuplicateKeyError` (Python's default silently keeps the last one)."""
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKeyError(key)
        result[key] = value
    return result


def reject_constant(constant: str) -> object:
    """``json.loads``'s ``parse_constant`` for strict readers
    (:class:`NonStandardConstantError`)."""
    raise NonStandardConstantError(constant)


def strict_json(data: bytes, source: str) -> object:
    """One JSON document from UTF-8 ``data``; ValueError (prefixed ``source: ``) otherwise."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{source}: not valid UTF-8 at byte {error.start}") from None
    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=reject_constant)
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply") from None
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{source}: invalid JSON: {error}") from None


# ---- deterministic stored ZIP ----------------------------------------------------------------

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # signature .. extra length (30 bytes)
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # 46 bytes
_END = struct.Struct("<IHHHHIIH")  # 22 bytes
_LOCAL_SIGNATURE = 0x04034B50
_CENTRAL_SIGNATURE = 0x02014B50
_END_SIGNATURE = 0x06054B50
_VERSION = 20  # "2.0": stored members, made on MS-DOS attributes (host 0)
_DOS_TIME = 0
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_LIMIT = 0xFFFFFFFF


def json_kind(value: object, describe: Callable[[object], str] = repr) -> str:
    """What a parsed JSON value is, for an error message: ``null``, ``a boolean (true)``,
    ``a number (<describe(value)>)``, ``a string (<describe(value)>)``, ``an array`` or
    ``an object``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, (int, float)):
        return f"a number ({describe(value)})"
    if isinstance(value, str):
        return f"a string ({describe(value)})"
    return "an array" if isinstance(value, list) else "an object"


def write_stored_zip(stream: BinaryIO, members: Sequence[tuple[str, object]]) -> None:
    """Write ``members`` ((ASCII name, bytes-like data) pairs) as a deterministic stored ZIP."""
    offset = 0
    central = []
    for name, data in members:
        encoded = name.encode("ascii")
        view = memoryview(data).cast("B")
        size = view.nbytes
        crc = zlib.crc32(view)
        if size >= _LIMIT or offset + size + 30 + len(encoded) >= _LIMIT:
            raise ValueError(f"member {name!r} makes the archive reach 4 GiB (ZIP64 unsupported)")
        header = _LOCAL.pack(
            _LOCAL_SIGNATURE, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, size, size, len(encoded), 0
        )
        stream.write(header)
        stream.write(encoded)
        stream.write(view)
        central.append((encoded, crc, size, offset))
        offset += len(header) + len(encoded) + size
    directory_offset = offset
    directory_size = 0
    for encoded, crc, size, local_offset in central:
        record = _CENTRAL.pack(
            _CENTRAL_SIGNATURE, _VERSION, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, size, size,
            len(encoded), 0, 0, 0, 0, 0, local_offset,
        )
        stream.write(record)
        stream.write(encoded)
        directory_size += len(record) + len(encoded)
    if directory_offset + directory_size >= _LIMIT:
        raise ValueError("the archive reaches 4 GiB (ZIP64 unsupported)")
    stream.write(
        _END.pack(
            _END_SIGNATURE, 0, 0, len(central), len(central), directory_size, directory_offset, 0
        )
    )


def read_stored_zip(
    data, expected: Sequence[str], source: str, optional: Sequence[str] = ()
) -> dict[str, memoryview]:
    """The members of a ZIP written by :func:`write_stored_zip`, as views into ``data``.

    The archive must hold the ``expected`` names, in that order, each optionally followed
    (in the order of ``optional``, which lists names allowed after the expected ones) by the
    optional names that are present. Every deviation is a ValueError prefixed ``source: ``.
    """
    view = memoryview(data).cast("B")
    size = view.nbytes
    if size < _END.size:
        raise ValueError(f"{source}: {size} bytes is too short for a ZIP archive (truncated?)")
    (signature, disk, directory_disk, disk_entries, entries, directory_size, directory_offset,
     comment_length) = _END.unpack_from(view, size - _END.size)
    if signature != _END_SIGNATURE:
        raise ValueError(f"{source}: no ZIP end record at the end of the file (truncated or not a "
                         "bundle)")
    if disk or directory_disk or disk_entries != entries or comment_length:
        raise ValueError(f"{source}: unsupported ZIP end record (multi-disk or comment)")
    if directory_offset + directory_size != size - _END.size:
        raise ValueError(f"{source}: the ZIP central directory does not end at the end record")
    allowed = list(expected) + list(optional)
    if not len(expected) <= entries <= len(allowed):
        raise ValueError(
            f"{source}: the archive has {entries} members; expected {len(expected)}"
            + (f" to {len(allowed)}" if optional else "")
        )
    members: dict[str, memoryview] = {}
    position = directory_offset
    local_position = 0
    names = []
    for index in range(entries):
        if position + _CENTRAL.size > size - _END.size:
            raise ValueError(f"{source}: central directory entry {index} is truncated")
        fields = _CENTRAL.unpack_from(view, position)
        (signature, _made, _needed, flags, method, _time, _date, crc, compressed, uncompressed,
         name_length, extra_length, comment_length, _disk, _internal, _external,
         local_offset) = fields
        if signature != _CENTRAL_SIGNATURE:
            raise ValueError(f"{source}: central directory entry {index} has a bad signature")
        name_bytes = bytes(view[position + _CENTRAL.size : position + _CENTRAL.size + name_length])
        try:
            name = name_bytes.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"{source}: member {index} has a non-ASCII name") from None
        names.append(name)
        expected_name = _member_name_at(index, names, expected, optional, source)
        if flags or method:
            raise ValueError(
                f"{source}: member {expected_name!r} must be stored uncompressed without flags "
                f"(method {method}, flags {flags:#x})"
            )
        if compressed != uncompressed:
            raise ValueError(f"{source}: member {name!r} has mismatched sizes")
        if extra_length or comment_length:
            raise ValueError(f"{source}: member {name!r} has extra fields or a comment")
        if local_offset != local_position:
            raise ValueError(
                f"{source}: member {name!r} starts at {local_offset}, expected {local_position} "
                "(gap or overlap)"
            )
        # Versions, timestamps and attributes must be exactly what the writer puts there.
        if bytes(view[position : position + _CENTRAL.size]) != _CENTRAL.pack(
            _CENTRAL_SIGNATURE, _VERSION, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc,
            uncompressed, uncompressed, name_length, 0, 0, 0, 0, 0, local_offset,
        ):
            raise ValueError(f"{source}: member {name!r}: central header fields are not ours")
        position += _CENTRAL.size + name_length
        if position > size - _END.size:
            raise ValueError(f"{source}: central directory entry {name!r} is truncated")
        # The local record must agree with the central one.
        if local_offset + _LOCAL.size > directory_offset:
            raise ValueError(f"{source}: member {name!r}: local header is truncated")
        local = _LOCAL.unpack_from(view, local_offset)
        if local[0] != _LOCAL_SIGNATURE:
            raise ValueError(f"{source}: member {name!r}: bad local header signature")
        if local != (_LOCAL_SIGNATURE, _VERSION, 0, 0, _DOS_TIME, _DOS_DATE, crc, uncompressed,
                     uncompressed, name_length, 0):
            raise ValueError(f"{source}: member {name!r}: local and central headers disagree")
        start = local_offset + _LOCAL.size
        if bytes(view[start : start + name_length]) != name_bytes:
            raise ValueError(f"{source}: member {name!r}: local header names another member")
        begin = start + name_length
        end = begin + uncompressed
        if end > directory_offset:
            raise ValueError(f"{source}: member {name!r} runs past the central directory "
                             "(truncated?)")
        body = view[begin:end]
        if zlib.crc32(body) != crc:
            raise ValueError(f"{source}: member {name!r} fails its CRC-32 check (corrupted)")
        members[name] = body
        local_position = end
    if local_position != directory_offset:
        raise ValueError(f"{source}: {directory_offset - local_position} unexplained bytes before "
                         "the central directory")
    return members


def _member_name_at(
    index: int, names: list[str], expected: Sequence[str], optional: Sequence[str], source: str
) -> str:
    name = names[-1]
    if index < len(expected):
        if name != expected[index]:
            raise ValueError(
                f"{source}: member {index} is {name!r}, expected {expected[index]!r}"
            )
        return name
    extras = names[len(expected):]
    order = [candidate for candidate in optional if candidate in extras]
    if name not in optional or len(set(extras)) != len(extras) or order != extras:
        raise ValueError(
            f"{source}: unexpected member {name!r} (allowed after {list(expected)}: "
            f"{list(optional)}, in that order)"
        )
    return name
