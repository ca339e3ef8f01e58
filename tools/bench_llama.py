#!/usr/bin/env python3
"""Our Llama inference beside llama.cpp on the same GGUF file, same thread count, one run.

Workloads (batch 1, greedy):

* prefill: a 128-token prompt in one pass, tokens/s;
* decode: 64 generated tokens after a short prompt, tokens/s of the decode steps only.

Pairs (ours vs llama.cpp):

* F32: ours from the F32 file (float32 weights, flash attention) vs llama.cpp on the same
  F32 file; target ours/llama.cpp >= 0.95;
* Q4_1 file, Q4_0 file, Q8_0 file, Q4_K_M file: ours loads the file with ``weights="file"``
  (its own blocks, and its embedding table packed too: the tied head multiplies by it) vs
  llama.cpp on the same file; target >= 1.0. Make the Q4_0/Q8_0/Q4_K_M files with
  ``llama-quantize --allow-requantize F32.gguf OUT Q4_0`` (and Q8_0, Q4_K_M) outside the
  repository; pass them as --model-q40/--model-q80/--model-q4km, and pick pairs with --pairs.
  (SmolLM2's 576-wide rows do not divide into 256-element K blocks: llama-quantize's Q4_K_M
  writes those Q5_0, with Q8_0 where it wants Q6_K; only ffn_down, 1536 wide, is Q4_K/Q6_K);
* NF4 vs Q4_1: ours loads the Q4_1 file (dequantized to float32), then
  ``quantize_nf4(block_size=64)`` (packed 4-bit weights decoded inside the kernels) vs
  llama.cpp on the Q4_1 file; target >= 0.7. SmolLM2 ties its head to the embedding, and
  quantize_nf4 packs projections only, so here the head is still the float32 table
  (49152 x 576, 113 MB read per decoded token: more than all the packed blocks together);
* NF4+head vs Q4_1: the same, after ``untie_embeddings()``, so that quantize_nf4 packs the
  head as well (the model llama.cpp runs has a quantized head too: Q8_0). This is the
  all-NF4 model; target >= 0.7.

Ours runs through the public Python API (``LlamaMistralTransformer.from_gguf``,
``decode_session(cache="paged", block_size=16)``, ``prefill``/``step``): a warm-up, then the
median of --repetitions, timed with time.perf_counter. A second decode figure, "decode
(decode_batch)", runs the same steps through ``decode_batch([session], [[token]])``, whose
logits come back as one array('f') with the argmax computed natively: the difference from
``step`` (which builds a tuple of V Python floats every token) is per-token Python
overhead, not model time. Greedy argmax between steps is outside the timed region.

llama.cpp runs as ``llama-bench -m FILE -t THREADS -p 128 -n 64 -r N -o json`` (its own
warm-up; its avg_ts is reported). Each pair alternates: ours, then llama.cpp. llama-bench's
defaults stay as they are (f16 KV cache, flash attention auto, CPU repack on).

Reproduce (llama.cpp is built outside this repository and never vendored into it; any
recent checkout works — the sources of the llama-cpp-python sdist on PyPI carry one under
vendor/llama.cpp):

    # llama.cpp's llama-bench and llama-quantize, built (Release, native, OpenMP) from a
    # llama.cpp source OUTSIDE this repository into, say, /work/llama.cpp-build/bin; and an
    # F32 copy of the Q4_1 model made with `llama-quantize --allow-requantize IN OUT F32`
    # into M=~/.cache/riftco-transformer/models (never into the repository).
    # ours (cmake --preset release first), then:
    python3 tools/bench_llama.py --llama-cpp /work/llama.cpp-build/bin \\
        --model-q41 $M/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --model-f32 $M/SmolLM2-135M-Instruct.F32.gguf --threads 2 --repetitions 3

Without llama.cpp: ``--ours-only``. Without --model-f32, ours F32 loads the Q4_1 file
(dequantized to float32) and the F32 pair has no llama.cpp figure.

Our library: RIFTCO_TRANSFORMER_LIBRARY if set, else --library, else
build/release/libriftco_transformer_c.so. RIFTCO_TRANSFORMER_NUM_THREADS is set to
--threads. Standard library only. This is a report, not a test: the exit status is 0 unless
something failed to run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"F32": 0.95, "NF4 vs Q4_1": 0.7, "NF4+head vs Q4_1": 0.7, "Q4_1 file": 1.0,
           "Q4_0 file": 1.0, "Q8_0 file": 1.0, "Q4_K_M file": 1.0}
# How ours prepares each pair's model after loading the file.
PREPARE = {"F32": "float32 as loaded",
           "NF4 vs Q4_1": "quantize_nf4(block_size=64); the tied head stays the float32 table",
           "NF4+head vs Q4_1": "untie_embeddings() then quantize_nf4(block_size=64): the head "
                               "is packed too",
           "Q4_1 file": "weights='file': the file's Q4_1 projections and Q8_0 table as they are",
           "Q4_0 file": "weights='file': the file's Q4_0 projections and Q8_0 table as they are",
           "Q8_0 file": "weights='file': the file's Q8_0 projections and table as they are",
           "Q4_K_M file": "weights='file': the file's Q5_0/Q4_K/Q6_K/Q8_0 tensors as they are"}

# llama.cpp's CPU backend features, read in a child process (so neither its OpenMP runtime
# nor its threads enter ours) through ggml's backend registry: ggml_backend_cpu_reg() and
# its "ggml_backend_get_features" entry point, a NULL-terminated {name, value} array.
GGML_FEATURES = r"""
import ctypes, sys
base = ctypes.CDLL(sys.argv[1] + "/libggml-base.so", mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(sys.argv[1] + "/libggml-cpu.so")
cpu.ggml_backend_cpu_reg.restype = ctypes.c_void_p
base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
class Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]
reg = cpu.ggml_backend_cpu_reg()
address = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
if not address:
    sys.exit("no ggml_backend_get_features")
features = ctypes.CFUNCTYPE(ctypes.POINTER(Feature), ctypes.c_void_p)(address)(reg)
out, i = [], 0
while features[i].name:
    out.append(features[i].name.decode() + "=" + features[i].value.decode())
    i += 1
print(" ".join(out))
"""


class OtherLoad:
    """How much of the machine other processes used during a block: busy CPU time from
    /proc/stat less this process's and its waited-for children's (os.times), as a fraction
    of all cores. Above a few percent, that block's figures are suspect (2 shared cores)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        try:
            with open("/proc/stat") as stat:
                fields = [float(v) for v in stat.readline().split()[1:]]
        except OSError:
            return (0.0, 0.0, 0.0)
        ticks = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        times = os.times()
        ours = times.user + times.system + times.children_user + times.children_system
        return (sum(fields[:8]) / ticks, (sum(fields[:8]) - idle) / ticks, ours)

    def fraction(self) -> float | None:
        end = self._sample()
        total = end[0] - self.start[0]
        if total <= 0:
            return None
        return max(0.0, (end[1] - self.start[1]) - (end[2] - self.start[2])) / total


def progress(message: str) -> None:
    print(f"... {message}", file=sys.stderr, flush=True)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line.format(*row))


# ---- ours ----------------------------------------------------------------------------------

def import_ours(args) -> Any:
    """riftco_transformer, with the library and thread count this run asks for."""
    os.environ["RIFTCO_TRANSFORMER_NUM_THREADS"] = str(args.threads)
    if "RIFTCO_TRANSFORMER_LIBRARY" not in os.environ:
        library = args.library or REPO / "build" / "release" / "libriftco_transformer_c.so"
        os.environ["RIFTCO_TRANSFORMER_LIBRARY"] = str(Path(library).resolve())
    sys.path.insert(0, str(REPO / "python"))
    import riftco_transformer

    return riftco_transformer


def prompt_ids(count: int, vocabulary: int, seed: int) -> list[int]:
    """Deterministic pseudo-random ids (llama-bench also feeds random tokens)."""
    state, ids = seed, []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        ids.append((state >> 33) % vocabulary)
    return ids


def argmax(logits) -> int:
    return logits.index(max(logits))


def ours_prefill(session, ids: list[int]) -> float:
    session.reset()
    start = time.perf_counter()
    session.prefill(ids)
    return len(ids) / (time.perf_counter() - start)


def ours_decode_step(session, prompt: list[int], generate: int) -> float:
    """tokens/s of `generate` DecodeSession.step calls (greedy; argmax outside the timer)."""
    session.reset()
    token = argmax(session.prefill(prompt))
    elapsed = 0.0
    for _ in range(generate):
        start = time.perf_counter()
        logits = session.step(token)
        elapsed += time.perf_counter() - start
        token = argmax(logits)
    return generate / elapsed


def ours_decode_batch(decode_batch, session, prompt: list[int], generate: int) -> float:
    """The same steps through decode_batch([session], [[token]]) (native argmax)."""
    session.reset()
    token = argmax(session.prefill(prompt))
    elapsed = 0.0
    for _ in range(generate):
        start = time.perf_counter()
        (row,) = decode_batch([session], [[token]])
        elapsed += time.perf_counter() - start
        token = row.argmax
    return generate / elapsed


def run_ours(rt, path: Path, name: str, args) -> dict[str, Any]:
    from riftco_transformer.native.decode import decode_batch

    start = time.perf_counter()
    file_weights = name.endswith(" file")
    model = rt.LlamaMistralTransformer.from_gguf(str(path), maximum_context=args.context,
                                                 weights="file" if file_weights else "f32")
    if name == "NF4+head vs Q4_1" and model.config.tie_embeddings:
        model.untie_embeddings()
    if name.startswith("NF4"):
        model.quantize_nf4(block_size=64)
    load_s = time.perf_counter() - start
    vocabulary = model.config.vocabulary_size
    prefill = prompt_ids(args.prompt, vocabulary, 1)
    short = prompt_ids(args.decode_prompt, vocabulary, 2)
    session = model.decode_session(cache="paged", block_size=16)
    try:
        # warm-up: one prefill and a short decode (page leases, kernel first-touch)
        ours_prefill(session, prefill)
        ours_decode_step(session, short, min(8, args.generate))
        samples: dict[str, list[float]] = {"prefill": [], "decode": [], "decode_batch": []}
        for repetition in range(args.repetitions):
            samples["prefill"].append(ours_prefill(session, prefill))
            samples["decode"].append(ours_decode_step(session, short, args.generate))
            samples["decode_batch"].append(
                ours_decode_batch(decode_batch, session, short, args.generate))
    finally:
        session.close()
        model.close()
    result = {name: statistics.median(values) for name, values in samples.items()}
    result["samples"] = samples
    result["load_s"] = load_s
    return result


# ---- llama.cpp -----------------------------------------------------------------------------

def llama_bench_binary(directory: Path) -> Path:
    binary = directory / "llama-bench"
    if not binary.is_file():
        raise SystemExit(f"no llama-bench in {directory} (pass --llama-cpp <build>/bin)")
    return binary


def run_llama(directory: Path, model: Path, args) -> dict[str, Any]:
    command = [str(llama_bench_binary(directory)), "-m", str(model), "-t", str(args.threads),
               "-p", str(args.prompt), "-n", str(args.generate), "-r", str(args.repetitions),
               "-o", "json"]
    environment = dict(os.environ)
    environment.pop("OMP_NUM_THREADS", None)  # -t decides
    completed = subprocess.run(command, capture_output=True, text=True, env=environment,
                               timeout=1800)
    if completed.returncode != 0:
        raise SystemExit(f"llama-bench failed ({completed.returncode}):\n"
                         f"{completed.stderr[-4000:]}")
    records = json.loads(completed.stdout)
    result: dict[str, Any] = {"command": " ".join(command), "records": records}
    for record in records:
        if record.get("n_prompt") and not record.get("n_gen"):
            result["prefill"] = record["avg_ts"]
            result["prefill_samples"] = record.get("samples_ts")
        elif record.get("n_gen") and not record.get("n_prompt"):
            result["decode"] = record["avg_ts"]
            result["decode_samples"] = record.get("samples_ts")
    return result


def llama_features(directory: Path) -> str:
    completed = subprocess.run([sys.executable, "-c", GGML_FEATURES, str(directory)],
                               capture_output=True, text=True, timeout=60)
    if completed.returncode != 0:
        return f"(unknown: {completed.stderr.strip()[-200:]})"
    return completed.stdout.strip()


def describe_llama(directory: Path, records: list[dict[str, Any]]) -> None:
    version = subprocess.run([str(llama_bench_binary(directory)), "--version"],
                             capture_output=True, text=True, timeout=60)
    first = records[0] if records else {}
    print("llama.cpp:", " ".join((version.stdout + version.stderr).split()))
    print(f"  build_commit={first.get('build_commit')} build_number={first.get('build_number')}"
          f" backends={first.get('backends')} cpu_info={first.get('cpu_info')!r}"
          f" gpu_info={first.get('gpu_info')!r}")
    print(f"  type_k={first.get('type_k')} type_v={first.get('type_v')} "
          f"flash_attn={first.get('flash_attn')} repack={first.get('repack')} "
          f"n_batch={first.get('n_batch')} n_ubatch={first.get('n_ubatch')} "
          f"poll={first.get('poll')}")
    print("  CPU backend features:", llama_features(directory))


# ---- main ----------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp build's bin directory")
    parser.add_argument("--model-q41", type=Path, required=True, help="Q4_1 GGUF (Llama)")
    parser.add_argument("--model-f32", type=Path, help="F32 GGUF of the same model")
    parser.add_argument("--model-q40", type=Path, help="Q4_0 GGUF of the same model")
    parser.add_argument("--model-q80", type=Path, help="Q8_0 GGUF of the same model")
    parser.add_argument("--model-q4km", type=Path, help="Q4_K_M GGUF of the same model")
    parser.add_argument("--pairs", help="comma-separated pair names to run (default: all "
                                        "whose files are given)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens (pp)")
    parser.add_argument("--generate", type=int, default=64, help="decode tokens (tg)")
    parser.add_argument("--decode-prompt", type=int, default=4,
                        help="tokens prefilled (untimed) before the decode steps")
    parser.add_argument("--context", type=int, default=512, help="our maximum_context")
    parser.add_argument("--library", type=Path, help="our libriftco_transformer_c.so")
    parser.add_argument("--ours-only", action="store_true", help="skip llama.cpp")
    args = parser.parse_args()
    if args.prompt + 1 > args.context or args.decode_prompt + args.generate > args.context:
        parser.error("--prompt/--generate do not fit in --context")
    use_llama = not args.ours_only
    if use_llama and args.llama_cpp is None:
        parser.error("--llama-cpp is required unless --ours-only")
    if use_llama:
        llama_bench_binary(args.llama_cpp)

    rt = import_ours(args)
    load = os.getloadavg()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"ours: {rt.cpu_info()}; library {os.environ['RIFTCO_TRANSFORMER_LIBRARY']}")
    print(f"workloads: prefill {args.prompt} tokens; decode {args.generate} tokens after a "
          f"{args.decode_prompt}-token prompt; {args.threads} threads; "
          f"{args.repetitions} repetitions (ours: median after a warm-up; llama.cpp: avg)")

    pairs = [("F32", args.model_f32 or args.model_q41, args.model_f32),
             ("NF4 vs Q4_1", args.model_q41, args.model_q41),
             ("NF4+head vs Q4_1", args.model_q41, args.model_q41),
             ("Q4_1 file", args.model_q41, args.model_q41)]
    if args.model_q40:
        pairs.append(("Q4_0 file", args.model_q40, args.model_q40))
    if args.model_q80:
        pairs.append(("Q8_0 file", args.model_q80, args.model_q80))
    if args.model_q4km:
        pairs.append(("Q4_K_M file", args.model_q4km, args.model_q4km))
    if args.pairs:
        wanted = [name.strip() for name in args.pairs.split(",")]
        unknown = sorted(set(wanted) - set(TARGETS))
        if unknown:
            parser.error(f"--pairs: unknown pair(s) {', '.join(unknown)}; known: "
                         f"{', '.join(TARGETS)}")
        pairs = [pair for pair in pairs if pair[0] in wanted]
    results = []
    llama_records: list[dict[str, Any]] = []
    for name, our_file, llama_file in pairs:
        progress(f"{name}: ours ({our_file.name}: {PREPARE[name]})")
        meter = OtherLoad()
        ours = run_ours(rt, our_file, name, args)
        ours["other_load"] = meter.fraction()
        llama = None
        if use_llama and llama_file is not None:
            progress(f"{name}: llama.cpp ({llama_file.name})")
            meter = OtherLoad()
            llama = run_llama(args.llama_cpp, llama_file, args)
            llama["other_load"] = meter.fraction()
            llama_records += llama["records"]
        results.append((name, our_file, llama_file, ours, llama))

    print()
    if llama_records:
        describe_llama(args.llama_cpp, llama_records)
    noisy = False
    for name, our_file, llama_file, ours, llama in results:
        print(f"{name}: ours {our_file.name}, {PREPARE[name]} (load {ours['load_s']:.1f} s)"
              + (f" vs llama.cpp {llama_file.name} "
                 f"({llama['records'][0].get('model_type')})" if llama else ""))
        for side, result in (("ours", ours), ("llama.cpp", llama)):
            if result and result.get("other_load") is not None:
                share = result["other_load"]
                noisy = noisy or share > 0.05
                print(f"  other processes used {share:.0%} of the machine during {side}'s "
                      f"block{' (NOISY)' if share > 0.05 else ''}")
        for key, values in ours["samples"].items():
            print(f"  ours {key:<12} samples tokens/s: "
                  + ", ".join(f"{v:.1f}" for v in values))
        if llama:
            for key in ("prefill", "decode"):
                print(f"  llama.cpp {key:<7} samples tokens/s: "
                      + ", ".join(f"{v:.1f}" for v in llama.get(f"{key}_samples") or []))

    print()
    rows = []
    for name, _, _, ours, llama in results:
        target = TARGETS[name]
        for key, label in (("prefill", f"prefill pp{args.prompt}"),
                           ("decode", f"decode tg{args.generate} (step)"),
                           ("decode_batch", f"decode tg{args.generate} (decode_batch)")):
            theirs = llama.get("decode" if key == "decode_batch" else key) if llama else None
            ratio = ours[key] / theirs if theirs else None
            verdict = "-" if ratio is None else ("ok" if ratio >= target else "MISS")
            rows.append([f"{name}: {label}", fmt(ours[key]), fmt(theirs),
                         "-" if ratio is None else f"{ratio:.2f}x", f">= {target}x", verdict])
    print_table(["workload", "ours tok/s", "llama.cpp tok/s", "ours/llama", "target", ""],
                rows)
    for name, _, _, ours, _ in results:
        overhead = 1e3 / ours["decode"] - 1e3 / ours["decode_batch"]
        print(f"{name}: DecodeSession.step costs {1e3 / ours['decode']:.1f} ms/token, "
              f"decode_batch {1e3 / ours['decode_batch']:.1f} ms/token: about "
              f"{overhead:.1f} ms/token of Python overhead in step (a tuple of V floats)")
    if noisy:
        print("WARNING: other processes used over 5% of the machine during some block: "
              "rerun on a quiet machine before trusting these ratios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
