#!/usr/bin/env python3
"""Python-driven training step vs the same step from C++, and bulk copies out of a tensor.

1. Step overhead. The TINY workload of the PyTorch yardstick (V=256, D=128, H=4, N=4,
   F=512, T=128, B=8, flash attention, Adam defaults, seed 7) runs as
     - C++:    build/<dir>/bench/riftco_bench_train_step (engine called directly), and
     - Python: this script's --worker mode, through the riftco_transformer package (ctypes
               over libriftco_transformer_c from the same build): model(tokens) →
               cross_entropy → backward → step → loss.item(), tokens passed as array('I') rows.
   Both use identical token arrays ((i·7919 + s·31) mod V) and report seconds per step after
   the same warm-up. The two run alternately, --repetitions times each, with the same thread
   count, so drift from other processes falls on both; figures are medians of per-run
   medians. Target: Python / C++ seconds per step <= 1.10. The final losses of both must
   agree (same work).
2. Bulk copy. 10^7 float32 values leave a tensor through Tensor.copy_to (into a caller's
   array), Tensor.to_array, Tensor.numpy (when numpy is importable) and Tensor.tolist, and
   enter through Tensor.from_data; each as GB/s beside a plain memory copy of the same bytes
   in the same process (ctypes.memmove), the machine's memory speed at that moment.

This is a report, not a test: the exit status is 0 unless something failed to run.

    /usr/bin/python3 tools/bench_python_vs_cpp.py --build-dir build/release --threads 2
"""

from __future__ import annotations

import argparse
import array
import ctypes
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_report import print_table, progress, thread_environment

REPOSITORY = Path(__file__).resolve().parent.parent
TINY = dict(vocab=256, width=128, heads=4, blocks=4, feed_forward=512, context=128, batch=8)
OVERHEAD_TARGET = 1.10
COPY_ELEMENTS = 10_000_000


def step_tokens(step: int, count: int, vocab: int) -> tuple[array.array, array.array]:
    tokens = array.array("I", ((i * 7919 + step * 31) % vocab for i in range(count)))
    targets = array.array("I", (((i + 1) * 7919 + step * 31) % vocab for i in range(count)))
    return tokens, targets


def python_worker(steps: int, warmup: int) -> None:
    """Times the training step through the Python package; prints the C++ bench's JSON."""
    from riftco_transformer import (Adam, DecoderOnlyTransformer, TransformerConfig,
                                    cross_entropy)

    config = TransformerConfig(vocabulary_size=TINY["vocab"], maximum_context=TINY["context"],
                               model_width=TINY["width"], head_count=TINY["heads"],
                               block_count=TINY["blocks"],
                               feed_forward_width=TINY["feed_forward"], random_seed=7)
    batch, context = TINY["batch"], TINY["context"]
    model = DecoderOnlyTransformer(config, attention="flash")
    optimizer = Adam(model.parameters())
    seconds = []
    loss_value = 0.0
    for step in range(warmup + steps):
        flat_tokens, flat_targets = step_tokens(step, batch * context, TINY["vocab"])
        tokens = [flat_tokens[row * context:(row + 1) * context] for row in range(batch)]
        targets = [flat_targets[row * context:(row + 1) * context] for row in range(batch)]
        start = time.perf_counter()
        with model(tokens) as logits, cross_entropy(logits, targets) as loss:
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
        stop = time.perf_counter()
        if step >= warmup:
            seconds.append(stop - start)
    optimizer.close()
    model.close()
    print(json.dumps({"seconds_per_step": seconds, "final_loss": loss_value}))


def run_json(command: list[str], environment: dict[str, str]) -> dict:
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        sys.exit(f"{command[0]} failed ({result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_step_overhead(args, environment) -> list[list[str]]:
    build = args.build_dir.resolve()
    cpp = [str(build / "bench" / "riftco_bench_train_step"), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--attention", "flash"]
    python = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps",
              str(args.steps), "--warmup", str(args.warmup)]
    medians = {"C++": [], "Python": []}
    losses = {}
    for repetition in range(args.repetitions):
        for name, command in (("C++", cpp), ("Python", python)):
            progress(f"step overhead: {name}, repetition {repetition + 1}/{args.repetitions}")
            report = run_json(command, environment)
            medians[name].append(statistics.median(report["seconds_per_step"]))
            losses[name] = report["final_loss"]
    cpp_seconds = statistics.median(medians["C++"])
    python_seconds = statistics.median(medians["Python"])
    ratio = python_seconds / cpp_seconds
    tokens = TINY["batch"] * TINY["context"]
    verdict = "meets" if ratio <= OVERHEAD_TARGET else "MISSES"
    print(f"\nTINY training step (B={TINY['batch']}, T={TINY['context']}, flash, "
          f"{args.threads} threads): final loss C++ {losses['C++']:.6f}, "
          f"Python {losses['Python']:.6f}")
    rows = [["C++ (engine)", f"{cpp_seconds * 1e3:.2f}", f"{tokens / cpp_seconds:.0f}",
             " ".join(f"{m * 1e3:.1f}" for m in medians["C++"])],
            ["Python (ctypes)", f"{python_seconds * 1e3:.2f}", f"{tokens / python_seconds:.0f}",
             " ".join(f"{m * 1e3:.1f}" for m in medians["Python"])]]
    print_table(["driver", "ms/step", "tokens/s", "per-run medians (ms)"], rows)
    print(f"Python / C++ = {ratio:.3f} ({verdict} the <= {OVERHEAD_TARGET:.2f} target); "
          f"overhead {(python_seconds - cpp_seconds) * 1e3:+.2f} ms/step")
    return rows


def best_seconds(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def measure_bulk_copy(repeats: int) -> None:
    from riftco_transformer import Context, Tensor

    count = COPY_ELEMENTS
    gigabytes = count * 4 / 1e9
    source = array.array("f", bytes(4 * count))
    for index in range(0, count, 4096):
        source[index] = float(index)
    destination = array.array("f", bytes(4 * count))
    source_address, _ = source.buffer_info()
    destination_address, _ = destination.buffer_info()
    rows = []

    def add(name: str, seconds: float, reference: float) -> None:
        rows.append([name, f"{gigabytes / seconds:.2f}", f"{reference / seconds:.2f}",
                     f"{seconds * 1e3:.1f}"])

    with Context("cpu") as context, Tensor.from_data(context, (count,), source) as tensor:
        memcpy = best_seconds(lambda: ctypes.memmove(destination_address, source_address,
                                                     4 * count), repeats)
        add("memcpy (ctypes.memmove, same process)", memcpy, memcpy)
        add("Tensor.copy_to(array('f'))", best_seconds(lambda: tensor.copy_to(destination),
                                                       repeats), memcpy)
        add("Tensor.to_array()", best_seconds(tensor.to_array, repeats), memcpy)
        if importlib.util.find_spec("numpy") is not None:  # numpy is optional
            add("Tensor.numpy()", best_seconds(tensor.numpy, repeats), memcpy)
        else:
            rows.append(["Tensor.numpy()", "numpy not installed", "", ""])
        add("Tensor.tolist() (Python floats)", best_seconds(tensor.tolist, max(1, repeats // 2)),
            memcpy)

        def upload() -> None:
            Tensor.from_data(context, (count,), source).close()

        add("Tensor.from_data(array('f'))", best_seconds(upload, repeats), memcpy)
        check = array.array("f", bytes(4 * count))
        tensor.copy_to(check)
        if check != source:
            sys.exit("Tensor.copy_to did not reproduce the uploaded values")
    print(f"\nBulk transfer of 10^7 float32 ({gigabytes * 1e3:.0f} MB), best of {repeats}:")
    print_table(["path", "GB/s", "x memcpy", "ms"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=REPOSITORY / "build" / "release")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--copy-repeats", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        python_worker(args.steps, args.warmup)
        return 0

    library = args.build_dir.resolve() / "libriftco_transformer_c.so"
    environment = thread_environment(args.threads)
    environment["RIFTCO_TRANSFORMER_LIBRARY"] = str(library)
    environment["PYTHONPATH"] = str(REPOSITORY / "python")
    os.environ.update(environment)
    sys.path.insert(0, str(REPOSITORY / "python"))
    measure_step_overhead(args, environment)
    measure_bulk_copy(args.copy_repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
