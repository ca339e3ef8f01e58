#!/usr/bin/env python3
"""Times GPT training (riftco-train) beside eager PyTorch on the CPU in one invocation.

Workloads are those of the PyTorch yardstick (/work/shared/bench/torch_anchor.py): tiny and
small, GPT-2-style, fp32, batch B of T tokens, Adam with global clipping. Each (config,
attention) pair runs our program and the anchor alternately, --repetitions times each, with
the same thread count, so that load from other processes falls on both sides; the figures
are medians over the repetitions.

Each side runs at its best. Ours runs as a user runs it: OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE removed from the environment (--openblas-coretype sets one for ours only,
as an experiment). Torch (Debian's, calling whatever libblas.so.3 is found) gets the OpenMP
OpenBLAS first on LD_LIBRARY_PATH and neither variable; a probe in that environment (this
file with --torch-probe: imports torch, runs one torch.mm, asks the libopenblas mapped in
/proc/self/maps for openblas_get_corename through ctypes) reports the kernel torch's process
uses. If that is a generic fallback (an OpenBLAS that does not know the CPU picks Prescott),
the torch side alone gets OPENBLAS_CORETYPE for the CPU's family from /proc/cpuinfo
(SkylakeX with AVX-512 F/BW/VL/DQ, Haswell with AVX2+FMA), is probed again, and the output
says so (--torch-openblas-coretype overrides the choice). The script prints the kernel each
side ran: torch's from the probe and the anchor's mapped BLAS, ours from the BLAS libraries
mapped into riftco-train and any line of its output that mentions gemm, kernel or BLAS.
Attention: ours `flash` against torch `sdpa` (fused scaled_dot_product_attention), ours
`materialized` against torch `materialized` (explicit T x T scores and softmax).

Throughput, ours: riftco-train prints cumulative tokens/s (tokens since the first step over
the seconds since the first step) at step 1, every 25th step and the last step. The
seconds at a line are step*B*T / rate; the figure is (tokens between the last line at or
before half of --steps-<config> and the final line) / (seconds between them), so step 1 and
the first quarter-to-half of the run are warm-up. Torch: B*T / median seconds per step
after the anchor's own warm-up steps.

Peak memory: ours, the child's maximum resident set size from wait4() (whole process:
tokenizer fit, training, the held-out evaluation and one sampled token); also its VmHWM read
while it is stopped (SIGSTOP) at its last training step line, i.e. the peak up to the end
of training. Torch: the anchor's own getrusage() peak (training only; includes ~230 MiB of
imported torch).

This is a report, not a test: the exit status is 0 unless something failed to run.

    /usr/bin/python3 tools/bench_train_vs_torch.py --build-dir build/release --threads 2

Only the standard library is used in this process; torch is imported only by the anchor
and by the probe, each in its own subprocess under --python.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

# tools/ is on sys.path when a script here runs
from bench_report import (OPENBLAS_FAMILY_FLAGS, THREAD_VARIABLES, cpu_flags,
                          describe_tuning, generic_kernel, mapped_openblas_info,
                          openblas_family_for_cpu, print_table, print_warning, progress,
                          print_ours_environment, removed_tuning_variables, torch_environment,
                          user_environment)

PROGRAM_RELATIVE_PATH = Path("examples") / "cpp" / "riftco-train"
DEFAULT_ANCHOR = "/work/shared/bench/torch_anchor.py"
SPEED_TARGET = 1.0   # ours tokens/s >= torch tokens/s
MEMORY_TARGET = 1.0  # ours peak RSS <= torch peak RSS
TAINTED_OTHERS_CPU_PCT = 10.0

# The anchor's workloads (CONFIGS in torch_anchor.py; its JSON echoes batch and seq, which
# are checked against these).
CONFIGS = {
    "tiny": dict(vocab=256, width=128, heads=4, blocks=4, feed_forward=512, context=128, batch=8),
    "small": dict(vocab=8192, width=512, heads=8, blocks=6, feed_forward=2048, context=256,
                  batch=4),
}
# Our attention kind -> the anchor's --mode.
MODES = {"flash": "sdpa", "materialized": "materialized"}
MODE_ALIASES = {"sdpa": "flash"}

STEP_LINE = re.compile(r"^step\s+(\d+)\s+loss\s+\S+.*?\s(\d+(?:\.\d+)?) tokens/s")
CORPUS_LINE = re.compile(r"vocabulary (\d+)")
# A line of riftco-train's output that names its GEMM / kernel / BLAS (printed if present).
KERNEL_LINE = re.compile(r"gemm|kernel|blas", re.IGNORECASE)
# Shared objects, in a process's maps, that are a BLAS or GEMM library.
BLAS_LIBRARY = re.compile(r"blas|blis|dnnl|mkl", re.IGNORECASE)
MODEL_LINE = re.compile(r"(\d+) parameters")


def expected_parameters(config: dict[str, int], vocabulary: int, tied: bool) -> int:
    """GPT-2 parameter count: embeddings, blocks (LN, QKV, proj, MLP), final LN, LM head."""
    d, f = config["width"], config["feed_forward"]
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
    total = vocabulary * d + config["context"] * d + config["blocks"] * block + 2 * d
    return total if tied else total + vocabulary * d + vocabulary


# ---------------------------------------------------------------------------------------------
# /proc helpers.

def machine_cpu() -> tuple[int, int]:
    """(all jiffies, idle + iowait jiffies) summed over every CPU."""
    with open("/proc/stat", encoding="utf-8") as stat:
        values = [int(x) for x in stat.readline().split()[1:9]]
    return sum(values), values[3] + values[4]


def process_cpu_ticks(pid: int) -> int:
    """utime + stime of a whole process (all its threads), in clock ticks."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def process_status_kib(pid: int, key: str) -> int | None:
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def mapped_blas_libraries(pid: int) -> list[str]:
    """The BLAS / GEMM shared objects (OpenBLAS, BLIS, oneDNN, MKL) mapped into a process."""
    paths: list[str] = []
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        for line in maps:
            slash = line.find("/")
            if slash >= 0:
                path = line[slash:].strip()
                if BLAS_LIBRARY.search(os.path.basename(path)) and path not in paths:
                    paths.append(path)
    return paths


def snapshot(pid: int) -> dict[str, Any]:
    total, idle = machine_cpu()
    return {"total": total, "idle": idle, "child_ticks": process_cpu_ticks(pid)}


def others_cpu_pct(first: dict[str, Any], last: dict[str, Any]) -> float:
    """Share of the whole machine used by processes other than the child in between (the
    anchor's others_cpu_pct, computed the same way)."""
    capacity = max(last["total"] - first["total"], 1)
    busy = capacity - (last["idle"] - first["idle"])
    own = last["child_ticks"] - first["child_ticks"]
    return round(100.0 * max(busy - own, 0) / capacity, 1)


# ---------------------------------------------------------------------------------------------
# Our program.

def run_ours(program: Path, config: dict[str, int], attention: str, steps: int,
             environment: dict[str, str], timeout: float) -> dict[str, Any]:
    batch, context = config["batch"], config["context"]
    command = [str(program), "--steps", str(steps), "--batch", str(batch),
               "--context", str(context), "--width", str(config["width"]),
               "--heads", str(config["heads"]), "--blocks", str(config["blocks"]),
               "--feed-forward", str(config["feed_forward"]), "--tokenizer", "bpe",
               "--vocabulary", str(config["vocab"]), "--attention", attention,
               "--sample-length", "1", "--activation-checkpointing", "disabled"]
    # A pseudo-terminal makes the program's stdout line-buffered, so each progress line
    # arrives when it is printed (the last one is where the training peak is read).
    master, slave = pty.openpty()
    with tempfile.TemporaryFile(mode="w+") as error_file:
        try:
            process = subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL,
                                       stdout=slave, stderr=error_file)
        finally:
            os.close(slave)
        pid = process.pid
        result: dict[str, Any] = {"command": command, "steps": steps, "lines": []}
        pending = b""
        deadline = time.monotonic() + timeout
        killed = False

        def handle(line: str) -> None:
            result["lines"].append(line)
            step_line = STEP_LINE.match(line)
            if KERNEL_LINE.search(line) and not step_line:
                result.setdefault("kernel_lines", []).append(line)
            if line.startswith("corpus:") and (match := CORPUS_LINE.search(line)):
                result["vocabulary"] = int(match.group(1))
            elif line.startswith("model:") and (match := MODEL_LINE.search(line)):
                result["params"] = int(match.group(1))
            elif match := step_line:
                step, rate = int(match.group(1)), float(match.group(2))
                stamp = {"step": step, "rate": rate, "monotonic": time.monotonic(),
                         "seconds": step * batch * context / rate if rate > 0 else None}
                if step == steps:
                    # Freeze the child at its last training step: peak so far, CPU used.
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        stamp["cpu"] = snapshot(pid)
                        result["train_peak_kib"] = process_status_kib(pid, "VmHWM")
                    finally:
                        os.kill(pid, signal.SIGCONT)
                else:
                    stamp["cpu"] = snapshot(pid)
                if step == 1:
                    result["blas_libraries"] = mapped_blas_libraries(pid)
                result.setdefault("progress", []).append(stamp)

        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    process.kill()
                    killed = True
                    break
                ready, _, _ = select.select([master], [], [], min(remaining, 1.0))
                if not ready:
                    continue
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal (it exited)
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    raw, pending = pending.split(b"\n", 1)
                    handle(raw.decode("utf-8", "replace").rstrip("\r"))
            if pending.strip():
                handle(pending.decode("utf-8", "replace").rstrip("\r"))
        except BaseException:
            process.kill()  # our own child; reaped just below
            raise
        finally:
            os.close(master)
            # wait4 gives this child's own rusage (RUSAGE_CHILDREN would be the maximum over
            # every child this script has waited for, torch's included).
            _, status, usage = os.wait4(pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
        error_file.seek(0)
        stderr = error_file.read()

    result["returncode"] = process.returncode
    result["peak_kib"] = usage.ru_maxrss
    if killed:
        raise RuntimeError(f"riftco-train ran past {timeout:.0f} s and was stopped")
    # 1 only says that the held-out loss did not beat the unigram baseline (short runs).
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}:\n"
                           f"{stderr.strip()[-2000:]}")
    progress_lines = result.get("progress", [])
    if not progress_lines or progress_lines[-1]["step"] != steps:
        raise RuntimeError(f"riftco-train printed no line for step {steps}:\n"
                           + "\n".join(result["lines"][-5:]))
    first = [p for p in progress_lines if p["step"] <= steps / 2][-1]
    last = progress_lines[-1]
    tokens = (last["step"] - first["step"]) * batch * context
    seconds = last["seconds"] - first["seconds"]
    wall = last["monotonic"] - first["monotonic"]
    result.update(
        window_steps=[first["step"] + 1, last["step"]],
        tokens_per_s=tokens / seconds,
        tokens_per_s_wall=tokens / wall if wall > 0 else None,
        step_s_mean=seconds / (last["step"] - first["step"]),
        others_cpu_pct=others_cpu_pct(first["cpu"], last["cpu"]),
        peak_mib=result["peak_kib"] / 1024.0,
        train_peak_mib=(result["train_peak_kib"] / 1024.0
                        if result.get("train_peak_kib") else None))
    del result["progress"]
    return result


# ---------------------------------------------------------------------------------------------
# The PyTorch anchor.

def run_torch(python: str, anchor: Path, config_name: str, mode: str, threads: int,
              environment: dict[str, str], timeout: float, steps: int | None,
              warmup: int | None) -> dict[str, Any]:
    command = [python, str(anchor), "--threads", str(threads), "--config", config_name,
               "--mode", mode, "--bench", "train"]
    if steps is not None:
        command += ["--steps", str(steps)]
    if warmup is not None:
        command += ["--warmup", str(warmup)]
    completed = subprocess.run(command, env=environment, capture_output=True, text=True,
                               timeout=timeout)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {completed.returncode}:\n"
                           f"{completed.stderr.strip()[-2000:]}")
    for line in completed.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("bench") == "train":
                record["command"] = command
                return record
    raise RuntimeError(f"{' '.join(command)} printed no train record:\n{completed.stdout}")


# ---------------------------------------------------------------------------------------------
# Kernels: which BLAS kernels each side's process runs.

def _torch_probe() -> int:
    """Runs under --python in the torch side's environment: loads torch and its BLAS the way
    the anchor does, and prints one JSON line about them."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.mm(torch.ones(256, 256), torch.ones(256, 256))
    print(json.dumps({"torch": torch.__version__, "python": sys.version.split()[0],
                      "blas_libraries": mapped_blas_libraries(os.getpid()),
                      **mapped_openblas_info()}), flush=True)
    return 0


def _openblas_probe(library: str) -> int:
    """Loads ``library`` (a libopenblas) here and prints one JSON line about it; run in a
    side's environment, it says which kernels OpenBLAS autodetects there."""
    import ctypes

    ctypes.CDLL(library)
    print(json.dumps(mapped_openblas_info()), flush=True)
    return 0


def run_probe(command: list[str], environment: dict[str, str]) -> dict[str, Any]:
    completed = subprocess.run(command, env=environment, capture_output=True, text=True,
                               timeout=300)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} exited with {completed.returncode}:\n"
                           f"{completed.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def probe_torch(python: str, environment: dict[str, str]) -> dict[str, Any]:
    probe = run_probe([python, os.path.abspath(__file__), "--torch-probe"], environment)
    probe["OPENBLAS_CORETYPE"] = environment.get("OPENBLAS_CORETYPE")
    return probe


def describe_openblas(info: dict[str, Any]) -> str:
    if not info.get("openblas_library"):
        return "no libopenblas mapped"
    return (f"corename={info.get('openblas_corename')}  parallel={info.get('openblas_parallel')}"
            f"  threads={info.get('openblas_num_threads')}  library={info['openblas_library']}"
            f"  config={info.get('openblas_config')}")


def settle_torch_kernel(python: str, environment: dict[str, str], requested: str | None,
                        flags: set[str]) -> dict[str, Any]:
    """Probes the kernel torch's process runs in ``environment``; when it is a generic
    fallback and ``requested`` is None (auto), sets OPENBLAS_CORETYPE in ``environment`` (the
    torch side's only) to the CPU's family and probes again. ``requested`` '' keeps the
    autodetected kernel; a name was already set by the caller (an experiment). Returns the
    probes, the notes and the warnings, all of which it prints."""
    probe = probe_torch(python, environment)
    settled: dict[str, Any] = {"probes": [probe], "notes": [], "warnings": [],
                               "coretype_set_by": None}
    kernel = probe.get("openblas_corename")
    reason = generic_kernel(kernel, flags)
    family = openblas_family_for_cpu(flags)
    if requested:
        settled["coretype_set_by"] = "--torch-openblas-coretype"
        settled["notes"].append(f"OPENBLAS_CORETYPE={requested} set for the torch side by "
                                "--torch-openblas-coretype (experiment)")
        if reason:
            settled["warnings"].append(f"torch's OpenBLAS runs {kernel} ({reason}), as "
                                       "--torch-openblas-coretype asked: the torch peer is NOT "
                                       "at its best and the ratios flatter ours")
    elif not probe.get("openblas_library"):
        settled["warnings"].append(
            "torch's process mapped no libopenblas (BLAS libraries: "
            f"{', '.join(probe.get('blas_libraries') or []) or 'none found'}); its GEMM may "
            "be the reference BLAS, so the torch peer may not be at its best")
    elif reason and requested == "":
        settled["warnings"].append(f"torch's OpenBLAS autodetected {kernel} ({reason}); kept "
                                   "by --torch-openblas-coretype '', so the torch peer is NOT "
                                   "at its best and the ratios flatter ours")
    elif reason and family is None:
        settled["warnings"].append(f"torch's OpenBLAS autodetected {kernel} ({reason}) and "
                                   "this CPU has neither AVX-512 nor AVX2+FMA to pick a "
                                   "family from; the torch peer may not be at its best")
    elif reason:
        environment["OPENBLAS_CORETYPE"] = family
        settled["coretype_set_by"] = "auto"
        fixed = probe_torch(python, environment)
        settled["probes"].append(fixed)
        needed = dict(OPENBLAS_FAMILY_FLAGS)[family]
        settled["notes"].append(
            f"torch's OpenBLAS autodetected {kernel} ({reason}); OPENBLAS_CORETYPE={family} "
            f"set for the torch side only (/proc/cpuinfo has {' '.join(needed)}); it now runs "
            f"{fixed.get('openblas_corename')}")
        if (still := generic_kernel(fixed.get("openblas_corename"), flags)) or \
                fixed.get("openblas_corename") is None:
            settled["warnings"].append(f"with OPENBLAS_CORETYPE={family} torch's OpenBLAS "
                                       f"still runs {fixed.get('openblas_corename')} "
                                       f"({still or 'unknown'}); the torch peer is NOT at its "
                                       "best")
    return settled


def probe_ours_openblas(libraries: list[str], environment: dict[str, str]) -> dict[str, Any] | None:
    """What the libopenblas ours mapped (if any) autodetects in ours' environment."""
    openblas = [path for path in libraries if "libopenblas" in os.path.basename(path)]
    if not openblas:
        return None
    return run_probe([sys.executable, os.path.abspath(__file__), "--openblas-probe",
                      openblas[0]], environment)


# ---------------------------------------------------------------------------------------------
# Report.


def load_text(values: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(config_name: str, attention: str, config: dict[str, int],
              ours: list[dict[str, Any]], torch: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"config": config_name, "attention": attention,
                               "torch_mode": MODES[attention], "ours_runs": ours,
                               "torch_runs": torch}
    if ours:
        summary.update(
            ours_tokens_per_s=statistics.median(r["tokens_per_s"] for r in ours),
            ours_peak_mib=statistics.median(r["peak_mib"] for r in ours),
            ours_train_peak_mib=median_or_none([r["train_peak_mib"] for r in ours]),
            ours_params=ours[0].get("params"), ours_vocabulary=ours[0].get("vocabulary"),
            ours_others_cpu_pct_max=max(r["others_cpu_pct"] for r in ours))
    if torch:
        summary.update(
            torch_tokens_per_s=statistics.median(r["tokens_per_s"] for r in torch),
            torch_peak_mib=statistics.median(r["rss_peak_mib"] for r in torch),
            torch_params=torch[0].get("params"), torch_vocabulary=config["vocab"],
            torch_others_cpu_pct_max=max(r["others_cpu_pct"] for r in torch))
    # The same medians over the runs no other process disturbed (others_cpu_pct <= 10).
    clean_ours = [r["tokens_per_s"] for r in ours
                  if r["others_cpu_pct"] <= TAINTED_OTHERS_CPU_PCT]
    clean_torch = [r["tokens_per_s"] for r in torch
                   if r["others_cpu_pct"] <= TAINTED_OTHERS_CPU_PCT]
    summary.update(ours_clean_runs=len(clean_ours), torch_clean_runs=len(clean_torch),
                   ours_tokens_per_s_clean=median_or_none(clean_ours),
                   torch_tokens_per_s_clean=median_or_none(clean_torch))
    if ours and torch:
        summary["speed_ratio"] = summary["ours_tokens_per_s"] / summary["torch_tokens_per_s"]
        summary["memory_ratio"] = summary["ours_peak_mib"] / summary["torch_peak_mib"]
        if summary["ours_train_peak_mib"] is not None:
            summary["memory_ratio_train"] = (summary["ours_train_peak_mib"]
                                             / summary["torch_peak_mib"])
    return summary


def print_report(args, summaries: list[dict[str, Any]]) -> None:
    def number(value, digits=0):
        return "-" if value is None else f"{value:,.{digits}f}"

    rows = []
    for s in summaries:
        speed, memory = s.get("speed_ratio"), s.get("memory_ratio")
        verdict = "-"
        if speed is not None and memory is not None:
            verdict = (f"speed {'PASS' if speed >= SPEED_TARGET else 'FAIL'}, "
                       f"memory {'PASS' if memory <= MEMORY_TARGET else 'FAIL'}")
            if max(s["ours_others_cpu_pct_max"], s["torch_others_cpu_pct_max"]) > \
                    TAINTED_OTHERS_CPU_PCT:
                verdict = "tainted: " + verdict
        rows.append([
            s["config"], f"{s['attention']}/{s['torch_mode']}",
            number(s.get("ours_tokens_per_s")), number(s.get("torch_tokens_per_s")),
            number(speed, 3), number(s.get("ours_peak_mib")),
            number(s.get("ours_train_peak_mib")), number(s.get("torch_peak_mib")),
            number(memory, 3), number(s.get("memory_ratio_train"), 3),
            number(s.get("ours_params")), number(s.get("torch_params")),
            f"{number(s.get('ours_vocabulary'))}/{number(s.get('torch_vocabulary'))}",
            f"{number(s.get('ours_others_cpu_pct_max'), 1)}/"
            f"{number(s.get('torch_others_cpu_pct_max'), 1)}",
            verdict])
    print(f"GPT training, {args.threads} threads, medians of {args.repetitions} alternating runs "
          f"per side (targets: tokens/s ratio >= {SPEED_TARGET}, peak RSS ratio <= "
          f"{MEMORY_TARGET})")
    print_table(["config", "attention ours/torch", "ours tok/s", "torch tok/s", "ratio",
                 "ours MiB", "ours MiB@train", "torch MiB", "ratio", "ratio@train", "ours params",
                 "torch params", "V ours/torch", "others% o/t", "targets"], rows)
    print(textwrap.fill(
        "tok/s: ours = mean over the steps after its warm-up window, torch = B*T / median "
        "step. MiB: peak RSS; ours = whole process (wait4), ours@train = VmHWM at its last "
        "training step, torch = the anchor's getrusage peak; ratio uses ours' whole-process "
        "figure, ratio@train its peak up to the end of training. Params: ours has an untied LM head with bias (+V*D+V), torch "
        "ties it to the token embedding. others% o/t: highest share of the machine used by "
        "other processes during a timed window of ours / torch (above "
        f"{TAINTED_OTHERS_CPU_PCT:.0f} taints the figure).", width=100))
    tainted = [s for s in summaries
               if max(s.get("ours_others_cpu_pct_max") or 0.0,
                      s.get("torch_others_cpu_pct_max") or 0.0) > TAINTED_OTHERS_CPU_PCT]
    if tainted:
        print(f"WARNING: other processes were busy during "
              f"{', '.join(s['config'] + '/' + s['attention'] for s in tainted)}; rerun on a "
              "quiet machine before drawing conclusions. Untainted runs only:")
        for s in tainted:
            ours, theirs = s["ours_tokens_per_s_clean"], s["torch_tokens_per_s_clean"]
            ratio = "-" if ours is None or theirs is None else f"{ours / theirs:.3f}"
            print(f"  {s['config']} {s['attention']}: ours {number(ours)} tokens/s "
                  f"({s['ours_clean_runs']} of {len(s['ours_runs'])} runs), torch "
                  f"{number(theirs)} ({s['torch_clean_runs']} of {len(s['torch_runs'])}), "
                  f"ratio {ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + (
        " Each side runs at its best with the same thread count: ours as a user runs it "
        "(OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset); torch on the OpenMP OpenBLAS, with "
        "OPENBLAS_CORETYPE set for the CPU's family only if a probe finds its autodetected "
        "kernel a generic fallback. Prints the kernel each side ran."))
    parser.add_argument("--build-dir", default="build/release", type=Path,
                        help="CMake build directory holding examples/cpp/riftco-train")
    parser.add_argument("--torch-anchor", default=DEFAULT_ANCHOR, type=Path,
                        help="the PyTorch yardstick script (torch_anchor.py)")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="interpreter with Debian's torch for the anchor")
    parser.add_argument("--configs", default="tiny,small",
                        help=f"comma list of {','.join(CONFIGS)}")
    parser.add_argument("--modes", default="flash,materialized",
                        help="comma list of our attention kinds: flash (torch sdpa), "
                             "materialized (torch materialized); 'sdpa' means flash")
    parser.add_argument("--steps-tiny", default=60, type=int,
                        help="riftco-train --steps for tiny (measured: after step 25)")
    parser.add_argument("--steps-small", default=14, type=int,
                        help="riftco-train --steps for small (measured: after step 1)")
    parser.add_argument("--torch-steps", default=None, type=int,
                        help="anchor --steps (default: its per-config default, tiny 20, small 5)")
    parser.add_argument("--torch-warmup", default=None, type=int,
                        help="anchor --warmup (default: its per-config default, tiny 3, small 1)")
    parser.add_argument("--repetitions", default=2, type=int,
                        help="runs per side, alternating ours and torch; medians are reported")
    parser.add_argument("--threads", default=2, type=int,
                        help="threads for both sides (RIFTCO_TRANSFORMER_NUM_THREADS, "
                             "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS)")
    parser.add_argument("--openblas-coretype", default=None, metavar="NAME",
                        help="experiment: OPENBLAS_CORETYPE for our side only (default: unset, "
                             "as a user runs it)")
    parser.add_argument("--torch-openblas-coretype", default=None, metavar="NAME",
                        help="OPENBLAS_CORETYPE for the torch side (default: unset, and set to "
                             "the CPU's family, SkylakeX or Haswell, only if the probe finds "
                             "the autodetected kernel a generic fallback; '' keeps whatever "
                             "OpenBLAS autodetects)")
    parser.add_argument("--timeout", default=1800.0, type=float,
                        help="seconds allowed per run of either side")
    parser.add_argument("--json-out", type=Path, help="also write every figure to this file")
    parser.add_argument("--torch-probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--openblas-probe", metavar="LIBRARY", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_probe:
        return _torch_probe()
    if args.openblas_probe:
        return _openblas_probe(args.openblas_probe)

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    modes = [MODE_ALIASES.get(m.strip(), m.strip()) for m in args.modes.split(",") if m.strip()]
    steps_for = {"tiny": args.steps_tiny, "small": args.steps_small}
    if not configs or any(c not in CONFIGS for c in configs):
        parser.error(f"--configs takes a comma list of {', '.join(CONFIGS)}")
    if not modes or any(m not in MODES for m in modes):
        parser.error("--modes takes a comma list of flash (or sdpa), materialized")
    if args.threads < 1 or args.repetitions < 1 or min(steps_for.values()) < 2:
        parser.error("--threads and --repetitions must be >= 1, --steps-* >= 2")

    program = args.build_dir / PROGRAM_RELATIVE_PATH
    if not program.is_file():
        print(f"error: {program} not found; build it first, e.g.\n"
              f"  cmake --preset release\n"
              f"  cmake --build --preset release --target riftco-train", file=sys.stderr)
        return 2
    if not args.torch_anchor.is_file():
        print(f"error: {args.torch_anchor} not found (--torch-anchor)", file=sys.stderr)
        return 2
    # Each side at its best: ours as a user runs it; torch on the OpenMP OpenBLAS with its
    # kernel checked (and fixed if OpenBLAS fell back to a generic one). Only the thread
    # counts are shared.
    environment = user_environment(args.threads, args.openblas_coretype)
    torch_env = torch_environment(args.threads, args.torch_openblas_coretype)
    if torch_env is None:
        return 2
    flags = cpu_flags()
    print(f"threads: {args.threads} on both sides ({', '.join(THREAD_VARIABLES)})")
    print_ours_environment(environment, "as a user runs it", program)
    coretype = environment.get("OPENBLAS_CORETYPE")
    progress("probing the kernel torch's process runs")
    try:
        settled = settle_torch_kernel(args.python, torch_env, args.torch_openblas_coretype,
                                      flags)
    except (RuntimeError, OSError, json.JSONDecodeError, subprocess.SubprocessError) as error:
        progress("")
        print(f"error: the torch probe failed: {error}", file=sys.stderr)
        return 1
    progress("")
    probe = settled["probes"][-1]
    print(f"torch: torch {probe.get('torch')} ({args.python} {args.torch_anchor}); "
          f"{describe_tuning(torch_env)}; LD_LIBRARY_PATH={torch_env['LD_LIBRARY_PATH']}")
    for earlier in settled["probes"][:-1]:
        print(f"  kernel (probe, OPENBLAS_CORETYPE "
              f"{earlier['OPENBLAS_CORETYPE'] or 'unset'}): {describe_openblas(earlier)}")
    print(f"  kernel (probe, OPENBLAS_CORETYPE {probe['OPENBLAS_CORETYPE'] or 'unset'}): "
          f"{describe_openblas(probe)}")
    for note in settled["notes"]:
        print(f"  note: {note}")
    if settled["warnings"]:
        print_warning(["WARNING: " + w for w in settled["warnings"]])

    report: dict[str, Any] = {
        "settings": {"threads": args.threads, "repetitions": args.repetitions,
                     "configs": configs, "modes": modes, "steps": steps_for,
                     "torch_steps": args.torch_steps, "torch_warmup": args.torch_warmup,
                     "program": str(program), "torch_anchor": str(args.torch_anchor),
                     "removed_from_environment": removed_tuning_variables(),
                     "ours_OPENBLAS_CORETYPE": coretype,
                     "ours_LD_LIBRARY_PATH": environment.get("LD_LIBRARY_PATH"),
                     "torch_OPENBLAS_CORETYPE": torch_env.get("OPENBLAS_CORETYPE"),
                     "torch_OPENBLAS_CORETYPE_set_by": settled["coretype_set_by"],
                     "torch_LD_LIBRARY_PATH": torch_env["LD_LIBRARY_PATH"]},
        "torch_kernel": settled,
        "load_average_start": os.getloadavg(),
    }
    print(f"load average at start: {load_text(report['load_average_start'])} "
          f"(other processes on these cores make absolute figures noisy)")
    print(flush=True)

    summaries, failures, blas_seen = [], [], {}
    for config_name in configs:
        config = CONFIGS[config_name]
        for attention in modes:
            ours_runs, torch_runs = [], []
            for repetition in range(args.repetitions):
                def sample_ours():
                    result = run_ours(program, config, attention, steps_for[config_name],
                                      environment, args.timeout)
                    ours_runs.append(result)
                    blas_seen.setdefault("ours", result.get("blas_libraries"))
                    for line in result.get("kernel_lines", []):
                        if line not in blas_seen.setdefault("ours_lines", []):
                            blas_seen["ours_lines"].append(line)
                    wall = result["tokens_per_s_wall"]
                    print(f"  {config_name:<5} {attention:<12} run {repetition + 1} ours : "
                          f"{result['tokens_per_s']:8.1f} tokens/s (steps "
                          f"{result['window_steps'][0]}-{result['window_steps'][1]}, "
                          f"{result['step_s_mean']:.4f} s/step; "
                          f"{'-' if wall is None else f'{wall:.1f}'} by the wall clock)  "
                          f"peak {result['peak_mib']:.1f} MiB ("
                          f"{number_or_dash(result['train_peak_mib'])} at the last step)  "
                          f"others {result['others_cpu_pct']:.1f}%  exit {result['returncode']}",
                          flush=True)

                def sample_torch():
                    record = run_torch(args.python, args.torch_anchor, config_name,
                                       MODES[attention], args.threads, torch_env,
                                       args.timeout, args.torch_steps, args.torch_warmup)
                    if (record.get("batch"), record.get("seq")) != (config["batch"],
                                                                   config["context"]):
                        raise RuntimeError(f"the anchor's {config_name} is B={record.get('batch')}"
                                           f" T={record.get('seq')}, this script expects "
                                           f"B={config['batch']} T={config['context']}")
                    torch_runs.append(record)
                    blas_seen.setdefault("torch", record.get("blas"))
                    blas_seen.setdefault("torch_version", record.get("torch"))
                    print(f"  {config_name:<5} {attention:<12} run {repetition + 1} torch: "
                          f"{record['tokens_per_s']:8.1f} tokens/s ({record['steps']} steps "
                          f"after {record['warmup']}, median {record['step_s_median']:.4f} "
                          f"s/step)  peak {record['rss_peak_mib']:.1f} MiB  "
                          f"others {record['others_cpu_pct']:.1f}%", flush=True)

                # Alternate which side goes first so neither always follows the other.
                order = ((sample_ours, sample_torch) if repetition % 2 == 0
                         else (sample_torch, sample_ours))
                for sample in order:
                    side = "ours" if sample is sample_ours else "torch"
                    progress(f"{config_name} {attention} run {repetition + 1}/"
                             f"{args.repetitions}: {side}")
                    try:
                        sample()
                    except (RuntimeError, OSError, json.JSONDecodeError,
                            subprocess.SubprocessError) as error:
                        failures.append(f"{config_name}/{attention} {side}: {error}")
                        print(f"  {config_name:<5} {attention:<12} run {repetition + 1} "
                              f"{side}: FAILED: {error}", file=sys.stderr, flush=True)
                progress("")
            summary = summarise(config_name, attention, config, ours_runs, torch_runs)
            summaries.append(summary)
            if summary.get("ours_params") is not None:
                expected = expected_parameters(config, summary["ours_vocabulary"], tied=False)
                if expected != summary["ours_params"]:
                    print(f"  note: ours has {summary['ours_params']} parameters, a GPT-2 "
                          f"with an untied biased head would have {expected}")
            if (summary.get("ours_vocabulary") is not None
                    and summary["ours_vocabulary"] != config["vocab"]):
                print(f"  note: the corpus gave ours {summary['ours_vocabulary']} token ids, "
                      f"not {config['vocab']} (torch uses {config['vocab']})")

    report["summaries"] = summaries
    report["load_average_end"] = os.getloadavg()
    print()
    report["kernels"] = print_kernels(blas_seen, environment, torch_env, settled)
    print()
    print_report(args, summaries)
    print(f"load average at end: {load_text(report['load_average_end'])}")
    if report["kernels"]["warnings"]:
        print_warning(["WARNING (repeated from above): " + w
                       for w in report["kernels"]["warnings"]])
    report["failures"] = failures
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json_out}")
    if failures:
        print(f"error: {len(failures)} run(s) failed:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure.splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def print_kernels(blas_seen: dict[str, Any], environment: dict[str, str],
                  torch_env: dict[str, str], settled: dict[str, Any]) -> dict[str, Any]:
    """Prints which kernels each side ran; returns them with every warning so far."""
    kernels: dict[str, Any] = {"warnings": list(settled["warnings"])}
    print("kernels:")
    if "ours" in blas_seen:
        ours_libraries = blas_seen["ours"] or []
        kernels["ours_blas_libraries"] = ours_libraries
        kernels["ours_lines"] = blas_seen.get("ours_lines", [])
        print(f"  ours : {describe_tuning(environment)}; BLAS/GEMM libraries mapped: "
              f"{', '.join(ours_libraries) or 'none'}")
        for line in kernels["ours_lines"]:
            print(f"         riftco-train: {line.strip()}")
        if not kernels["ours_lines"]:
            print("         (riftco-train printed no line mentioning gemm, kernel or BLAS)")
        try:
            ours_openblas = probe_ours_openblas(ours_libraries, environment)
        except (RuntimeError, OSError, json.JSONDecodeError,
                subprocess.SubprocessError) as error:
            ours_openblas = None
            print(f"         (probing its OpenBLAS failed: {error})")
        if ours_openblas:
            kernels["ours_openblas"] = ours_openblas
            print(f"         its OpenBLAS in this environment: {describe_openblas(ours_openblas)}")
            if reason := generic_kernel(ours_openblas.get("openblas_corename"), cpu_flags()):
                print(f"         note: {reason}: " + (
                    "--openblas-coretype asked for it" if environment.get("OPENBLAS_CORETYPE")
                    else "that is what a user gets, and the ratios below show it"))
    else:
        print("  ours : no run completed")
    probe = settled["probes"][-1]
    print(f"  torch: {describe_tuning(torch_env)}; probe: {describe_openblas(probe)}")
    if "torch" in blas_seen:
        anchor_blas = str(blas_seen["torch"] or "")
        kernels["torch_anchor_blas"] = anchor_blas
        print(f"         the anchor ({blas_seen.get('torch_version')}) mapped: "
              f"{anchor_blas or 'nothing named *blas*'}")
        anchor_openblas = [p for p in anchor_blas.split(",") if "libopenblas" in p]
        if probe.get("openblas_library") and anchor_openblas and (
                os.path.realpath(anchor_openblas[0])
                != os.path.realpath(probe["openblas_library"])):
            kernels["warnings"].append(
                f"the anchor mapped {anchor_openblas[0]}, the probe "
                f"{probe['openblas_library']}: the probed kernel is not the one torch ran")
    else:
        print("  torch: no anchor run completed")
    if len(kernels["warnings"]) > len(settled["warnings"]):
        print_warning(["WARNING: " + w for w in kernels["warnings"][len(settled["warnings"]):]])
    return kernels


def number_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
