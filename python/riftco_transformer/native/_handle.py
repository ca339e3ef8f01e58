"""The base of every wrapper that owns one native handle.

Lifetime and thread-safety contract (the same for every wrapper class):

* ``close()`` releases the handle; it is idempotent, and ``closed`` reports it. Every other
  method and property of a closed wrapper raises ``RuntimeError("<Class> is closed")``.
* A wrapper is a context manager (``with`` closes it) and has a finalizer that releases the
  handle silently when the wrapper is garbage-collected without ``close()``.
* Every native call and every release happens while holding the wrapper's lock, so a
  ``close()`` on one thread can never free a handle that a call on another thread is using.
  The raw C handles contain no locks; this lock is what makes the Python objects safe to
  share between threads. Wrappers derived from one model share that model's lock, because
  the C contract serialises calls on all handles derived from the same model.
* Wrappers cannot be copied or pickled (TypeError): a native handle has exactly one owner.
  Share a wrapper by sharing the Python reference.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from ._errors import check_status
from ._loader import library


def _release_under_lock(release, pointer: int, lock: threading.RLock) -> None:
    with lock:
        release(pointer)


class NativeHandle:
    """Owns one native handle: lock, close, finalizer, and the checks for use after close.

    Subclasses name their release function in ``_release_function``. They call
    ``_adopt(pointer, lock)`` exactly once, right after the native call that created the
    handle succeeded.
    """

    _release_function: str
    _pointer: int | None = None  # also what a half-constructed wrapper reports: closed
    _lock: threading.RLock

    def _adopt(self, pointer: int, lock: threading.RLock) -> None:
        self._lock = lock
        self._pointer = pointer
        release = getattr(library(), self._release_function)
        self._finalizer = weakref.finalize(self, _release_under_lock, release, pointer, lock)

    @classmethod
    def _from_pointer(cls, pointer: int, lock: threading.RLock):
        """A wrapper for a handle that a native call just produced (no public constructor)."""
        wrapper = cls.__new__(cls)
        wrapper._adopt(pointer, lock)
        return wrapper

    @property
    def closed(self) -> bool:
        """Whether the handle has been released."""
        return self._pointer is None

    def close(self) -> None:
        """Release the native handle (idempotent).

        Waits for a call on another thread that is using the handle to finish first.
        """
        if self._pointer is None:
            return
        with self._lock:
            self._pointer = None
            self._finalizer()

    @contextmanager
    def _native(self) -> Iterator[int]:
        """Hold the lock and yield the live handle; RuntimeError when closed."""
        with self._lock:
            if self._pointer is None:
                raise RuntimeError(f"{type(self).__name__} is closed")
            yield self._pointer

    def _query(self, function_name: str, value_type: type):
        """The value written by ``rt_...(handle, &value)``."""
        value = value_type()
        with self._native() as pointer:
            check_status(getattr(library(), function_name)(pointer, ctypes.byref(value)))
        return value.value

    def __enter__(self):
        with self._native():
            return self

    def __exit__(self, *exception_info) -> None:
        self.close()

    def __copy__(self):
        raise TypeError(f"{type(self).__name__} owns a native handle and cannot be copied")

    def __deepcopy__(self, memo):
        raise TypeError(f"{type(self).__name__} owns a native handle and cannot be copied")

    def __reduce_ex__(self, protocol):
        raise TypeError(f"{type(self).__name__} owns a native handle and cannot be pickled")

    def __repr__(self) -> str:
        state = "closed" if self._pointer is None else "open"
        return f"<{type(self).__name__} ({state})>"
