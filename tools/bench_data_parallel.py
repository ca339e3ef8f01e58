#!/usr/bin/env python3
"""Data-parallel scaling on this machine, in one run (needs the `mpi` preset's build).

Trains the SMALL workload of bench/README.md (V=8192 BPE, D=512, 8 heads, 6 blocks, F=2048,
T=256, global batch 4) with riftco-train, alternating:

* 1 rank x 1 thread   (OMP/RIFTCO threads = 1, no MPI);
* R ranks x 1 thread  (`mpirun -n R --data-parallel`, the same global batches),

and reports tokens/s (median over --repetitions, after the first step: riftco-train's rate
at the last step counts from the start, so step 1's warm-up is amortised by --steps), the
speed-up, and the share of the training time the ranks spent in collectives. Then runs the
allreduce bandwidth benchmark (ours beside a plain MPI_Allreduce loop).

    python3 tools/bench_data_parallel.py --build build/mpi --steps 12 --repetitions 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

SMALL = ["--vocabulary", "8192", "--width", "512", "--heads", "8", "--blocks", "6",
         "--feed-forward", "2048", "--context", "256", "--batch", "4", "--warmup", "0",
         "--sample-length", "1"]


def environment() -> dict:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "RIFTCO_TRANSFORMER_NUM_THREADS": "1",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_btl": "self,vader"})
    return env


def run(command: list[str]) -> str:
    completed = subprocess.run(command, capture_output=True, text=True, env=environment(),
                               timeout=1800)
    if completed.returncode not in (0, 1):  # 1: held-out loss above baseline after few steps
        sys.exit(f"{' '.join(command)} failed ({completed.returncode}):\n"
                 f"{completed.stdout}\n{completed.stderr}")
    return completed.stdout


def rate(output: str) -> float:
    rates = re.findall(r"step +\d+ .* (\d+) tokens/s", output)
    if not rates:
        sys.exit(f"no tokens/s in:\n{output}")
    return float(rates[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, default=Path("build/mpi"))
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repetitions", type=int, default=3)
    arguments = parser.parse_args()
    train = str(arguments.build / "examples" / "cpp" / "riftco-train")
    bench = str(arguments.build / "tests" / "mpi_allreduce_bench")
    steps = ["--steps", str(arguments.steps)]
    single, parallel, shares = [], [], []
    kernel = None
    for repetition in range(arguments.repetitions):
        output = run([train, *SMALL, *steps])
        kernel = kernel or re.search(r"cpu: (.*)", output).group(1)
        single.append(rate(output))
        output = run([arguments.mpirun, "-n", str(arguments.ranks), "--oversubscribe", train,
                      *SMALL, *steps, "--data-parallel"])
        parallel.append(rate(output))
        share = re.search(r"collectives in [0-9.]+ s \(([0-9.]+)% of training\)", output)
        shares.append(float(share.group(1)))
        print(f"repetition {repetition + 1}: 1x1 {single[-1]:.0f} tokens/s, "
              f"{arguments.ranks}x1 {parallel[-1]:.0f} tokens/s "
              f"(collectives {shares[-1]:.1f}% of training)", flush=True)
    one, many = statistics.median(single), statistics.median(parallel)
    print(f"\nkernel: {kernel}")
    print(f"SMALL, global batch 4 x 256 tokens, {arguments.steps} steps, median of "
          f"{arguments.repetitions}: 1 rank x 1 thread {one:.0f} tokens/s; {arguments.ranks} "
          f"ranks x 1 thread {many:.0f} tokens/s; speed-up {many / one:.2f}x; collectives "
          f"{statistics.median(shares):.1f}% of training time")
    print()
    print(run([arguments.mpirun, "-n", str(arguments.ranks), "--oversubscribe", bench]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
