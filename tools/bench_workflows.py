#!/usr/bin/env python3
"""Workflow benchmarks: Python pretraining against the C++ trainer, peak memory on a 1 GB
corpus, and the wall time of ``riftco demo``.

1. overhead: the SMALL workload of the PyTorch yardstick (V=8192 BPE, D=512, H=8, N=6,
   F=2048, T=256, B=4, flash attention, 2 threads) pretrained for --steps steps
     - by C++: build/<dir>/examples/cpp/riftco-train (the engine called directly), and
     - by Python: riftco_transformer.pretraining.pretrain_file (ctypes over the same build's
       library; batches drawn in Python from a memory-mapped token file, metrics published
       to a sink each step).
   Both train on the bundled corpus (data/corpus/*.txt, in name order). The figure is the
   time of steps 2..N (step 1 warms up; evaluation and sampling excluded): the C++ one from
   riftco-train's cumulative tokens/s at step 1 and step N, the Python one from the on_step
   timestamps. Runs alternate (C++, Python, C++, ...) --repetitions times each so machine
   drift falls on both; the report gives every run and the ratio of medians. Target:
   Python / C++ <= 1.05.
2. rss: a --corpus-megabytes corpus (default 1024) generated from the bundled texts (lines
   shuffled with a fixed seed, so it is not one text repeated) is pretrained with
   pretrain_file (TINY model, --rss-steps steps) in a child process; reported: the child's
   peak RSS (getrusage), the phase times and the token count.
3. demo: ``python -m riftco_transformer demo`` wall time.

This is a report, not a test.

    /usr/bin/python3 tools/bench_workflows.py --build-dir build/release overhead rss demo
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL = dict(steps=200, context_size=256, batch_size=4, vocabulary_size=8192, model_width=512,
             head_count=8, block_count=6, feed_forward_width=2048)

PYTHON_WORKER = r"""
import json, sys, time
from riftco_transformer.pretraining import PretrainingConfig, pretrain_file
settings = json.loads(sys.argv[2])
stamps = {}
def on_step(metric):
    stamps[metric.step] = time.perf_counter()
config = PretrainingConfig(**settings, learning_rate=3e-3, attention="flash", backend="cpu",
                           evaluation_interval=settings["steps"], validation_batch_count=1,
                           random_seed=1234)
started = time.perf_counter()
result = pretrain_file(sys.argv[1], config, on_step=on_step)
steps = settings["steps"]
print(json.dumps({"seconds": stamps[steps] - stamps[1], "wall": time.perf_counter() - started,
                  "tokens": result.training_token_count,
                  "final_loss": [m.loss for m in result.metrics if m.phase == "train"][-1]}))
"""


def environment(build: Path, threads: int) -> dict:
    library = next(build.glob("libriftco_transformer_c.so.2"))
    return {**os.environ, "RIFTCO_TRANSFORMER_LIBRARY": str(library),
            "PYTHONPATH": str(REPOSITORY / "python"),
            "RIFTCO_TRANSFORMER_NUM_THREADS": str(threads)}


def run_cpp(build: Path, steps: int, threads: int) -> dict:
    binary = build / "examples" / "cpp" / "riftco-train"
    arguments = [str(binary), "--steps", str(steps), "--batch", "4", "--context", "256",
                 "--width", "512", "--heads", "8", "--blocks", "6", "--feed-forward", "2048",
                 "--vocabulary", "8192", "--attention", "flash", "--sample-length", "1",
                 "--corpus-dir", str(REPOSITORY / "data" / "corpus")]
    completed = subprocess.run(arguments, env=environment(build, threads), capture_output=True,
                               text=True)
    if completed.returncode not in (0, 1):  # 1: the held-out loss did not beat the baseline
        raise RuntimeError(f"riftco-train failed:\n{completed.stderr}")
    output = completed.stdout
    rates = {int(m.group(1)): float(m.group(2))
             for m in re.finditer(r"step\s+(\d+)\s.*?(\d+) tokens/s", output)}
    tokens = 4 * 256
    seconds = steps * tokens / rates[steps] - tokens / rates[1]
    return {"seconds": seconds, "cpu_line": output.splitlines()[0]}


def run_python(build: Path, corpus: Path, steps: int, threads: int) -> dict:
    settings = {**SMALL, "steps": steps}
    completed = subprocess.run([sys.executable, "-c", PYTHON_WORKER, str(corpus),
                                json.dumps(settings)], env=environment(build, threads),
                               capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def overhead(arguments) -> None:
    corpus = Path(tempfile.mkdtemp()) / "corpus.txt"
    corpus.write_text("".join(p.read_text() for p in sorted((REPOSITORY / "data" / "corpus").glob("*.txt"))))
    cpp, python = [], []
    for repetition in range(arguments.repetitions):
        c = run_cpp(arguments.build_dir, arguments.steps, arguments.threads)
        cpp.append(c["seconds"])
        print(f"  run {repetition + 1}: C++    {c['seconds']:.2f} s for steps 2..{arguments.steps}"
              f"  ({c['cpu_line']})", flush=True)
        p = run_python(arguments.build_dir, corpus, arguments.steps, arguments.threads)
        python.append(p["seconds"])
        print(f"  run {repetition + 1}: Python {p['seconds']:.2f} s for steps 2..{arguments.steps}"
              f"  (wall {p['wall']:.1f} s incl. tokenizer fit and evaluation; final loss "
              f"{p['final_loss']:.3f})", flush=True)
    steps = arguments.steps - 1
    tokens = steps * 4 * 256
    c, p = statistics.median(cpp), statistics.median(python)
    print(f"overhead: C++ {c / steps:.3f} s/step ({tokens / c:,.0f} tokens/s), Python "
          f"{p / steps:.3f} s/step ({tokens / p:,.0f} tokens/s); Python / C++ = {p / c:.3f} "
          f"(medians of {arguments.repetitions} alternating runs)")


RSS_WORKER = r"""
import json, resource, sys, time
from riftco_transformer.pretraining import PretrainingConfig, pretrain_file
stamps = {}
def on_step(metric):
    stamps.setdefault("first_step", time.perf_counter())
started = time.perf_counter()
result = pretrain_file(sys.argv[1], PretrainingConfig(steps=int(sys.argv[2]), backend="cpu",
                                                      evaluation_interval=int(sys.argv[2])),
                       on_step=on_step, work_directory=sys.argv[3])
ended = time.perf_counter()
print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "tokens": result.training_token_count + result.validation_token_count,
                  "prepare_seconds": stamps["first_step"] - started,
                  "total_seconds": ended - started}))
"""


def rss(arguments) -> None:
    directory = Path(tempfile.mkdtemp(prefix="riftco-rss-"))
    corpus = directory / "corpus.txt"
    lines = []
    for path in sorted((REPOSITORY / "data" / "corpus").glob("*.txt")):
        lines += path.read_text().splitlines(keepends=True)
    generator = random.Random(3)
    target = arguments.corpus_megabytes << 20
    written = 0
    with open(corpus, "w") as stream:
        while written < target:
            generator.shuffle(lines)
            block = "".join(lines)
            stream.write(block)
            written += len(block.encode())
    print(f"  corpus: {written / 2**20:,.0f} MiB at {corpus}", flush=True)
    completed = subprocess.run([sys.executable, "-c", RSS_WORKER, str(corpus),
                                str(arguments.rss_steps), str(directory)],
                               env=environment(arguments.build_dir, arguments.threads),
                               capture_output=True, text=True, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    print(f"rss: pretrain_file on {written / 2**20:,.0f} MiB ({result['tokens']:,} tokens): peak "
          f"RSS {result['peak_rss_kib'] / 1024:,.0f} MiB; tokenizing {result['prepare_seconds']:.0f} s, "
          f"total {result['total_seconds']:.0f} s for {arguments.rss_steps} steps")
    corpus.unlink()


def demo(arguments) -> None:
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "riftco_transformer", "demo"],
                               env=environment(arguments.build_dir, arguments.threads),
                               capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - started
    for line in completed.stdout.splitlines():
        print(f"  {line}")
    print(f"demo: riftco demo took {elapsed:.1f} s wall")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=REPOSITORY / "build" / "release")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--corpus-megabytes", type=int, default=1024)
    parser.add_argument("--rss-steps", type=int, default=50)
    parser.add_argument("modes", nargs="+", choices=("overhead", "rss", "demo"))
    arguments = parser.parse_args()
    for mode in arguments.modes:
        print(f"== {mode}", flush=True)
        {"overhead": overhead, "rss": rss, "demo": demo}[mode](arguments)
    return 0


if __name__ == "__main__":
    sys.exit(main())
