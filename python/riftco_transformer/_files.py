"""Atomic file publication, shared by every artifact writer (bundles, checkpoints, safetensors).

A reader of the destination sees either the old file or the new one, whole: the bytes go to
a temporary file in the destination's directory, are flushed and fsynced, and the temporary
file is renamed over the destination (``os.replace``, atomic on POSIX within one file
system); the directory is then fsynced so the rename itself survives a crash. A process
killed mid-write leaves at most a stray ``.<name>.<random>.tmp`` beside the destination,
never a truncated destination.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def destination_path(path: object, argument: str = "path") -> Path:
    """``path`` (str or os.PathLike) as a Path that may be written: TypeError for another
    type, IsADirectoryError when it names a directory, FileNotFoundError when its directory
    does not exist."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a str or os.PathLike, not {type(path).__name__}")
    destination = Path(path)
    if destination.is_dir():
        raise IsADirectoryError(f"{argument} {str(destination)!r} is a directory, not a file")
    parent = destination.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"{argument}: directory {str(parent)!r} does not exist")
    return destination


def read_file(path: object, what: str) -> tuple[bytes, str]:
    """``(bytes, source name)`` of the file an artifact loader was given: FileNotFoundError
    when it is missing, IsADirectoryError (naming ``what`` was expected) for a directory."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    source = Path(path)
    if source.is_dir():
        raise IsADirectoryError(f"{str(source)!r} is a directory, not {what}")
    return source.read_bytes(), str(source)


def atomic_write(path: object, write: Callable[[BinaryIO], None], argument: str = "path") -> Path:
    """Publish what ``write(stream)`` writes as ``path``, atomically (see the module docstring).

    On any failure (including one raised by ``write``) the temporary file is removed and the
    destination is left as it was.
    """
    destination = destination_path(path, argument)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent
    )
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, destination)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(destination.parent)
    return destination


def atomic_write_bytes(path: object, data: bytes, argument: str = "path") -> Path:
    """:func:`atomic_write` of one bytes-like object."""
    return atomic_write(path, lambda stream: stream.write(data), argument)


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform without directory descriptors: the rename is still atomic
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
