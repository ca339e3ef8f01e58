#!/usr/bin/env python3
"""Runs the kernel benchmarks (bench/riftco_bench_kernels) beside numpy in one invocation.

GEMM: float32 (M,N,K) shapes, ours (tensor_ops::matmul) against numpy.matmul, each side at
its best with the same thread count. Ours runs as a user runs it: OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE removed from the environment (OpenBLAS autodetects), unless
--openblas-coretype sets one for an experiment. numpy is the PyPI wheel (its own current
OpenBLAS) in a virtual environment, by default ~/.cache/riftco-transformer/numpy-venv
(created with `python3 -m venv` and `pip install numpy threadpoolctl` when absent; --python
picks another interpreter), with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed and no BLAS
directory on LD_LIBRARY_PATH. The script prints the kernel each side ran (ours: the
benchmark's riftco_* and openblas_* context; numpy: threadpoolctl.threadpool_info()) and
warns when numpy's is a generic fallback, because then the peer is not at its best. The two
sides are sampled alternately, shape by shape and round by round, so that load from other
processes falls on both; the figure per side is the median over the rounds, and PASS means
ours >= 0.9 x numpy.

Memory-bound kernels: GB/s (bytes read + written once per call) from one run of the
benchmark with --benchmark_repetitions (median aggregate), and as a fraction of
BM_MemoryCopy (std::memcpy of 64 MiB) from that same run. numpy equivalents of some of them
(single-threaded, with numpy's temporaries) are a second reference, not a target.

This is a report, not a test: the exit status is 0 unless something failed to run.

    python3 tools/bench_kernels_vs_numpy.py --build-dir build/release --threads 2

Only the standard library is used in this process (any python3 runs it); numpy and
threadpoolctl are imported in a worker subprocess (this file with --numpy-worker) under the
numpy side's interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# tools/ is on sys.path when a script here runs
from bench_report import (THREAD_VARIABLES, cpu_flags, describe_tuning, generic_kernel,
                          mapped_openblas_info, numpy_environment, print_table, print_warning,
                          print_ours_environment, progress, removed_tuning_variables,
                          user_environment)

BENCHMARK_RELATIVE_PATH = Path("bench") / "riftco_bench_kernels"
GEMM_SHAPES = [(1024, 1024, 1024), (512, 768, 3072), (512, 3072, 768), (2048, 2048, 2048)]
GEMM_TARGET_RATIO = 0.9
SLOW_FRACTION_OF_MEMCPY = 0.2
MEMCPY_REFERENCE = "BM_MemoryCopy"
FLOAT_BYTES = 4
EIGHT_MEBI = 8 << 20
DEFAULT_NUMPY_VENV = Path.home() / ".cache" / "riftco-transformer" / "numpy-venv"
NUMPY_VENV_PACKAGES = ("numpy", "threadpoolctl")

# Benchmark base name (without "/real_time") -> (kernel, shape) for the table; the bytes per
# call are those counted in bench_kernels.cpp.
KERNEL_LABELS = {
    "BM_MemoryCopy": ("memcpy (reference)", "64 MiB"),
    "BM_MemoryCopyThreaded": ("memcpy, split over threads", "64 MiB"),
    "BM_TensorCopy": ("Tensor::to_host", "[8M]"),
    "BM_TensorCopyIntoBuffer": ("Tensor::copy_to_host", "[8M]"),
    "BM_Add": ("add", "[8M] + [8M]"),
    "BM_SumAxis/axis:0": ("sum over axis 0", "[4096,768]"),
    "BM_SumAxis/axis:1": ("sum over axis 1", "[4096,768]"),
    "BM_Softmax": ("softmax (last axis)", "[4096,1024]"),
    "BM_CausalSoftmax": ("causal_softmax", "[4,8,256,256]"),
    "BM_LayerNorm": ("layer_norm", "[4096,768]"),
    "BM_LayerNormBackward": ("layer_norm_backward", "[4096,768]"),
    "BM_Gelu": ("gelu (erf)", "[8M]"),
    "BM_GeluBackward": ("gelu_backward", "[8M]"),
    "BM_CrossEntropy": ("cross_entropy", "[2048,8192]"),
}

# numpy references: benchmark base name -> bytes per call (same counting as ours).
NUMPY_REFERENCE_BYTES = {
    "BM_MemoryCopy": 2 * (64 << 20),
    "BM_Add": 3 * EIGHT_MEBI * FLOAT_BYTES,
    "BM_SumAxis/axis:0": (4096 * 768 + 768) * FLOAT_BYTES,
    "BM_SumAxis/axis:1": (4096 * 768 + 4096) * FLOAT_BYTES,
    "BM_Softmax": 2 * 4096 * 1024 * FLOAT_BYTES,
    "BM_LayerNorm": (2 * 4096 * 768 + 2 * 768 + 2 * 4096) * FLOAT_BYTES,
    "BM_CrossEntropy": 2 * 2048 * 8192 * FLOAT_BYTES + 2048 * 4 + FLOAT_BYTES,
}


# ---------------------------------------------------------------------------------------------
# numpy worker: runs in a subprocess (this file with --numpy-worker), one JSON request per
# stdin line, one JSON reply per stdout line.

def _numpy_worker() -> int:
    import numpy as np

    rng = np.random.default_rng(0)
    cache: dict[Any, Any] = {}

    def uniform(shape, low=-1.0, high=1.0):
        return rng.uniform(low, high, size=shape).astype(np.float32)

    def gemm_call(m, n, k, preallocated):
        key = ("gemm", m, n, k, preallocated)
        if key not in cache:
            a, b = uniform((m, k)), uniform((k, n))
            if preallocated:
                out = np.empty((m, n), dtype=np.float32)
                cache[key] = lambda: np.matmul(a, b, out=out)
            else:
                cache[key] = lambda: np.matmul(a, b)
            cache[key]()  # warm-up: thread pool start, first touch
        return cache[key]

    def softmax(x):
        shifted = x - x.max(axis=-1, keepdims=True)
        np.exp(shifted, out=shifted)
        shifted /= shifted.sum(axis=-1, keepdims=True)
        return shifted

    def memory_call(kernel):
        if kernel in cache:
            return cache[kernel]
        if kernel == "BM_MemoryCopy":
            source = np.ones(64 << 20, dtype=np.uint8)
            destination = np.zeros_like(source)
            call = lambda: np.copyto(destination, source)
        elif kernel == "BM_Add":
            left, right = uniform(EIGHT_MEBI), uniform(EIGHT_MEBI)
            call = lambda: np.add(left, right)
        elif kernel.startswith("BM_SumAxis/axis:"):
            axis = int(kernel.rsplit(":", 1)[1])
            x = uniform((4096, 768))
            call = lambda: x.sum(axis=axis)
        elif kernel == "BM_Softmax":
            x = uniform((4096, 1024), -4.0, 4.0)
            call = lambda: softmax(x)
        elif kernel == "BM_LayerNorm":
            x = uniform((4096, 768))
            scale, bias = uniform(768, 0.5, 1.5), uniform(768)

            def call():
                mean = x.mean(axis=-1, keepdims=True)
                centred = x - mean
                inverse_deviation = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True)
                                                  + np.float32(1e-5))
                return centred * inverse_deviation * scale + bias, mean, inverse_deviation
        elif kernel == "BM_CrossEntropy":
            logits = uniform((2048, 8192), -4.0, 4.0)
            targets = rng.integers(0, 8192, size=2048)
            rows = np.arange(2048)

            def call():
                row_max = logits.max(axis=-1, keepdims=True)
                gradient = np.exp(logits - row_max)
                total = gradient.sum(axis=-1, keepdims=True, dtype=np.float64)
                loss = np.mean(np.log(total[:, 0]) + row_max[:, 0] - logits[rows, targets])
                gradient *= (1.0 / total / 2048).astype(np.float32)
                gradient[rows, targets] -= np.float32(1.0 / 2048)
                return loss, gradient
        else:
            raise ValueError(f"no numpy reference for {kernel}")
        call()  # warm-up
        cache[kernel] = call
        return call

    def time_calls(call, min_time):
        calls = 0
        start = time.perf_counter()
        while True:
            call()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                return {"seconds_per_call": elapsed / calls, "calls": calls}

    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "info":
                reply = {"numpy": np.__version__, "python": sys.version.split()[0],
                         "executable": sys.executable, **mapped_openblas_info()}
                try:
                    from threadpoolctl import threadpool_info
                    reply["threadpool_info"] = threadpool_info()
                except ImportError as error:
                    reply["threadpool_info"] = None
                    reply["threadpoolctl_error"] = str(error)
            elif request["op"] == "gemm":
                call = gemm_call(request["m"], request["n"], request["k"],
                                 request["preallocated"])
                reply = time_calls(call, request["min_time"])
            elif request["op"] == "memory":
                reply = time_calls(memory_call(request["kernel"]), request["min_time"])
            else:
                raise ValueError(f"unknown request {request['op']!r}")
        except Exception as error:  # reported to the parent, which stops
            reply = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)
    return 0


class NumpyWorker:
    def __init__(self, python: str, environment: dict[str, str]):
        self.process = subprocess.Popen(
            [python, os.path.abspath(__file__), "--numpy-worker"], env=environment,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"numpy worker exited (status {self.process.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"numpy worker: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# Our benchmark program.

def run_benchmark(binary: Path, environment: dict[str, str], benchmark_filter: str,
                  min_time: float, repetitions: int) -> dict[str, Any]:
    command = [str(binary), f"--benchmark_filter={benchmark_filter}",
               f"--benchmark_min_time={min_time}", f"--benchmark_repetitions={repetitions}",
               "--benchmark_format=json"]
    completed = subprocess.run(command, env=environment, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {completed.returncode}:\n"
                           f"{completed.stderr.strip()}")
    result = json.loads(completed.stdout)
    if not result.get("benchmarks"):
        raise RuntimeError(f"{' '.join(command)} ran no benchmark")
    for entry in result["benchmarks"]:
        if entry.get("error_occurred"):
            raise RuntimeError(f"{entry['name']}: {entry.get('error_message')}")
    return result


def median_entries(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """run_name -> the median aggregate, or the only iteration entry when not repeated."""
    medians: dict[str, dict[str, Any]] = {}
    iterations: dict[str, list[dict[str, Any]]] = {}
    for entry in result["benchmarks"]:
        name = entry.get("run_name", entry["name"])
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_name") == "median":
                medians[name] = entry
        else:
            iterations.setdefault(name, []).append(entry)
    for name, entries in iterations.items():
        medians.setdefault(name, entries[len(entries) // 2])
    return medians


def base_name(run_name: str) -> str:
    return run_name.removesuffix("/real_time")


# ---------------------------------------------------------------------------------------------
# The numpy side's interpreter.

def numpy_venv_python(venv: Path) -> str | None:
    """The interpreter of the numpy virtual environment ``venv``, created (python3 -m venv,
    pip install numpy threadpoolctl) when absent or missing a package. None, after printing
    why, when that fails."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import " + ", ".join(NUMPY_VENV_PACKAGES)]
    if python.is_file() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    commands = []
    if not python.is_file():
        commands.append([sys.executable, "-m", "venv", str(venv)])
    commands.append([str(python), "-m", "pip", "install", "--quiet", *NUMPY_VENV_PACKAGES])
    for command in commands:
        print(f"numpy side: {' '.join(command)}", flush=True)
        if subprocess.run(command).returncode != 0:
            print(f"error: `{' '.join(command)}` failed; pass --python with an interpreter "
                  f"that has numpy (and threadpoolctl)", file=sys.stderr)
            return None
    if subprocess.run(check).returncode != 0:
        print(f"error: {python} still cannot import {', '.join(NUMPY_VENV_PACKAGES)}",
              file=sys.stderr)
        return None
    return str(python)


# ---------------------------------------------------------------------------------------------
# Report.

def numpy_blas_entries(info: dict[str, Any]) -> list[dict[str, Any]]:
    """numpy's BLAS as threadpoolctl reports it, or one entry built from the mapped
    libopenblas (interpreters without threadpoolctl)."""
    entries = [e for e in info.get("threadpool_info") or [] if e.get("user_api") == "blas"]
    if entries or not info.get("openblas_library"):
        return entries
    return [{"internal_api": "openblas (ctypes; no threadpoolctl)",
             "version": info.get("openblas_config"), "architecture": info.get("openblas_corename"),
             "threading_layer": info.get("openblas_parallel"),
             "num_threads": info.get("openblas_num_threads"),
             "filepath": info.get("openblas_library")}]


def entry_kernel(entry: dict[str, Any]) -> str | None:
    return entry.get("architecture") or entry.get("corename")


def print_kernels(ours_context: dict[str, Any], ours_environment: dict[str, str],
                  numpy_info: dict[str, Any], peer_environment: dict[str, str],
                  python: str, flags: set[str]) -> list[str]:
    """Prints each side's environment and kernel; returns the warnings printed."""
    warnings = []
    print_ours_environment(ours_environment, "as a user runs it: nothing set")
    coretype = ours_environment.get("OPENBLAS_CORETYPE")
    riftco = {k: v for k, v in ours_context.items() if k.startswith("riftco_")}
    print("  kernel: " + ("  ".join(f"{k}={v}" for k, v in sorted(riftco.items()))
                          if riftco else "(no riftco_* context keys)"))
    openblas = {k: v for k, v in ours_context.items()
                if k.startswith("openblas_") or k == "OPENBLAS_CORETYPE"}
    if openblas:
        print("  OpenBLAS context: " + "  ".join(f"{k}={v}" for k, v in openblas.items()))
    ours_kernel = ours_context.get("openblas_corename")
    if reason := generic_kernel(ours_kernel, flags):
        print(f"  note: our OpenBLAS runs {ours_kernel} ({reason}): "
              + ("--openblas-coretype asked for it" if coretype
                 else "that is what a user gets, and the ratios below show it"))

    print(f"numpy: numpy {numpy_info.get('numpy')}, python {numpy_info.get('python')} "
          f"({python}); {describe_tuning(peer_environment)}; "
          f"LD_LIBRARY_PATH={peer_environment.get('LD_LIBRARY_PATH', '(unset)')}")
    entries = numpy_blas_entries(numpy_info)
    if not entries:
        print("  kernel: unknown (no threadpoolctl in that interpreter and no libopenblas "
              f"mapped{': ' + numpy_info['threadpoolctl_error'] if numpy_info.get('threadpoolctl_error') else ''})")
        warnings.append("numpy's BLAS kernel is unknown: the peer may not be at its best")
    for entry in entries:
        print("  kernel: " + "  ".join(
            f"{key}={entry.get(key)}" for key in ("internal_api", "version", "architecture",
                                                  "corename", "threading_layer", "num_threads",
                                                  "filepath")
            if key in entry or key == "architecture"))
        kernel = entry_kernel(entry)
        if reason := generic_kernel(kernel, flags):
            warnings.append(f"numpy's BLAS runs {kernel} kernels: {reason}, so the numpy peer "
                            f"is NOT at its best and every ratio below flatters ours")
        if entry.get("num_threads") not in (None, int(ours_environment["OPENBLAS_NUM_THREADS"])):
            warnings.append(f"numpy's BLAS uses {entry.get('num_threads')} threads, ours "
                            f"{ours_environment['OPENBLAS_NUM_THREADS']}")
    others = [e for e in numpy_info.get("threadpool_info") or [] if e.get("user_api") != "blas"]
    for entry in others:
        print(f"  also loaded: {entry.get('user_api')} {entry.get('internal_api')} "
              f"{entry.get('version')} num_threads={entry.get('num_threads')} "
              f"{entry.get('filepath')}")
    if warnings:
        print_warning(["WARNING: " + w for w in warnings])
    return warnings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + (
        " Each side runs at its best with the same thread count: ours as a user runs it "
        "(OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset), numpy from the PyPI wheel in a "
        "virtual environment (neither set, no BLAS directory on LD_LIBRARY_PATH). Prints "
        "the BLAS kernel each side ran and warns when numpy's is a generic fallback."))
    parser.add_argument("--build-dir", default="build/release", type=Path,
                        help="CMake build directory holding bench/riftco_bench_kernels")
    parser.add_argument("--threads", default=2, type=int,
                        help="threads for both sides (RIFTCO_TRANSFORMER_NUM_THREADS, "
                             "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS)")
    parser.add_argument("--repetitions", default=5, type=int,
                        help="GEMM rounds (alternating the two sides) and memory-bound "
                             "--benchmark_repetitions / numpy samples; medians are reported")
    parser.add_argument("--min-time", default=0.5, type=float,
                        help="seconds per sample on each side (--benchmark_min_time)")
    parser.add_argument("--openblas-coretype", default=None, metavar="NAME",
                        help="experiment: OPENBLAS_CORETYPE for our side only (default: unset, "
                             "as a user runs it; the numpy side never gets one)")
    parser.add_argument("--numpy-preallocated-out", action="store_true",
                        help="numpy GEMM writes into a preallocated out= (default: allocates "
                             "its result each call, as tensor_ops::matmul does)")
    parser.add_argument("--skip-gemm", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--python", default=None,
                        help="interpreter for the numpy side (default: the PyPI numpy wheel "
                             "in ~/.cache/riftco-transformer/numpy-venv, created with python3 -m venv and "
                             "pip install numpy threadpoolctl when absent)")
    parser.add_argument("--json-out", type=Path, help="also write every figure to this file")
    parser.add_argument("--numpy-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.numpy_worker:
        return _numpy_worker()
    if args.threads < 1 or args.repetitions < 1 or args.min_time <= 0:
        parser.error("--threads and --repetitions must be >= 1, --min-time > 0")

    binary = args.build_dir / BENCHMARK_RELATIVE_PATH
    if not binary.is_file():
        print(f"error: {binary} not found; build it first, e.g.\n"
              f"  cmake -S . -B {args.build_dir} -G Ninja -DCMAKE_BUILD_TYPE=Release\n"
              f"  cmake --build {args.build_dir} --target riftco_bench_kernels", file=sys.stderr)
        return 2
    # Each side at its best: ours as a user runs it, numpy on the wheel's own OpenBLAS; only
    # the thread counts are shared.
    environment = user_environment(args.threads, args.openblas_coretype)
    peer_environment = numpy_environment(args.threads)
    python = args.python or numpy_venv_python(DEFAULT_NUMPY_VENV)
    if python is None:
        return 2
    flags = cpu_flags()

    report: dict[str, Any] = {
        "settings": {"threads": args.threads, "repetitions": args.repetitions,
                     "min_time_s": args.min_time, "binary": str(binary),
                     "numpy_python": python,
                     "removed_from_environment": removed_tuning_variables(),
                     "ours_OPENBLAS_CORETYPE": environment.get("OPENBLAS_CORETYPE"),
                     "ours_LD_LIBRARY_PATH": environment.get("LD_LIBRARY_PATH"),
                     "numpy_LD_LIBRARY_PATH": peer_environment.get("LD_LIBRARY_PATH"),
                     "numpy_preallocated_out": args.numpy_preallocated_out},
        "load_average_start": os.getloadavg(),
    }

    try:
        worker = NumpyWorker(python, peer_environment)
    except OSError as error:
        print(f"error: cannot start {python}: {error}", file=sys.stderr)
        return 2
    try:
        numpy_info = worker.ask(op="info")
        # A cheap run of ours just for its context (which GEMM and OpenBLAS it loaded).
        ours_context = run_benchmark(binary, environment, "^BM_MemoryCopy/", 0.01, 1)["context"]
        report["numpy_info"] = numpy_info
        report["ours_context"] = ours_context

        print(f"threads: {args.threads} on both sides ({', '.join(THREAD_VARIABLES)})")
        report["warnings"] = print_kernels(ours_context, environment, numpy_info,
                                           peer_environment, python, flags)
        if ours_context.get("library_build_type") == "debug":
            print("note: Google Benchmark itself reports a debug build (Debian's package); "
                  "this does not affect the code being timed")
        print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} "
              f"(other processes on these cores make absolute figures noisy)")
        print(flush=True)

        if not args.skip_gemm:
            report["gemm"] = run_gemm(args, binary, environment, worker)
        if not args.skip_memory:
            report["memory"] = run_memory(args, binary, environment, worker)
    except (RuntimeError, OSError, json.JSONDecodeError, subprocess.SubprocessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        try:
            worker.close()
        except (OSError, subprocess.SubprocessError):
            worker.process.kill()

    report["load_average_end"] = os.getloadavg()
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in report['load_average_end'])}")
    if report.get("warnings"):
        print_warning(["WARNING (repeated from the top): " + w for w in report["warnings"]])
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json_out}")
    return 0


def run_gemm(args, binary: Path, environment: dict[str, str],
             worker: NumpyWorker) -> list[dict[str, Any]]:
    """Alternates one sample of each side per shape and round; medians over the rounds."""
    samples = {shape: {"ours": [], "numpy": []} for shape in GEMM_SHAPES}
    for round_index in range(args.repetitions):
        for shape_index, (m, n, k) in enumerate(GEMM_SHAPES):
            progress(f"GEMM round {round_index + 1}/{args.repetitions}, ({m},{n},{k})")
            giga_flops_per_call = 2.0 * m * n * k * 1e-9

            def sample_numpy():
                reply = worker.ask(op="gemm", m=m, n=n, k=k, min_time=args.min_time,
                                   preallocated=args.numpy_preallocated_out)
                samples[(m, n, k)]["numpy"].append(
                    giga_flops_per_call / reply["seconds_per_call"])

            def sample_ours():
                result = run_benchmark(binary, environment,
                                       f"^BM_Matmul/{m}/{n}/{k}/real_time$", args.min_time, 1)
                samples[(m, n, k)]["ours"].append(result["benchmarks"][0]["GFLOP/s"])

            # Alternate which side goes first so neither always follows the other.
            order = (sample_numpy, sample_ours) if (round_index + shape_index) % 2 == 0 else (
                sample_ours, sample_numpy)
            for sample in order:
                sample()
    progress("")

    rows, summary = [], []
    for (m, n, k), sides in samples.items():
        ours, theirs = statistics.median(sides["ours"]), statistics.median(sides["numpy"])
        ratio = ours / theirs
        verdict = "PASS" if ratio >= GEMM_TARGET_RATIO else "FAIL"
        rows.append([f"({m},{n},{k})", f"{ours:.1f}", f"{theirs:.1f}", f"{ratio:.3f}",
                     f"{min(sides['ours']):.0f}-{max(sides['ours']):.0f}",
                     f"{min(sides['numpy']):.0f}-{max(sides['numpy']):.0f}", verdict])
        summary.append({"m": m, "n": n, "k": k, "ours_gflops": ours, "numpy_gflops": theirs,
                        "ratio": ratio, "pass": ratio >= GEMM_TARGET_RATIO,
                        "ours_samples": sides["ours"], "numpy_samples": sides["numpy"]})
    print(f"float32 GEMM, {args.threads} threads, GFLOP/s = 2*M*N*K / time, median of "
          f"{args.repetitions} alternating samples per side (target: ours >= "
          f"{GEMM_TARGET_RATIO} x numpy)")
    print_table(["(M,N,K)", "ours", "numpy", "ratio", "ours range", "numpy range", "vs 0.9"],
                rows)
    print(flush=True)
    return summary


def run_memory(args, binary: Path, environment: dict[str, str],
               worker: NumpyWorker) -> list[dict[str, Any]]:
    progress("memory-bound kernels: our benchmark run")
    result = run_benchmark(binary, environment, "-BM_Matmul", args.min_time, args.repetitions)
    medians = median_entries(result)
    reference_name = f"{MEMCPY_REFERENCE}/real_time"
    if reference_name not in medians:
        raise RuntimeError(f"{reference_name} missing from the benchmark output")
    memcpy_gbs = medians[reference_name]["bytes_per_second"] * 1e-9

    numpy_gbs: dict[str, float] = {}
    for kernel, bytes_per_call in NUMPY_REFERENCE_BYTES.items():
        progress(f"memory-bound kernels: numpy {kernel}")
        figures = [bytes_per_call * 1e-9 / worker.ask(op="memory", kernel=kernel,
                                                      min_time=args.min_time)["seconds_per_call"]
                   for _ in range(args.repetitions)]
        numpy_gbs[kernel] = statistics.median(figures)
    progress("")

    rows, summary = [], []
    for run_name, entry in medians.items():
        name = base_name(run_name)
        kernel, shape = KERNEL_LABELS.get(name, (name, "?"))
        gbs = entry["bytes_per_second"] * 1e-9
        fraction = gbs / memcpy_gbs
        reference = numpy_gbs.get(name)
        slow = fraction < SLOW_FRACTION_OF_MEMCPY
        rows.append([kernel + (" *" if slow else ""), shape, f"{entry['real_time']:.3f}",
                     f"{gbs:.1f}", f"{fraction:.2f}",
                     f"{reference:.1f}" if reference else "-",
                     f"{gbs / reference:.2f}" if reference else "-"])
        summary.append({"benchmark": run_name, "kernel": kernel, "shape": shape,
                        "real_time_ms": entry["real_time"], "gb_per_s": gbs,
                        "fraction_of_memcpy": fraction, "numpy_gb_per_s": reference})
    print(f"memory-bound kernels, {args.threads} threads, GB/s = bytes read + written once / "
          f"time (1 GB = 1e9 B), median of {args.repetitions} repetitions; memcpy = "
          f"{memcpy_gbs:.1f} GB/s in this run")
    print_table(["kernel", "shape", "ms/call", "GB/s", "x memcpy", "numpy GB/s", "x numpy"], rows)
    print(f"numpy references run on 1 thread with numpy's own temporaries: a second reference,"
          f" not a target. * = below {SLOW_FRACTION_OF_MEMCPY:.0%} of memcpy.")
    print(flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(main())
