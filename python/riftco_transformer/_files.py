"""Atomic file publication, shared by every artifact writer (bundles, checkpoints, safetensors).

A reader of the destination sees either the old file or the new one, whole: the bytes go to
a temporary file in the destination's directory, are flushed and fsynced, and the temporary
file is renamed over the destination (``os.replace``, atomic on POSIX within one file
system); the directory is then fsynced so the rename itself survives a crash. A process
killed mid-write leaves at most a stray temporary file beside the destination, never a
truncated destination.

Stray temporary files are swept by the next save to the same destination. The rule:

* a temporary file is named ``.<name>.<pid>.<random>.tmp`` (``<name>`` the destination's
  file name, ``<pid>`` the writer's process id, for a person reading the directory), and
  its writer holds an exclusive ``flock`` on it from just after creating it until after the
  rename (or the removal, on failure). The kernel drops that lock when the writer's process
  dies, SIGKILL included, so the lock, not the pid (which the system may reuse), tells a
  live writer from a dead one;
* before writing, a save removes each file of exactly that name pattern for its own
  destination whose lock it can take: a dead writer's leftover. A file locked by a live
  writer (another process, or another thread of this one) is never removed. The sweeper
  holds the lock while it checks the name still refers to the file it locked and removes
  it, and a writer checks, once it holds its lock, that its name still refers to its file
  (taking a fresh name otherwise), so a sweep that races a writer's first instant removes
  nothing the writer goes on to use;
* temporary files of other destinations, of the older unlocked ``.<name>.<random>.tmp``
  form, or not regular files are left alone, as is any file the sweep cannot open or lock
  (the sweep is best effort and never fails a save). Without ``fcntl`` (Windows) nothing
  is locked and nothing is swept.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows: temporary files are neither locked nor swept
    fcntl = None


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

    First removes the stale temporary files of dead writers of ``path`` (the sweep rule in
    the module docstring). On any failure (including one raised by ``write``) this save's
    temporary file is removed and the destination is left as it was.
    """
    destination = destination_path(path, argument)
    sweep_temporary_files(destination)
    descriptor, temporary = _locked_temporary(destination)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
            if fcntl is not None:
                # Renamed while still open, so the lock covers the file until it has its
                # final name; Windows cannot rename an open file (and holds no lock).
                os.replace(temporary, destination)
        if fcntl is None:
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


def temporary_file_pattern(destination: Path) -> re.Pattern[str]:
    """The names of ``destination``'s temporary files (``.<name>.<pid>.<random>.tmp``)."""
    return re.compile(rf"\.{re.escape(destination.name)}\.[0-9]+\.[A-Za-z0-9_]+\.tmp")


def sweep_temporary_files(destination: Path) -> list[Path]:
    """Remove the temporary files of ``destination`` whose writer is gone (their lock is
    free); the removed paths. Best effort: a file that cannot be examined is kept."""
    if fcntl is None:
        return []
    pattern = temporary_file_pattern(destination)
    removed = []
    try:
        entries = [entry.name for entry in os.scandir(destination.parent)
                   if pattern.fullmatch(entry.name)]
    except OSError:
        return []
    for name in entries:
        candidate = destination.parent / name
        if _remove_if_abandoned(candidate):
            removed.append(candidate)
    return removed


def _remove_if_abandoned(candidate: Path) -> bool:
    flags = os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(candidate, flags)
    except OSError:  # gone already, a symbolic link, not ours to open
        return False
    try:
        opened = os.fstat(descriptor)
        if not stat.S_ISREG(opened.st_mode):
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # locked: its writer is alive
            return False
        if not _same_file(candidate, opened):
            return False  # renamed or replaced since it was opened
        os.unlink(candidate)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)  # releases the lock


def _locked_temporary(destination: Path) -> tuple[int, str]:
    """A new temporary file for ``destination`` (descriptor, path), exclusively locked."""
    while True:
        descriptor, temporary = tempfile.mkstemp(
            prefix=f".{destination.name}.{os.getpid()}.", suffix=".tmp",
            dir=destination.parent,
        )
        if fcntl is None:
            return descriptor, temporary
        try:
            # Blocks only while a sweep that saw the file unlocked decides about it.
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            if _same_file(Path(temporary), os.fstat(descriptor)):
                return descriptor, temporary
        except BaseException:
            os.close(descriptor)
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
            raise
        os.close(descriptor)  # swept between its creation and the lock: take another name


def _same_file(path: Path, opened: os.stat_result) -> bool:
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)


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
