"""Finding, checking and loading the native library (``libriftco_transformer_c``).

The library is loaded lazily, once per process, by the first call that needs it
(:func:`library`); importing the package never touches it. Candidates are tried in this order:

1. ``$RIFTCO_TRANSFORMER_LIBRARY``: an exact path. When the variable is set it is the *only*
   candidate, so a wrong override fails loudly instead of silently loading another build.
2. The installed wheel layout: the package's ``.libs/`` directory, then the package directory.
3. When the package runs from a source checkout (a directory above it holds ``CMakeLists.txt``
   and ``include/riftco_transformer/c_api.h``): that checkout's build directories, release
   builds before debug builds. A build configured with ``RIFTCO_TRANSFORMER_SANITIZE=ON`` is
   skipped: an AddressSanitizer library cannot be loaded into an interpreter that was not
   started with the sanitizer runtime.
4. The system loader (``ctypes.util.find_library``, else the plain file name, which the dynamic
   loader resolves through its usual search path).

Each candidate is opened and must report a compatible ABI through ``rt_abi_version()`` (same
major, minor at least ours) and export every function this client declares. A candidate that
fails is recorded with its reason and the next one is tried; when all fail, :class:`OSError`
lists every candidate and why it was rejected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path

from . import _abi

LIBRARY_ENVIRONMENT_VARIABLE = "RIFTCO_TRANSFORMER_LIBRARY"
LIBRARY_STEM = "riftco_transformer_c"

# Build directories of a source checkout, relative to its root, in preference order.
SOURCE_TREE_BUILD_DIRECTORIES = (
    "build/release",
    "build/Release",
    "cmake-build-release",
    "build",
    "build/RelWithDebInfo",
    "build/MinSizeRel",
    "build/debug",
    "build/Debug",
    "cmake-build-debug",
)

# Postfixes multi-config generators append to a debug library's name (CMAKE_DEBUG_POSTFIX).
CONFIGURATION_POSTFIXES = ("", "_d", "-d")

_PACKAGE_DIRECTORY = Path(__file__).resolve().parent.parent

_load_lock = threading.Lock()
_loaded_library: ctypes.CDLL | None = None


def library_file_names(postfix: str = "") -> tuple[str, ...]:
    """The file names this platform gives the library, plain name first.

    On Linux and macOS the versioned name carrying the ABI major (the SONAME) follows the
    plain one: a wheel installs the library without its unversioned link.
    """
    stem = LIBRARY_STEM + postfix
    if sys.platform == "win32":
        return (f"{stem}.dll",)
    if sys.platform == "darwin":
        return (f"lib{stem}.dylib", f"lib{stem}.{_abi.ABI_VERSION_MAJOR}.dylib")
    return (f"lib{stem}.so", f"lib{stem}.so.{_abi.ABI_VERSION_MAJOR}")


def find_source_root(start: Path = _PACKAGE_DIRECTORY) -> Path | None:
    """The source checkout that contains ``start``, or None for an installed package."""
    for directory in (start, *start.parents):
        if (directory / "CMakeLists.txt").is_file() and (
            directory / "include" / "riftco_transformer" / "c_api.h"
        ).is_file():
            return directory
    return None


def is_sanitizer_build(build_directory: Path) -> bool:
    """Whether ``build_directory`` is a CMake build configured with the sanitizer option."""
    cache = build_directory / "CMakeCache.txt"
    if not cache.is_file():
        return False
    for line in cache.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("RIFTCO_TRANSFORMER_SANITIZE:"):
            value = line.partition("=")[2].strip().upper()
            return value in ("ON", "1", "TRUE", "YES", "Y")
    return False


def _candidates_in(directory: Path, postfixes: tuple[str, ...] = ("",)) -> list[str]:
    return [
        str(directory / name)
        for postfix in postfixes
        for name in library_file_names(postfix)
        if (directory / name).is_file()
    ]


def candidate_paths() -> tuple[list[str], list[str]]:
    """The candidates to try, in order, and the reasons some locations were skipped.

    Returns ``(candidates, skipped)``: candidates are paths or names for ``ctypes.CDLL``;
    skipped holds one ``"location: reason"`` line per location not tried.
    """
    override = os.environ.get(LIBRARY_ENVIRONMENT_VARIABLE)
    if override:
        return [override], []

    candidates = _candidates_in(_PACKAGE_DIRECTORY / ".libs") + _candidates_in(_PACKAGE_DIRECTORY)
    skipped: list[str] = []
    source_root = find_source_root()
    if source_root is not None:
        for relative in SOURCE_TREE_BUILD_DIRECTORIES:
            build_directory = source_root / relative
            found = _candidates_in(build_directory, CONFIGURATION_POSTFIXES)
            if found and is_sanitizer_build(build_directory):
                skipped += [f"{path}: skipped, a sanitizer build" for path in found]
            else:
                candidates += found
    candidates.append(ctypes.util.find_library(LIBRARY_STEM) or library_file_names()[0])
    return candidates, skipped


def _open_checked(candidate: str) -> ctypes.CDLL:
    """Open ``candidate`` and check its ABI; raise OSError with the reason it is unusable."""
    try:
        library = ctypes.CDLL(candidate)
    except OSError as error:
        raise OSError(f"cannot be loaded ({error})") from None
    try:
        version_function = library.rt_abi_version
    except AttributeError:
        raise OSError("not a riftco_transformer C library (no rt_abi_version)") from None
    version_function.restype = ctypes.c_uint32
    version_function.argtypes = []
    version = version_function()
    major, minor = version >> 16, version & 0xFFFF
    if major != _abi.ABI_VERSION_MAJOR or minor < _abi.ABI_VERSION_MINOR:
        raise OSError(
            f"incompatible ABI {major}.{minor} (this client needs "
            f"{_abi.ABI_VERSION_MAJOR}.x with x >= {_abi.ABI_VERSION_MINOR})"
        )
    try:
        _abi.declare_prototypes(library)
    except AttributeError as error:
        raise OSError(f"ABI {major}.{minor} but a function is missing ({error})") from None
    return library


def load_library() -> ctypes.CDLL:
    """Search, check and open the library (no caching; see :func:`library`)."""
    candidates, skipped = candidate_paths()
    failures = list(skipped)
    for candidate in candidates:
        try:
            return _open_checked(candidate)
        except OSError as reason:
            failures.append(f"{candidate}: {reason}")
    listing = "\n".join(f"  - {failure}" for failure in failures)
    raise OSError(
        "riftco_transformer: no usable native library (libriftco_transformer_c) was found.\n"
        f"Tried:\n{listing}\n"
        f"Build it (cmake --preset release && cmake --build --preset release) or set "
        f"{LIBRARY_ENVIRONMENT_VARIABLE} to the library's path."
    )


def library() -> ctypes.CDLL:
    """The process-wide native library, loaded on first use (thread-safe).

    A failed search raises OSError and is not cached, so a later call (for example after
    setting ``RIFTCO_TRANSFORMER_LIBRARY``) searches again.
    """
    global _loaded_library
    if _loaded_library is None:
        with _load_lock:
            if _loaded_library is None:
                _loaded_library = load_library()
    return _loaded_library
