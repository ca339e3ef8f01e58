#!/usr/bin/env python3
"""Times KV-cached decoding (riftco_bench_decode) beside eager PyTorch with its own KV cache,
and optionally beside llama.cpp, in one invocation, and prints the ratios.

Workloads are the PyTorch yardstick's (/work/shared/bench/torch_anchor.py --bench decode):
tiny, small and gpt2 (GPT-2-124M-sized), random init, fp32, greedy, batch 1, a 16-token
prompt then --gen single-token steps (capped at C - prompt, as the anchor caps). Each config
runs our benchmark and the anchor alternately, --repetitions times each, with the same
thread count, so load from other processes falls on both sides; figures are medians.

Prefill: a 128-token prompt in one pass (tiny, whose context is 128, uses 127 tokens so the
anchor can still decode one). Ours: DecodeSession.prefill; torch: the anchor's prefill_s
(one forward over the prompt that fills its cache).

Also from our side: aggregate decode throughput with 1, 4 and 8 concurrent streams through
one shared KV pool (each step one batched decode over all streams, as the scheduler runs
it), and the bandwidth bound (weight bytes a decode step reads against the read bandwidth
measured in the same process).

llama.cpp (F32, the gpt2 config): pass --llama-bench <build>/bin/llama-bench and
--llama-model <gpt2-sized F32 .gguf> (tools/make_gpt2_gguf.py writes one with random
weights); it runs `llama-bench -p <prefill> -n <gen> -t <threads>` alternately with ours.

Each side runs at its best: ours as a user runs it; torch on the OpenMP OpenBLAS with its
kernel probed (bench_train_vs_torch's rule: OPENBLAS_CORETYPE set for the torch side only
if OpenBLAS autodetects a generic fallback). The kernel each side ran is printed.

    /usr/bin/python3 tools/bench_decode.py --build-dir build/release --threads 2

This is a report, not a test: the exit status is 0 unless something failed to run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_report import cpu_flags, print_table, print_warning, progress, torch_environment, \
    user_environment
from bench_train_vs_torch import describe_openblas, settle_torch_kernel

DEFAULT_ANCHOR = "/work/shared/bench/torch_anchor.py"
PROGRAM = Path("bench") / "riftco_bench_decode"
CONTEXT = {"tiny": 128, "small": 256, "gpt2": 1024}
TARGETS = {"decode vs torch": 1.0, "decode vs llama.cpp": 0.9, "prefill vs best peer": 1.0,
           "4 streams vs 1": 2.5}


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run(command: list[str], environment: dict[str, str], timeout: float) -> str:
    completed = subprocess.run(command, env=environment, capture_output=True, text=True,
                               timeout=timeout)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {completed.returncode}:\n"
                           f"{completed.stderr.strip()[-2000:]}")
    return completed.stdout


def prefill_length(config: str) -> int:
    return min(128, CONTEXT[config] - 1)


def run_ours(program: Path, config: str, args, environment) -> dict[str, Any]:
    command = [str(program), "--config", config, "--gen", str(args.gen), "--reps",
               str(args.reps), "--prefill", str(prefill_length(config)), "--streams",
               args.streams, "--stream-steps", str(args.stream_steps)]
    records = json_lines(run(command, environment, args.timeout))
    return {record["bench"] if record["bench"] != "streams" else f"streams{record['streams']}":
            record for record in records}


def run_torch(python: str, anchor: Path, config: str, args, environment) -> dict[str, Any]:
    decode = [python, str(anchor), "--threads", str(args.threads), "--config", config,
              "--mode", "sdpa", "--bench", "decode", "--gen", str(args.gen), "--decode-reps",
              str(args.reps)]
    records = {"decode": next(r for r in json_lines(run(decode, environment, args.timeout))
                              if r.get("bench") == "decode")}
    prompt = prefill_length(config)
    prefill = [python, str(anchor), "--threads", str(args.threads), "--config", config,
               "--mode", "sdpa", "--bench", "decode", "--prompt", str(prompt), "--gen", "1",
               "--decode-reps", str(args.reps)]
    records["prefill"] = next(r for r in json_lines(run(prefill, environment, args.timeout))
                              if r.get("bench") == "decode")
    return records


def run_llama(bench: Path, model: Path, args, environment) -> dict[str, float]:
    command = [str(bench), "-m", str(model), "-p", str(prefill_length("gpt2")), "-n",
               str(args.gen), "-t", str(args.threads), "-r", str(args.reps), "-o", "json"]
    out = run(command, environment, args.timeout)
    start = out.find("[")
    results = json.loads(out[start:])
    figures: dict[str, float] = {}
    for result in results:
        if result.get("n_prompt", 0) > 0 and result.get("n_gen", 0) == 0:
            figures["prefill_tokens_per_s"] = float(result["avg_ts"])
        elif result.get("n_gen", 0) > 0 and result.get("n_prompt", 0) == 0:
            figures["decode_tokens_per_s"] = float(result["avg_ts"])
        figures.setdefault("build", result.get("build_commit", "?"))
        figures.setdefault("type", result.get("model_type", "?"))
        figures.setdefault("cpu", result.get("cpu_info", "?"))
    return figures


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default="build/release", type=Path)
    parser.add_argument("--torch-anchor", default=DEFAULT_ANCHOR, type=Path)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--configs", default="tiny,small,gpt2")
    parser.add_argument("--gen", default=128, type=int, help="decode steps (anchor --gen)")
    parser.add_argument("--reps", default=3, type=int, help="timed runs inside each process")
    parser.add_argument("--repetitions", default=2, type=int,
                        help="processes per side, alternating ours and the peers")
    parser.add_argument("--threads", default=2, type=int)
    parser.add_argument("--streams", default="1,4,8")
    parser.add_argument("--stream-steps", default=32, type=int)
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench binary")
    parser.add_argument("--llama-model", type=Path, help="GPT-2-sized F32 GGUF for llama.cpp")
    parser.add_argument("--torch-openblas-coretype", default=None)
    parser.add_argument("--timeout", default=1800.0, type=float)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    program = args.build_dir / PROGRAM
    if not program.is_file():
        print(f"error: {program} not found; build the release preset first", file=sys.stderr)
        return 2
    configs = [c for c in args.configs.split(",") if c]
    if any(c not in CONTEXT for c in configs):
        parser.error(f"--configs takes a comma list of {', '.join(CONTEXT)}")
    environment = user_environment(args.threads)
    torch_env = torch_environment(args.threads, args.torch_openblas_coretype)
    if torch_env is None:
        return 2
    progress("probing the kernel torch's process runs")
    settled = settle_torch_kernel(args.python, torch_env, args.torch_openblas_coretype,
                                  cpu_flags())
    progress("")
    torch_probe = settled["probes"][-1]
    use_llama = args.llama_bench is not None and args.llama_model is not None

    ours: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    torch: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    llama: list[dict[str, float]] = []
    for repetition in range(args.repetitions):
        for config in configs:
            progress(f"[{repetition + 1}/{args.repetitions}] {config}: ours")
            ours[config].append(run_ours(program, config, args, environment))
            progress(f"[{repetition + 1}/{args.repetitions}] {config}: torch")
            torch[config].append(run_torch(args.python, args.torch_anchor, config, args,
                                           torch_env))
            if use_llama and config == "gpt2":
                progress(f"[{repetition + 1}/{args.repetitions}] gpt2: llama.cpp")
                llama.append(run_llama(args.llama_bench, args.llama_model, args, environment))
    progress("")

    kernels = ours[configs[0]][0].get("kernels", {})
    print(f"threads: {args.threads} on every side")
    print(f"ours : {kernels.get('cpu')}; paged attention: {kernels.get('paged_attention')}")
    print(f"torch: {torch_probe.get('torch')} on {describe_openblas(torch_probe)}")
    for note in settled["notes"]:
        print(f"note: {note}")
    if settled["warnings"]:
        print_warning(settled["warnings"])
    if use_llama:
        print(f"llama.cpp: build {llama[0].get('build')}, model type {llama[0].get('type')}, "
              f"cpu {llama[0].get('cpu')}")

    rows = []
    report: dict[str, Any] = {"configs": {}}
    for config in configs:
        ours_decode = median([r["decode"]["tokens_per_s"] for r in ours[config]])
        torch_decode = median([r["decode"]["tokens_per_s"] for r in torch[config]])
        ours_prefill = median([r["prefill"]["tokens_per_s"] for r in ours[config]])
        torch_prefill = median([prefill_length(config) / r["prefill"]["prefill_s"]
                                for r in torch[config]])
        streams = {int(k[len("streams"):]): median([r[k]["tokens_per_s"] for r in ours[config]])
                   for k in ours[config][0] if k.startswith("streams")}
        bandwidth = ours[config][0]["bandwidth"]
        entry = {"ours_decode": ours_decode, "torch_decode": torch_decode,
                 "ours_prefill": ours_prefill, "torch_prefill": torch_prefill,
                 "streams": streams, "bandwidth": bandwidth}
        peers_prefill = [torch_prefill]
        llama_decode = llama_prefill = None
        if use_llama and config == "gpt2" and llama:
            llama_decode = median([r["decode_tokens_per_s"] for r in llama
                                   if "decode_tokens_per_s" in r])
            llama_prefill = median([r["prefill_tokens_per_s"] for r in llama
                                    if "prefill_tokens_per_s" in r])
            entry.update(llama_decode=llama_decode, llama_prefill=llama_prefill)
            peers_prefill.append(llama_prefill)
        best_peer_prefill = max(p for p in peers_prefill if p is not None)
        rows.append([config, fmt(ours_decode), fmt(torch_decode),
                     f"{ours_decode / torch_decode:.2f}x",
                     fmt(llama_decode) if llama_decode else "-",
                     f"{ours_decode / llama_decode:.2f}x" if llama_decode else "-",
                     f"{prefill_length(config)}", fmt(ours_prefill, 0), fmt(torch_prefill, 0),
                     fmt(llama_prefill, 0) if llama_prefill else "-",
                     f"{ours_prefill / best_peer_prefill:.2f}x"])
        report["configs"][config] = entry
    print()
    print("decode: tokens/s, batch 1, greedy; prefill: tokens/s of one prompt pass")
    print_table(["config", "ours", "torch", "ours/torch", "llama.cpp", "ours/llama",
                 "prompt", "ours pf", "torch pf", "llama pf", "pf/best"], rows)
    print()
    stream_rows = []
    for config in configs:
        entry = report["configs"][config]
        single = entry["streams"].get(1)
        for count, rate in sorted(entry["streams"].items()):
            stream_rows.append([config, str(count), fmt(rate),
                                f"{rate / single:.2f}x" if single else "-"])
    print("aggregate decode through one shared pool (each step one batched decode)")
    print_table(["config", "streams", "tokens/s", "vs 1 stream"], stream_rows)
    print()
    band_rows = []
    for config in configs:
        b = report["configs"][config]["bandwidth"]
        band_rows.append([config, f"{b['weight_bytes_per_token'] / 2**20:,.1f} MiB",
                          f"{b['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s",
                          f"{b['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s",
                          fmt(b["bandwidth_bound_tokens_per_s"]),
                          fmt(report["configs"][config]["ours_decode"]),
                          f"{b['decode_fraction_of_bound']:.2f}"])
    print("bandwidth bound: weight bytes per decode step vs the read bandwidth measured in the "
          "same process (memcpy bandwidth, read+write, for reference)")
    print_table(["config", "weights/token", "copy bw", "read bw", "bound tok/s", "ours tok/s",
                 "fraction"], band_rows)
    print(f"\ntargets: {', '.join(f'{k} >= {v}x' for k, v in TARGETS.items())}")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
