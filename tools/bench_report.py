"""Helpers shared by the benchmark scripts in tools/: the environment each side of a
comparison runs in, what a BLAS reports about its kernels, a status line, aligned tables.

Each side runs at its best, not in one shared environment: ours runs as a user runs it
(inherited environment, thread counts set, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed);
a peer gets the same thread counts and whatever else makes it run its best kernel (see
numpy_environment and torch_environment). Standard library only: these run in the parent
process of the scripts, and mapped_openblas_info also inside peer subprocesses.
"""
import ctypes
import os
import sys
from pathlib import Path

OPENBLAS_OPENMP_DIR = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
THREAD_VARIABLES = ("RIFTCO_TRANSFORMER_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# Variables that override OpenBLAS's own CPU detection and cache sizing. A machine may export
# them (for an old OpenBLAS); a current OpenBLAS then runs slower kernels, and a user does not
# set them, so no side inherits them.
OPENBLAS_TUNING_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

# OpenBLAS kernel families (openblas_get_corename, threadpoolctl's "architecture") that are
# generic fallbacks: what OpenBLAS runs when it does not recognise the CPU (0.3.21 on newer
# CPUs picks Prescott), or SSE-era kernels. Compared lowercase.
GENERIC_KERNELS = frozenset((
    "generic", "unknown", "katmai", "coppermine", "northwood", "prescott", "banias", "core2",
    "penryn", "dunnington", "atom", "nano", "athlon", "opteron", "opteron_sse3", "barcelona",
    "bobcat"))
# Families without AVX2/FMA kernels: a fallback too on a CPU that has AVX2 and FMA.
PRE_AVX2_KERNELS = frozenset((
    "nehalem", "sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"))


def thread_environment(threads: int) -> dict[str, str]:
    """This process's environment with every thread-count variable set to ``threads``."""
    environment = dict(os.environ)
    for variable in THREAD_VARIABLES:
        environment[variable] = str(threads)
    return environment


def user_environment(threads: int, openblas_coretype: str | None = None) -> dict[str, str]:
    """The environment a user runs in: this process's, thread counts set to ``threads``,
    OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed; then OPENBLAS_CORETYPE set to
    ``openblas_coretype`` when that is a non-empty string (an explicit experiment)."""
    environment = thread_environment(threads)
    for variable in OPENBLAS_TUNING_VARIABLES:
        environment.pop(variable, None)
    if openblas_coretype:
        environment["OPENBLAS_CORETYPE"] = openblas_coretype
    return environment


def removed_tuning_variables() -> dict[str, str]:
    """The OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE this process inherited (which
    user_environment removes), for the report."""
    return {v: os.environ[v] for v in OPENBLAS_TUNING_VARIABLES if v in os.environ}


def holds_blas(directory: str) -> bool:
    """Whether an LD_LIBRARY_PATH entry holds a BLAS (an OpenBLAS, BLIS or reference build)."""
    if "blas" in directory.lower() or "blis" in directory.lower():
        return True
    try:
        return any(name.startswith(("libblas.so", "libopenblas")) for name in os.listdir(directory))
    except OSError:
        return False


def numpy_environment(threads: int) -> dict[str, str]:
    """The numpy peer's environment: user_environment (no OpenBLAS overrides) without the
    LD_LIBRARY_PATH entries that hold a BLAS, so numpy loads the OpenBLAS it ships with."""
    environment = user_environment(threads)
    kept = [d for d in environment.get("LD_LIBRARY_PATH", "").split(":")
            if d and not holds_blas(d)]
    if kept:
        environment["LD_LIBRARY_PATH"] = ":".join(kept)
    else:
        environment.pop("LD_LIBRARY_PATH", None)
    return environment


def torch_environment(threads: int, openblas_coretype: str | None = None) -> dict[str, str] | None:
    """The PyTorch peer's environment: user_environment (thread counts; OPENBLAS_CORETYPE
    only if ``openblas_coretype`` is given) with the OpenMP build of OpenBLAS first on
    LD_LIBRARY_PATH (Debian's torch calls whatever libblas.so.3 the alternatives select; the
    OpenMP OpenBLAS is its fastest). None, after printing why, when that build is missing."""
    if not Path(OPENBLAS_OPENMP_DIR).is_dir():
        print(f"error: {OPENBLAS_OPENMP_DIR} missing (apt-get install libopenblas0-openmp)",
              file=sys.stderr)
        return None
    environment = user_environment(threads, openblas_coretype)
    library_path = environment.get("LD_LIBRARY_PATH")
    environment["LD_LIBRARY_PATH"] = OPENBLAS_OPENMP_DIR + (f":{library_path}" if library_path
                                                            else "")
    return environment


def describe_tuning(environment: dict[str, str]) -> str:
    """OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as an environment sets them."""
    return ", ".join(f"{v}={environment[v]}" if v in environment else f"{v} unset"
                     for v in OPENBLAS_TUNING_VARIABLES)


# ---------------------------------------------------------------------------------------------
# Kernels.

def print_ours_environment(environment: dict[str, str], user_note: str,
                           program: object = None) -> None:
    """Prints what was removed from the inherited environment and the one our side runs in."""
    removed = removed_tuning_variables()
    if removed:
        print(f"removed from the inherited environment for both sides: "
              f"{', '.join(f'{k}={v}' for k, v in removed.items())}")
    coretype = environment.get("OPENBLAS_CORETYPE")
    print(f"ours : {f'{program}; ' if program else ''}{describe_tuning(environment)}"
          + (f"  <-- set by --openblas-coretype {coretype} (experiment: users do not set it)"
             if coretype else f" ({user_note})")
          + f"; LD_LIBRARY_PATH={environment.get('LD_LIBRARY_PATH', '(unset)')}")


def cpu_flags() -> set[str]:
    """The first CPU's flags from /proc/cpuinfo (empty when unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# OPENBLAS_CORETYPE family -> the /proc/cpuinfo flags it needs, best first.
OPENBLAS_FAMILY_FLAGS = (
    ("SkylakeX", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("Haswell", ("avx2", "fma")),
)


def openblas_family_for_cpu(flags: set[str]) -> str | None:
    """The OPENBLAS_CORETYPE family this CPU's flags call for: SkylakeX with AVX-512
    F/BW/VL/DQ, Haswell with AVX2 and FMA, else None (leave OpenBLAS to choose)."""
    for family, needed in OPENBLAS_FAMILY_FLAGS:
        if set(needed) <= flags:
            return family
    return None


def generic_kernel(kernel: str | None, flags: set[str]) -> str | None:
    """Why ``kernel`` (an OpenBLAS corename) is a fallback and not the CPU's best, or None
    when it is not (or is unknown)."""
    if not kernel:
        return None
    name = kernel.strip().lower()
    if name in GENERIC_KERNELS:
        return f"{kernel} is a generic fallback kernel"
    if name in PRE_AVX2_KERNELS and {"avx2", "fma"} <= flags:
        return f"{kernel} kernels do not use this CPU's AVX2/FMA"
    return None


def mapped_openblas_info() -> dict:
    """Which libopenblas this process mapped and what it reports about itself (through
    ctypes: openblas_get_corename, _config, _parallel, _num_threads). Call it in the process
    to describe, after its BLAS is loaded."""
    info: dict = {"openblas_library": None}
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            slash = line.find("/")
            if slash >= 0 and "libopenblas" in line[slash:]:
                info["openblas_library"] = line[slash:].strip()
                break
    if info["openblas_library"] is None:
        return info
    library = ctypes.CDLL(info["openblas_library"])
    for name, restype in (("openblas_get_corename", ctypes.c_char_p),
                          ("openblas_get_config", ctypes.c_char_p),
                          ("openblas_get_parallel", ctypes.c_int),
                          ("openblas_get_num_threads", ctypes.c_int)):
        function = getattr(library, name, None)
        if function is None:
            continue
        function.restype = restype
        value = function()
        info[name.replace("_get", "")] = value.decode() if isinstance(value, bytes) else value
    parallel = info.get("openblas_parallel")
    if isinstance(parallel, int):
        info["openblas_parallel"] = {0: "sequential", 1: "pthreads", 2: "openmp"}.get(
            parallel, str(parallel))
    return info


def print_warning(lines: list[str]) -> None:
    """A warning that cannot be missed in a report: framed, on stdout with the report."""
    bar = "!" * 92
    print(bar)
    for line in lines:
        print(f"!! {line}")
    print(bar)


# ---------------------------------------------------------------------------------------------
# Output.

def progress(text: str) -> None:
    """A one-line status on a terminal's stderr (nothing when stderr is not a terminal)."""
    if sys.stderr.isatty():
        print(f"\r{text:<70}", end="" if text else "\r", file=sys.stderr, flush=True)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    numeric = [all(is_number(row[i]) for row in rows) if rows else False
               for i in range(len(headers))]

    def line(cells):
        return "  ".join(str(cell).rjust(width) if numeric[i] else str(cell).ljust(width)
                         for i, (cell, width) in enumerate(zip(cells, widths))).rstrip()

    print(line(headers))
    print("  ".join("-" * width for width in widths))
    for row in rows:
        print(line(row))


def is_number(text: str) -> bool:
    try:
        float(str(text).replace(",", "").rstrip("x%"))
        return True
    except ValueError:
        return str(text) in ("-", "")
