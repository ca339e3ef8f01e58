#!/usr/bin/env python3
"""Data-parallel scaling on this machine, in one run (needs the `mpi` preset's build).

Trains the SMALL workload of bench/README.md (V=8192 BPE, D=512, 8 heads, 6 blocks, F=2048,
T=256, global batch 4) with riftco-train, alternating:

* 1 rank x 1 thread   (OMP/RIFTCO threads = 1, no MPI);
* R ranks x 1 thread  (`mpirun -n R --data-parallel`, the same global batches), three ways:
  the blocking reduction (after backward), the overlapped one (buckets reduced while backward
  runs; the default) and overlapped with ZeRO-1 (Adam's moments sharded),

and reports tokens/s (median over --repetitions, after the first step: riftco-train's rate
at the last step counts from the start, so step 1's warm-up is amortised by --steps), each
speed-up over one rank, the share of the training time the ranks spent in collectives (for
the overlapped runs: the time the reduction added, not the time it ran under backward), and
the optimizer-state bytes each rank holds. Then runs the allreduce bandwidth benchmark (ours,
blocking and non-blocking, beside a plain MPI_Allreduce loop).

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
    variants = {"blocking": ["--reduction", "blocking"],
                "overlapped": ["--reduction", "overlapped"],
                "overlapped+ZeRO-1": ["--reduction", "overlapped", "--zero-1"]}
    single = []
    rates = {name: [] for name in variants}
    shares = {name: [] for name in variants}
    state = {}
    kernel = None
    for repetition in range(arguments.repetitions):
        # Blocks, not interleaved calls: each run has the machine to itself.
        output = run([train, *SMALL, *steps])
        kernel = kernel or re.search(r"cpu: (.*)", output).group(1)
        single.append(rate(output))
        line = f"repetition {repetition + 1}: 1x1 {single[-1]:.0f} tokens/s"
        for name, flags in variants.items():
            output = run([arguments.mpirun, "-n", str(arguments.ranks), "--oversubscribe", train,
                          *SMALL, *steps, "--data-parallel", *flags])
            rates[name].append(rate(output))
            share = re.search(r"collectives in [0-9.]+ s \(([0-9.]+)% of training\)", output)
            shares[name].append(float(share.group(1)))
            held = re.search(r"optimizer state per rank: (\d+) bytes \(([0-9.]+) of", output)
            state[name] = (int(held.group(1)), float(held.group(2)))
            line += (f"; {arguments.ranks}x1 {name} {rates[name][-1]:.0f} tokens/s "
                     f"(collectives {shares[name][-1]:.1f}%)")
        print(line, flush=True)
    one = statistics.median(single)
    print(f"\nkernel: {kernel}")
    print(f"SMALL, global batch 4 x 256 tokens, {arguments.steps} steps, median of "
          f"{arguments.repetitions}: 1 rank x 1 thread {one:.0f} tokens/s")
    for name in variants:
        many = statistics.median(rates[name])
        print(f"  {arguments.ranks} ranks x 1 thread, {name:18s} {many:6.0f} tokens/s, speed-up "
              f"{many / one:.2f}x, collectives {statistics.median(shares[name]):4.1f}% of "
              f"training time, optimizer state per rank {state[name][0]:,} bytes "
              f"({state[name][1]:.3f} of unsharded)")
    print()
    print(run([arguments.mpirun, "-n", str(arguments.ranks), "--oversubscribe", bench]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
