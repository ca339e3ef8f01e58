"""Execution backends: names, ABI values, availability and ``"auto"`` selection.

A backend is named by a string (``"cpu"``, ``"metal"``, ``"cuda"``, ``"tpu"``, ``"pjrt"``;
case and surrounding spaces ignored) or by its ABI value (0-4). Requesting an explicit backend
that cannot run here fails in the native call (status ``backend_unavailable``); nothing ever
substitutes another backend. Only ``"auto"`` chooses: the first available of tpu, cuda,
metal, cpu. It never picks ``"pjrt"`` (any PJRT plugin, the one named by
``RIFTCO_TRANSFORMER_PJRT_PLUGIN``), which runs only when asked for by name or value.
"""

from __future__ import annotations

import ctypes

from ._abi import BACKEND_CPU, BACKEND_CUDA, BACKEND_METAL, BACKEND_PJRT, BACKEND_TPU
from ._errors import check_status
from ._loader import library

BACKEND_VALUES = {
    "cpu": BACKEND_CPU,
    "metal": BACKEND_METAL,
    "cuda": BACKEND_CUDA,
    "tpu": BACKEND_TPU,
    "pjrt": BACKEND_PJRT,
}
BACKEND_NAMES = {value: name for name, value in BACKEND_VALUES.items()}
AUTO_PREFERENCE = ("tpu", "cuda", "metal", "cpu")  # never "pjrt": explicit requests only


def backend_value(backend: object, *, allow_auto: bool = False) -> int:
    """The ABI value of ``backend`` (a name, an ABI value, or ``"auto"`` when allowed).

    TypeError for a bool or another type; ValueError for an unknown name or value.
    """
    if isinstance(backend, bool):
        raise TypeError("backend must be a name or an int, not bool")
    if isinstance(backend, int):
        if backend not in BACKEND_NAMES:
            raise ValueError(f"unknown backend value {backend} (known: 0-{len(BACKEND_NAMES) - 1})")
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or an int, not {type(backend).__name__}")
    name = backend.strip().lower()
    if allow_auto and name == "auto":
        return BACKEND_VALUES[next(name for name in AUTO_PREFERENCE if backend_available(name))]
    if name not in BACKEND_VALUES:
        known = ", ".join(BACKEND_VALUES) + (", auto" if allow_auto else "")
        raise ValueError(f"unknown backend {backend!r} (known: {known})")
    return BACKEND_VALUES[name]


def backend_available(backend: object) -> bool:
    """Whether ``backend`` (a name or ABI value) was compiled in and can run on this machine."""
    available = ctypes.c_int32()
    check_status(library().rt_backend_is_available(backend_value(backend), ctypes.byref(available)))
    return available.value == 1


def cpu_info() -> str:
    """What the CPU backend runs: ``"gemm=<library and kernel family>; threads=<n>"``.

    For example ``"gemm=onednn 2.6.3 jit sgemm (isa avx512_core); threads=2"``: the GEMM
    library the build linked and the instruction set its kernels dispatch to on this machine.
    """
    function = library().rt_cpu_info
    required = ctypes.c_uint64()
    check_status(function(None, 0, ctypes.byref(required)))
    buffer = ctypes.create_string_buffer(required.value)
    check_status(function(buffer, required.value, ctypes.byref(required)))
    return buffer.value.decode("utf-8")
