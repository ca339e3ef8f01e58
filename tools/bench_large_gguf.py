#!/usr/bin/env python3
"""Memory and decode speed of a large GGUF file kept at its own precision (``weights="file"``),
beside llama.cpp on the same file: the synthetic Llama-2-7B-shaped Q4_0 file of
tools/make_synthetic_llama_gguf.py (about 3.8 GB; target: ours loads within 4.5 GB of peak
RSS and decodes).

    python3 tools/make_synthetic_llama_gguf.py --shape llama2-7b        # once, ~/.cache/...
    python3 tools/bench_large_gguf.py --model ~/.cache/riftco-transformer/models/\\
synthetic-llama2-7b.Q4_0.gguf [--llama-cpp /work/llama.cpp-build/bin] [--threads 2]

Ours runs in a child process (so its peak RSS, ru_maxrss, is its own): load with
``weights="file"`` and ``maximum_context`` --context, then a --prompt-token prefill and
--generate decode steps (``decode_session(cache="paged")``, greedy), timed with
time.perf_counter. llama.cpp runs ``llama-bench -m FILE -t THREADS -p 0 -n GENERATE -r 1``.
The two run one after the other, never at once. Our library: RIFTCO_TRANSFORMER_LIBRARY, else
build/release/libriftco_transformer_c.so. A report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import riftco_transformer as rt
path, context, prompt, generate = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
start = time.perf_counter()
model = rt.LlamaMistralTransformer.from_gguf(path, maximum_context=context, weights="file")
load_s = time.perf_counter() - start
after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
memory = model.quantized_memory
session = model.decode_session(cache="paged", block_size=16)
logits = session.prefill(list(range(3, 3 + prompt)))
token = max(range(len(logits)), key=logits.__getitem__)
start = time.perf_counter()
for _ in range(generate):
    logits = session.step(token)
    token = max(range(len(logits)), key=logits.__getitem__)
decode_s = time.perf_counter() - start
session.close()
print(json.dumps({"load_s": load_s, "rss_after_load": after_load,
                  "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "packed_bytes": memory.resident_payload_bytes,
                  "format": model.linear_weight_format, "cpu_info": rt.cpu_info(),
                  "decode_tokens_per_s": generate / decode_s}))
model.close()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp build's bin directory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--generate", type=int, default=16)
    parser.add_argument("--library", type=Path,
                        default=REPOSITORY / "build/release/libriftco_transformer_c.so")
    arguments = parser.parse_args()
    if not arguments.model.is_file():
        parser.error(f"{arguments.model} is absent: make it with "
                     "tools/make_synthetic_llama_gguf.py")
    environment = {**os.environ, "RIFTCO_TRANSFORMER_NUM_THREADS": str(arguments.threads)}
    environment.setdefault("RIFTCO_TRANSFORMER_LIBRARY", str(arguments.library))
    size = arguments.model.stat().st_size
    print(f"file: {arguments.model} ({size / 2**30:.2f} GiB); {arguments.threads} threads; "
          f"ours: context {arguments.context}, prefill {arguments.prompt}, decode "
          f"{arguments.generate} tokens")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(REPOSITORY / "python"), str(arguments.model),
         str(arguments.context), str(arguments.prompt), str(arguments.generate)],
        capture_output=True, text=True, env=environment, check=False)
    if child.returncode != 0:
        print(child.stderr, file=sys.stderr)
        return 1
    ours = json.loads(child.stdout.strip().splitlines()[-1])
    gib = 2**30
    print(f"ours: {ours['cpu_info']}")
    print(f"ours: weights {ours['format']}, {ours['packed_bytes'] / gib:.2f} GiB packed; load "
          f"{ours['load_s']:.1f} s; peak RSS after load {ours['rss_after_load'] / gib:.2f} GiB "
          f"(file + {(ours['rss_after_load'] - size) / 2**20:.0f} MiB), after decoding "
          f"{ours['rss_peak'] / gib:.2f} GiB (target <= 4.5 GB: "
          f"{'ok' if ours['rss_peak'] <= 4.5e9 else 'MISS'})")
    print(f"ours: decode {ours['decode_tokens_per_s']:.2f} tokens/s")
    if arguments.llama_cpp is None:
        return 0
    binary = arguments.llama_cpp / "llama-bench"
    llama_environment = {**os.environ, "LD_LIBRARY_PATH": str(arguments.llama_cpp)}
    run = subprocess.run([str(binary), "-m", str(arguments.model), "-t", str(arguments.threads),
                          "-p", "0", "-n", str(arguments.generate), "-r", "1", "-o", "json"],
                         capture_output=True, text=True, env=llama_environment, check=False)
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        return 1
    record = json.loads(run.stdout)[0]
    theirs = record["avg_ts"]
    print(f"llama.cpp {record.get('build_commit')}: {record.get('model_type')}, decode "
          f"{theirs:.2f} tokens/s (tg{arguments.generate}); ours/llama.cpp "
          f"{ours['decode_tokens_per_s'] / theirs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
