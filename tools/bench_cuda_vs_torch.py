#!/usr/bin/env python3
"""GPT-2-124M on the GPU: ours (backend="cuda") beside PyTorch eager CUDA (issue 16 targets).

Workloads are the PyTorch yardstick's `gpt2` config (shared/bench/torch_anchor.py and its
README): V=50257, D=768, 12 heads, 12 blocks, F=3072, context 1024, learned positions, pre-LN,
exact (erf) GELU, the head tied to the token embedding, float32, Adam (AdamW with weight decay
0 on the torch side) with lr 3e-4 and global-norm clipping at 1.0.

  train   one training step (forward, cross-entropy, backward, clip, Adam) at B=4, T=128:
          seconds per step, median over --train-steps after --train-warmup untimed steps.
          Ours: attention flash (and materialized with --attention both); torch: the
          anchor's `sdpa` (F.scaled_dot_product_attention) and `materialized` modes.
          Target: ours >= 0.8x torch's tokens/s.
  decode  greedy batch-1 decoding with a KV cache, prompt 16, 128 new tokens (prefill
          excluded), median of 3 generations after a warm-up. Ours: a decode session
          (paged and contiguous caches; the better one is the figure) advanced through
          decode_batch, whose rows carry the library's argmax. Torch: the anchor's model with
          a simple static KV cache ([1, H, 1024, 64] per block, written in place), the next
          token chosen on the device. Target: ours >= 1.0x torch's tokens/s.

Parity of arithmetic: our matmuls are cuBLAS in pedantic float32 (CUBLAS_COMPUTE_32F; TF32 only
with RIFTCO_TRANSFORMER_CUDA_MATMUL=tf32, which this script refuses unless --allow-tf32). So
torch runs with torch.backends.cuda.matmul.allow_tf32 = False, cudnn.allow_tf32 = False and
float32 matmul precision "highest", and the report says so. The kernels each side ran are
listed from one profiled step (torch.profiler/CUPTI sees every CUDA kernel of the process, ours
included; best effort: "not captured" when the profiler cannot).

Each side runs in its own subprocess (this file with --side), so a failure on one side is
reported without losing the other. Exit status: 0 when both sides ran (the targets are
reported, not enforced: see --enforce-targets), 1 when anything failed to run; with no CUDA
device visible it prints a SKIP line and exits 0 (--require-device makes that a failure).

    PYTHONPATH=python RIFTCO_TRANSFORMER_LIBRARY=build/cuda/libriftco_transformer_c.so \\
        python3 tools/bench_cuda_vs_torch.py [--require-device] [--attention flash|materialized|both]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_DEVICE = "no CUDA device visible"
# The yardstick's gpt2 workload (shared/bench/torch_anchor.py CONFIGS["gpt2"]).
GPT2 = dict(vocab=50257, d_model=768, n_heads=12, n_layers=12, d_ff=3072, max_ctx=1024,
            train_T=128, batch=4)
SEED = 1234
PROMPT, GENERATE, DECODE_REPS = 16, 128, 3
TRAIN_TARGET, DECODE_TARGET = 0.8, 1.0
# Torch's device: cuda, except when the torch side alone is exercised without a GPU
# (--side torch --torch-device cpu, a development check of this script).
TORCH_DEVICE = "cuda"
OUR_BACKEND = "cuda"  # likewise --side ours --our-backend cpu


def emit(record: dict) -> None:
    print("RESULT " + json.dumps(record), flush=True)


def batches(count: int) -> list[tuple[list[list[int]], list[int]]]:
    """``count`` (inputs [B][T], flat next-token targets) from a fixed seed."""
    generator = random.Random(SEED)
    B, T, V = GPT2["batch"], GPT2["train_T"], GPT2["vocab"]
    result = []
    for _ in range(count):
        rows = [[generator.randrange(V) for _ in range(T + 1)] for _ in range(B)]
        result.append(([row[:-1] for row in rows], [t for row in rows for t in row[1:]]))
    return result


def prompt_ids() -> list[int]:
    generator = random.Random(SEED + 1)
    return [generator.randrange(GPT2["vocab"]) for _ in range(PROMPT)]


# ---- our side ----------------------------------------------------------------------------------


def _our_model(attention: str):
    from riftco_transformer import DecoderOnlyTransformer, TransformerConfig

    config = TransformerConfig(vocabulary_size=GPT2["vocab"], maximum_context=GPT2["max_ctx"],
                               model_width=GPT2["d_model"], head_count=GPT2["n_heads"],
                               block_count=GPT2["n_layers"], feed_forward_width=GPT2["d_ff"],
                               random_seed=SEED, tie_embeddings=True)
    model = DecoderOnlyTransformer(config, attention=attention)
    model.to(OUR_BACKEND)
    return model


def our_train(attention: str, warmup: int, steps: int, profile: bool) -> None:
    from riftco_transformer import Adam, cross_entropy

    model = _our_model(attention)
    data = batches(warmup + steps)
    times, losses = [], []
    with model.parameters() as parameters, \
            Adam(parameters, learning_rate=3e-4, maximum_gradient_norm=1.0) as adam:
        parameter_count = sum(math.prod(shape) for shape in parameters.shapes)

        def step(inputs, targets) -> float:
            with model(inputs) as logits, cross_entropy(logits, targets) as loss:
                value = loss.item()  # a sync point: the forward has finished
                loss.backward()
            adam.step()  # the global norm is read back: backward has finished
            return value

        for index, (inputs, targets) in enumerate(data):
            start = time.perf_counter()
            losses.append(step(inputs, targets))
            if index >= warmup:
                times.append(time.perf_counter() - start)
        kernels = _profile(lambda: step(*data[0])) if profile else None
    model.close()
    median = statistics.median(times)
    emit(dict(side="ours", bench="train", attention=attention, params=parameter_count,
              step_s=median, step_s_min=min(times), tokens_per_s=GPT2["batch"] * GPT2["train_T"]
              / median, loss_first=losses[0], loss_last=losses[-1], kernels=kernels,
              matmul=os.environ.get("RIFTCO_TRANSFORMER_CUDA_MATMUL") or "fp32"))


def our_decode(profile: bool) -> None:
    import riftco_transformer

    model = _our_model("materialized")
    prompt = prompt_ids()
    figures = {}
    kernels = None
    for cache in ("paged", "contiguous"):
        def generate(steps: int) -> tuple[float, float, list[int]]:
            with model.decode_session(cache=cache) as session:
                start = time.perf_counter()
                row = riftco_transformer.decode_batch([session], [prompt])[0]
                token = row.argmax
                prefilled = time.perf_counter()
                out = [token]
                for _ in range(steps):
                    row = riftco_transformer.decode_batch([session], [[token]])[0]
                    token = row.argmax
                    out.append(token)
                return prefilled - start, time.perf_counter() - prefilled, out

        generate(8)  # warm-up
        runs = [generate(GENERATE) for _ in range(DECODE_REPS)]
        if any(run[2] != runs[0][2] for run in runs):
            raise RuntimeError(f"{cache}: repeated greedy generations differ")
        median = statistics.median(run[1] for run in runs)
        figures[cache] = dict(decode_s=median, tokens_per_s=GENERATE / median,
                              prefill_s=statistics.median(run[0] for run in runs))
        if profile and kernels is None:
            kernels = _profile(lambda: generate(16))
    best = max(figures, key=lambda name: figures[name]["tokens_per_s"])
    model.close()
    emit(dict(side="ours", bench="decode", caches=figures, best_cache=best,
              tokens_per_s=figures[best]["tokens_per_s"], kernels=kernels,
              matmul=os.environ.get("RIFTCO_TRANSFORMER_CUDA_MATMUL") or "fp32"))


# ---- torch's side (the anchor's model, on the GPU) ---------------------------------------------


def _torch_setup():
    import torch

    if TORCH_DEVICE == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} sees no CUDA device "
                           f"(torch.version.cuda={torch.version.cuda})")
    # Parity with our float32 default: no TF32 anywhere.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


def _torch_gpt(torch, mode: str):
    import torch.nn as nn
    import torch.nn.functional as F

    c = GPT2

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["d_model"]
            self.h, self.hd = c["n_heads"], d // c["n_heads"]
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.fc1 = nn.Linear(d, c["d_ff"])
            self.fc2 = nn.Linear(c["d_ff"], d)
            mask = torch.ones(c["max_ctx"], c["max_ctx"], dtype=torch.bool).tril()
            self.register_buffer("causal", mask, persistent=False)

        def attention(self, x, cache=None, pos=0):
            B, T, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (t.view(B, T, self.h, self.hd).transpose(1, 2) for t in (q, k, v))
            if cache is not None:  # the static KV cache: write [pos, pos+T), read [0, pos+T)
                K, V = cache
                K[:, :, pos:pos + T] = k
                V[:, :, pos:pos + T] = v
                k, v = K[:, :, :pos + T], V[:, :, :pos + T]
            S = k.shape[2]
            causal = T > 1
            if mode == "sdpa":
                assert not causal or S == T
                if hasattr(F, "scaled_dot_product_attention"):
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                else:  # torch < 2.0 (only where the torch side is checked on a CPU)
                    y = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
                if causal:
                    att = att.masked_fill(~self.causal[S - T:S, :S], float("-inf"))
                y = torch.softmax(att, dim=-1) @ v
            return self.proj(y.transpose(1, 2).reshape(B, T, d))

        def forward(self, x, cache=None, pos=0):
            x = x + self.attention(self.ln1(x), cache, pos)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(c["vocab"], c["d_model"])
            self.pos = nn.Embedding(c["max_ctx"], c["d_model"])
            self.blocks = nn.ModuleList(Block() for _ in range(c["n_layers"]))
            self.ln_f = nn.LayerNorm(c["d_model"])
            for name, p in self.named_parameters():
                if p.dim() == 1 and "ln" not in name:
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    std = (0.02 / math.sqrt(2 * c["n_layers"])
                           if name.endswith(("proj.weight", "fc2.weight")) else 0.02)
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, caches=None, pos=0):
            T = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(pos, pos + T, device=idx.device))
            for i, block in enumerate(self.blocks):
                x = block(x, None if caches is None else caches[i], pos)
            return F.linear(self.ln_f(x), self.tok.weight)

    torch.manual_seed(SEED)
    return GPT().to(TORCH_DEVICE)


def _torch_settings(torch) -> dict:
    settings = dict(torch=torch.__version__, cuda=torch.version.cuda,
                    device=(torch.cuda.get_device_name(0) if TORCH_DEVICE == "cuda"
                            else TORCH_DEVICE),
                    matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                    cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                    float32_matmul_precision=torch.get_float32_matmul_precision())
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
                 "cudnn_sdp_enabled"):
        query = getattr(torch.backends.cuda, name, None)
        if query is not None:
            settings[name] = bool(query())
    return settings


def _synchronize(torch) -> None:
    if TORCH_DEVICE == "cuda":
        torch.cuda.synchronize()


def torch_train(mode: str, warmup: int, steps: int, profile: bool) -> None:
    torch = _torch_setup()
    import torch.nn.functional as F

    model = _torch_gpt(torch, mode).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    data = [(torch.tensor(x, device=TORCH_DEVICE), torch.tensor(y, device=TORCH_DEVICE))
            for x, y in batches(warmup + steps)]

    def step(x, y) -> float:
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, GPT2["vocab"]), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()  # as the anchor: one host read at the end of the step

    times, losses = [], []
    for index, (x, y) in enumerate(data):
        _synchronize(torch)
        start = time.perf_counter()
        losses.append(step(x, y))
        _synchronize(torch)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    kernels = _profile(lambda: step(*data[0])) if profile else None
    median = statistics.median(times)
    emit(dict(side="torch", bench="train", attention=mode,
              params=sum(p.numel() for p in model.parameters()), step_s=median,
              step_s_min=min(times), tokens_per_s=GPT2["batch"] * GPT2["train_T"] / median,
              loss_first=losses[0], loss_last=losses[-1], kernels=kernels,
              settings=_torch_settings(torch)))


def torch_decode(mode: str, profile: bool) -> None:
    torch = _torch_setup()
    model = _torch_gpt(torch, mode).eval()
    c = GPT2
    hd = c["d_model"] // c["n_heads"]
    prompt = torch.tensor([prompt_ids()], device=TORCH_DEVICE)

    @torch.inference_mode()
    def generate(steps: int):
        caches = [(torch.zeros(1, c["n_heads"], c["max_ctx"], hd, device=TORCH_DEVICE),
                   torch.zeros(1, c["n_heads"], c["max_ctx"], hd, device=TORCH_DEVICE))
                  for _ in range(c["n_layers"])]
        _synchronize(torch)
        start = time.perf_counter()
        logits = model(prompt, caches, 0)
        token = logits[:, -1].argmax(-1, keepdim=True)
        _synchronize(torch)
        prefilled = time.perf_counter()
        out = [token]
        pos = prompt.shape[1]
        for _ in range(steps):
            logits = model(token, caches, pos)
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(token)
            pos += 1
        _synchronize(torch)
        return prefilled - start, time.perf_counter() - prefilled, torch.cat(out, 1)

    generate(8)
    runs = [generate(GENERATE) for _ in range(DECODE_REPS)]
    median = statistics.median(run[1] for run in runs)
    with torch.inference_mode():  # the cache must agree with a cache-free forward
        sequence = torch.cat([prompt, runs[0][2][:, :-1]], 1)
        reference = model(sequence)[:, PROMPT - 1:].argmax(-1)
    kernels = _profile(lambda: generate(16)) if profile else None
    emit(dict(side="torch", bench="decode", attention=mode, decode_s=median,
              tokens_per_s=GENERATE / median,
              prefill_s=statistics.median(run[0] for run in runs),
              matches_full_forward=bool(torch.equal(reference, runs[0][2])), kernels=kernels,
              settings=_torch_settings(torch)))


def _profile(work, top: int = 8):
    """The ``top`` CUDA kernels by device time while ``work`` runs (torch.profiler; None
    without torch or CUPTI)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as error:  # noqa: BLE001
        return f"not captured (no torch.profiler: {error})"
    try:
        _synchronize(torch)
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            work()
            _synchronize(torch)
        totals: dict[str, float] = {}
        for event in profiler.events():  # kernels and copies only, not the ops that launched them
            if str(getattr(event, "device_type", "")).endswith("CUDA"):
                totals[event.name] = (totals.get(event.name, 0.0)
                                      + float(event.time_range.elapsed_us()))
        if not totals:
            return "not captured (the profiler recorded no CUDA kernel)"
        ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
        return [f"{name[:90]} {us / 1000:.2f} ms" for name, us in ranked]
    except Exception as error:  # noqa: BLE001
        return f"not captured ({type(error).__name__}: {error})"


# ---- the driver --------------------------------------------------------------------------------


def run_side(arguments: list[str], timeout: float) -> tuple[dict | None, str]:
    command = [sys.executable, str(Path(__file__).resolve()), *arguments]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                   env=os.environ)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s: {' '.join(arguments)}"
    records = [json.loads(line[7:]) for line in completed.stdout.splitlines()
               if line.startswith("RESULT ")]
    if completed.returncode != 0 or not records:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-15:]
        return None, f"{' '.join(arguments)} exited {completed.returncode}:\n  " + "\n  ".join(tail)
    return records[-1], ""


def library_status() -> tuple[bool, str]:
    sys.path.insert(1, str(ROOT / "python"))
    import ctypes

    from riftco_transformer import backend_available
    from riftco_transformer.native._loader import library
    from riftco_transformer.native.backends import backend_value

    if backend_available("cuda"):
        return True, ""
    required = ctypes.c_uint64()
    text = ctypes.create_string_buffer(1024)
    library().rt_backend_unavailability_reason(backend_value("cuda"), text, len(text),
                                               ctypes.byref(required))
    return False, text.value.decode("utf-8")


def describe_kernels(label: str, kernels) -> None:
    if isinstance(kernels, list):
        print(f"  {label} kernels (top by device time, one profiled step):")
        for line in kernels:
            print(f"    {line}")
    elif kernels:
        print(f"  {label} kernels: {kernels}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", choices=["ours", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--bench", choices=["train", "decode"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="flash", help=argparse.SUPPRESS)
    parser.add_argument("--torch-device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--our-backend", default="cuda", help=argparse.SUPPRESS)
    # Development check of this script without a GPU: both sides on the CPU, nothing compared
    # with a target that means anything.
    parser.add_argument("--development-cpu", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--attention", choices=["flash", "materialized", "both"],
                        default="flash", help="our training attention (default flash; torch "
                        "runs sdpa against flash and materialized against materialized)")
    parser.add_argument("--train-warmup", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel listing")
    parser.add_argument("--side-timeout", type=float, default=150.0,
                        help="seconds each measured subprocess may take (default 150)")
    parser.add_argument("--require-device", action="store_true",
                        help="fail instead of skipping when no CUDA device is visible")
    parser.add_argument("--allow-tf32", action="store_true",
                        help="accept RIFTCO_TRANSFORMER_CUDA_MATMUL=tf32 (no longer parity)")
    parser.add_argument("--enforce-targets", action="store_true",
                        help="exit 1 when a ratio misses its target")
    arguments = parser.parse_args()
    profile = not arguments.no_profile

    if arguments.side:  # a measured subprocess
        global TORCH_DEVICE, OUR_BACKEND
        TORCH_DEVICE, OUR_BACKEND = arguments.torch_device, arguments.our_backend
        sys.path.insert(1, str(ROOT / "python"))
        if arguments.side == "ours" and arguments.bench == "train":
            our_train(arguments.mode, arguments.train_warmup, arguments.train_steps, profile)
        elif arguments.side == "ours":
            our_decode(profile)
        elif arguments.bench == "train":
            torch_train(arguments.mode, arguments.train_warmup, arguments.train_steps, profile)
        else:
            torch_decode(arguments.mode, profile)
        return 0

    available, reason = library_status()
    if arguments.development_cpu:
        print("bench_cuda_vs_torch: --development-cpu: both sides on the CPU (a check of this "
              "script, not a benchmark)")
    elif not available:
        if reason == NO_DEVICE and not arguments.require_device:
            print(f"SKIP: bench_cuda_vs_torch: {NO_DEVICE}")
            return 0
        print(f"FAIL: bench_cuda_vs_torch: the cuda backend is unavailable: {reason}")
        return 1
    if os.environ.get("RIFTCO_TRANSFORMER_CUDA_MATMUL") == "tf32" and not arguments.allow_tf32:
        print("FAIL: bench_cuda_vs_torch: RIFTCO_TRANSFORMER_CUDA_MATMUL=tf32 set; this "
              "comparison is float32 on both sides (pass --allow-tf32 to run it anyway)")
        return 1

    common = ["--train-warmup", str(arguments.train_warmup),
              "--train-steps", str(arguments.train_steps)] + (["--no-profile"] if not profile
                                                               else [])
    if arguments.development_cpu:
        common += ["--our-backend", "cpu", "--torch-device", "cpu"]
    pairs = {"flash": "sdpa", "materialized": "materialized"}
    ours_modes = ["flash", "materialized"] if arguments.attention == "both" else [
        arguments.attention]
    failures: list[str] = []
    summary: list[str] = []
    ratios: dict[str, float] = {}

    print(f"bench_cuda_vs_torch: GPT-2-124M ({GPT2}), B={GPT2['batch']} T={GPT2['train_T']} "
          f"train; batch-1 greedy decode, prompt {PROMPT}, {GENERATE} tokens")
    print("  arithmetic: float32 on both sides. Ours: cuBLAS CUBLAS_COMPUTE_32F (pedantic, no "
          "TF32; RIFTCO_TRANSFORMER_CUDA_MATMUL="
          f"{os.environ.get('RIFTCO_TRANSFORMER_CUDA_MATMUL') or 'fp32'}). Torch: "
          "torch.backends.cuda.matmul.allow_tf32=False, cudnn.allow_tf32=False, "
          "float32_matmul_precision='highest' (set for parity with our FP32 default).")

    for mode in ours_modes:
        ours, error = run_side(["--side", "ours", "--bench", "train", "--mode", mode, *common],
                               arguments.side_timeout)
        if error:
            failures.append(f"ours train ({mode}): {error}")
        theirs, error = run_side(["--side", "torch", "--bench", "train", "--mode", pairs[mode],
                                  *common], arguments.side_timeout)
        if error:
            failures.append(f"torch train ({pairs[mode]}): {error}")
        print(f"train, ours {mode} vs torch {pairs[mode]}:")
        for label, record in (("ours", ours), ("torch", theirs)):
            if record:
                print(f"  {label}: {record['step_s'] * 1000:.1f} ms/step (min "
                      f"{record['step_s_min'] * 1000:.1f}), {record['tokens_per_s']:.0f} "
                      f"tokens/s, {record['params']} parameters, loss {record['loss_first']:.3f}"
                      f" -> {record['loss_last']:.3f}")
                describe_kernels(label, record.get("kernels"))
                if record.get("settings"):
                    print(f"  torch settings: {record['settings']}")
        if ours and theirs:
            ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
            ratios[f"train {mode}"] = ratio
            verdict = "meets" if ratio >= TRAIN_TARGET else "MISSES"
            print(f"  ratio ours/torch {ratio:.2f}x ({verdict} the >= {TRAIN_TARGET}x target)")
            summary.append(f"train({mode}) {ratio:.2f}x [{verdict} >={TRAIN_TARGET}x]")
        else:
            summary.append(f"train({mode}) FAILED to run")

    ours, error = run_side(["--side", "ours", "--bench", "decode", *common],
                           arguments.side_timeout)
    if error:
        failures.append(f"ours decode: {error}")
    theirs, error = run_side(["--side", "torch", "--bench", "decode", "--mode", "sdpa", *common],
                             arguments.side_timeout)
    if error:
        failures.append(f"torch decode: {error}")
    print("decode (batch 1, KV cache):")
    if ours:
        caches = ", ".join(f"{name} {figure['tokens_per_s']:.1f} tokens/s"
                           for name, figure in ours["caches"].items())
        print(f"  ours: {caches} (best: {ours['best_cache']})")
        describe_kernels("ours", ours.get("kernels"))
    if theirs:
        print(f"  torch (sdpa, static KV cache): {theirs['tokens_per_s']:.1f} tokens/s, cached "
              f"decode matches a full forward: {theirs['matches_full_forward']}")
        describe_kernels("torch", theirs.get("kernels"))
        if not theirs["matches_full_forward"]:
            failures.append("torch decode: the static KV cache disagrees with a full forward")
    if ours and theirs:
        ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
        ratios["decode"] = ratio
        verdict = "meets" if ratio >= DECODE_TARGET else "MISSES"
        print(f"  ratio ours/torch {ratio:.2f}x ({verdict} the >= {DECODE_TARGET}x target)")
        summary.append(f"decode {ratio:.2f}x [{verdict} >={DECODE_TARGET}x]")
    else:
        summary.append("decode FAILED to run")

    for failure in failures:
        print(f"FAIL: {failure}")
    missed = [name for name, ratio in ratios.items()
              if ratio < (DECODE_TARGET if name == "decode" else TRAIN_TARGET)]
    print("bench_cuda_vs_torch: " + "; ".join(summary))
    if failures:
        return 1
    return 1 if arguments.enforce_targets and missed else 0


if __name__ == "__main__":
    sys.exit(main())
