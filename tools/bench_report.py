"""Helpers shared by the benchmark scripts in tools/: the environment both sides of a
comparison run in, a status line, aligned tables."""
import os
import sys
from pathlib import Path

OPENBLAS_OPENMP_DIR = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
THREAD_VARIABLES = ("RIFTCO_TRANSFORMER_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_environment(threads: int) -> dict[str, str]:
    """This process's environment with every thread-count variable set to ``threads``."""
    environment = dict(os.environ)
    for variable in THREAD_VARIABLES:
        environment[variable] = str(threads)
    return environment


def peer_environment(threads: int, openblas_coretype: str | None) -> dict[str, str] | None:
    """One environment for ours and a peer (numpy, PyTorch): thread counts, the OpenMP build of
    OpenBLAS first on LD_LIBRARY_PATH, and OPENBLAS_CORETYPE (None keeps it, '' unsets it).
    None, after printing why, when the OpenMP OpenBLAS is not installed."""
    if not Path(OPENBLAS_OPENMP_DIR).is_dir():
        print(f"error: {OPENBLAS_OPENMP_DIR} missing (apt-get install libopenblas0-openmp)",
              file=sys.stderr)
        return None
    environment = thread_environment(threads)
    if openblas_coretype is not None:
        if openblas_coretype:
            environment["OPENBLAS_CORETYPE"] = openblas_coretype
        else:
            environment.pop("OPENBLAS_CORETYPE", None)
    library_path = environment.get("LD_LIBRARY_PATH")
    environment["LD_LIBRARY_PATH"] = OPENBLAS_OPENMP_DIR + (f":{library_path}" if library_path
                                                            else "")
    return environment


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
