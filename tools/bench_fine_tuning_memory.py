#!/usr/bin/env python3
"""Full vs LoRA vs QLoRA fine-tuning memory on the SMALL workload, one process per mode.

Runs build/<preset>/bench/riftco_bench_fine_tuning_memory for each mode and prints its JSON
plus the ratios the LoRA/QLoRA issue asks for: QLoRA's resident packed payload against the
same weights in float32, the whole base's resident bytes against the float32 base, and each
mode's peak RSS during a step against full fine-tuning's.

    python3 tools/bench_fine_tuning_memory.py [--build-dir build/release] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--config", default="small", choices=("small", "tiny"))
    parser.add_argument("--steps", default="2")
    arguments = parser.parse_args()
    tool = Path(arguments.build_dir) / "bench" / "riftco_bench_fine_tuning_memory"
    if not tool.exists():
        print(f"missing {tool}: build the release preset first", file=sys.stderr)
        return 2
    # All large allocations straight from mmap, so RSS follows live memory rather than glibc's
    # heap caching (the same setting for every mode).
    environment = dict(os.environ, RIFTCO_TRANSFORMER_NUM_THREADS=arguments.threads,
                       MALLOC_MMAP_THRESHOLD_="65536")
    results = {}
    for mode in ("full", "lora", "qlora"):
        output = subprocess.run(
            [str(tool), "--mode", mode, "--config", arguments.config, "--steps", arguments.steps],
            check=True, capture_output=True, text=True, env=environment,
        ).stdout
        results[mode] = json.loads(output)
        print(output.strip())
    mib = 1 << 20
    full, qlora = results["full"], results["qlora"]
    print(f"qlora packed payload / its fp32 weights: "
          f"{qlora['packed_resident_bytes'] / qlora['packed_fp32_equivalent_bytes']:.4f} "
          f"({qlora['packed_resident_bytes'] / mib:.1f} MiB vs "
          f"{qlora['packed_fp32_equivalent_bytes'] / mib:.1f} MiB)")
    print(f"qlora whole base resident / fp32 base: "
          f"{qlora['base_resident_bytes'] / qlora['base_fp32_bytes']:.4f} "
          f"({qlora['base_resident_bytes'] / mib:.1f} MiB vs {qlora['base_fp32_bytes'] / mib:.1f} MiB;"
          f" embeddings, norms and biases stay fp32)")
    for mode in ("lora", "qlora"):
        print(f"{mode} peak live tensor bytes during a step / full's: "
              f"{results[mode]['peak_live_tensor_bytes'] / full['peak_live_tensor_bytes']:.3f} "
              f"({results[mode]['peak_live_tensor_bytes'] / mib:.0f} MiB vs "
              f"{full['peak_live_tensor_bytes'] / mib:.0f} MiB)")
        print(f"{mode} peak RSS during a step / full's: "
              f"{results[mode]['peak_rss_step_bytes'] / full['peak_rss_step_bytes']:.3f} "
              f"({results[mode]['peak_rss_step_bytes'] / mib:.0f} MiB vs "
              f"{full['peak_rss_step_bytes'] / mib:.0f} MiB); step time ratio "
              f"{results[mode]['seconds_per_step'] / full['seconds_per_step']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
