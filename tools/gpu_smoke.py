#!/usr/bin/env python3
"""Training/serving smoke on backend="cuda" through the public Python API (issue 16).

Each check runs the same work on the CPU backend as the reference and compares:

  pretraining      pretrain_text(backend="cuda"), a tiny GPT for a few steps (materialized
                   attention, then flash): losses finite, close to the CPU's, and falling;
  evaluation       evaluate_text on a model moved to cuda vs the same model on the CPU;
  lora             adapter-only Adam steps on cuda (loss falls, base untouched, merge keeps
                   the logits), loss curve close to the CPU's;
  qlora            NF4-packed base (quantized on the CPU, moved to cuda), adapter steps;
  decode_session   a paged and a contiguous KV-cache session on cuda, teacher-forced with the
                   CPU's greedy tokens, every logits row compared with the CPU's;
  batching         continuous batching: sessions sharing one paged pool advanced together by
                   decode_batch (prefill chunks and decode steps mixed, a session joining
                   late), rows compared with the CPU's; then the serving Scheduler over a
                   NativeEngine on cuda completes several requests and returns every page.

Comparisons use form-B relative bounds (|d - r| <= tol * max(1, |d|, |r|), see
docs/ARCHITECTURE.md, 'Numeric parity') loose enough for cuBLAS's summation order after a few
optimizer steps, tight enough to catch a wrong kernel. Tokens are teacher-forced, so a near-tie in
a random model cannot fail a run.

Exit status: 0 when every check passed; 1 when any failed (the failure and its traceback are
printed). Where the library reports "no CUDA device visible" it prints a SKIP line and exits
0, unless --require-device (what tools/gpu_acceptance.sh passes) makes that a failure; any
other reason for cuda being unavailable (a build without the adapter, an old driver) fails.

    PYTHONPATH=python RIFTCO_TRANSFORMER_LIBRARY=build/cuda/libriftco_transformer_c.so \\
        python3 tools/gpu_smoke.py [--require-device] [--backend cuda]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import math
import os
import sys
import time
import traceback
from pathlib import Path

# Standalone from a checkout: the package in python/ unless PYTHONPATH already names one.
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "python"))

import riftco_transformer  # noqa: E402
from riftco_transformer import (  # noqa: E402
    Adam,
    DecoderOnlyTransformer,
    LoraConfig,
    Tokenizer,
    TransformerConfig,
    backend_available,
    cross_entropy,
)
from riftco_transformer.evaluation import evaluate_text  # noqa: E402
from riftco_transformer.native._loader import library  # noqa: E402
from riftco_transformer.native.backends import backend_value  # noqa: E402
from riftco_transformer.pretraining import PretrainingConfig, pretrain_text  # noqa: E402
from riftco_transformer.serving import GenerationConfig, NativeEngine, Scheduler  # noqa: E402

NO_DEVICE = "no CUDA device visible"
ALPHABET = "abcdefghijklmnopqrstuvwxyz .,!?\n"
TEXT = ("the quick brown fox jumps over the lazy dog. " * 40
        + "pack my box with five dozen liquor jugs. " * 40)
TOKENS = [[1, 5, 9, 3, 7, 2, 11, 4], [4, 8, 6, 0, 31, 12, 3, 9]]
TARGETS = [5, 9, 3, 7, 2, 11, 4, 6, 8, 6, 0, 31, 12, 3, 9, 1]
LORA_TARGETS = ("attention.query", "attention.key", "attention.value", "attention.output",
                "feed_forward.expand", "feed_forward.project")


class SmokeFailure(AssertionError):
    pass


def unavailability_reason(backend: str) -> str:
    required = ctypes.c_uint64()
    text = ctypes.create_string_buffer(1024)
    library().rt_backend_unavailability_reason(backend_value(backend), text, len(text),
                                               ctypes.byref(required))
    return text.value.decode("utf-8")


def close(label: str, device, reference, tolerance: float) -> float:
    """Max relative deviation; raises SmokeFailure past ``tolerance`` or on a non-finite."""
    device, reference = list(device), list(reference)
    if len(device) != len(reference):
        raise SmokeFailure(f"{label}: {len(device)} values on the device, {len(reference)} on cpu")
    worst = 0.0
    for index, (d, r) in enumerate(zip(device, reference)):
        if not (math.isfinite(d) and math.isfinite(r)):
            raise SmokeFailure(f"{label}[{index}]: non-finite (device {d}, cpu {r})")
        deviation = abs(d - r) / max(1.0, abs(d), abs(r))
        if deviation > tolerance:
            raise SmokeFailure(f"{label}[{index}]: device {d!r} vs cpu {r!r} "
                               f"(relative {deviation:.3g} > {tolerance:g})")
        worst = max(worst, deviation)
    return worst


def tiny_config(vocabulary_size: int = len(ALPHABET), seed: int = 7) -> TransformerConfig:
    return TransformerConfig(vocabulary_size=vocabulary_size, maximum_context=32, model_width=32,
                             head_count=4, block_count=2, feed_forward_width=64,
                             random_seed=seed)


def argmax(row) -> int:
    return max(range(len(row)), key=row.__getitem__)


# ---- the checks --------------------------------------------------------------------------------


def check_pretraining(backend: str) -> str:
    notes = []
    for attention in ("materialized", "flash"):
        def losses(on: str) -> list[float]:
            config = PretrainingConfig(
                steps=8, context_size=16, batch_size=4, tokenizer_method="byte",
                vocabulary_size=256, model_width=32, head_count=4, block_count=2,
                feed_forward_width=64, evaluation_interval=4, attention=attention, backend=on)
            result = pretrain_text(TEXT, config)
            if result.bundle is None:
                raise SmokeFailure(f"pretraining on {on} returned no model bundle")
            return [m.loss for m in result.metrics if m.phase == "train"]

        device, reference = losses(backend), losses("cpu")
        if len(device) != 8:
            raise SmokeFailure(f"{attention}: {len(device)} training losses, expected 8")
        worst = close(f"{attention} train loss", device, reference, 2e-3)
        if not device[-1] < device[0]:
            raise SmokeFailure(f"{attention}: loss did not fall ({device[0]} -> {device[-1]})")
        notes.append(f"{attention} loss {device[0]:.3f}->{device[-1]:.3f} "
                     f"(max rel dev vs cpu {worst:.1e})")
    return "; ".join(notes)


def check_evaluation(backend: str) -> str:
    with Tokenizer(ALPHABET) as tokenizer, DecoderOnlyTransformer(tiny_config()) as model:
        reference = evaluate_text(model, tokenizer, TEXT[:600], context_size=16, batch_size=4)
        model.to(backend)
        if model.backend != backend:
            raise SmokeFailure(f"model.to({backend!r}) left it on {model.backend}")
        device = evaluate_text(model, tokenizer, TEXT[:600], context_size=16, batch_size=4)
    if device.target_token_count != reference.target_token_count:
        raise SmokeFailure(f"{device.target_token_count} target tokens on the device, "
                           f"{reference.target_token_count} on cpu")
    worst = close("evaluation loss", [device.loss], [reference.loss], 1e-4)
    return f"loss {device.loss:.5f} over {device.target_token_count} tokens (rel dev {worst:.1e})"


def _adapter_training(model, steps: int) -> list[float]:
    losses = []
    model.attach_lora(LoraConfig(rank=4, alpha=8.0, targets=LORA_TARGETS))
    with model.adapter_parameters() as adapters, Adam(adapters, learning_rate=1e-2) as adam:
        for _ in range(steps):
            with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
                losses.append(loss.item())
                loss.backward()
            adam.step()
    return losses


def _flat_logits(model) -> list[float]:
    with model(TOKENS) as logits:
        return logits.tolist()


def _run_lora(on: str, quantize: bool) -> tuple[list[float], float]:
    with DecoderOnlyTransformer(tiny_config()) as model:
        if quantize:
            model.quantize_nf4()
        model.to(on)
        with model.parameters() as base:
            before = base.flat_values() if not quantize else None
        losses = _adapter_training(model, 10)
        if before is not None:
            with model.parameters() as base:
                if base.flat_values() != before:
                    raise SmokeFailure(f"LoRA training on {on} moved the frozen base")
        adapted = _flat_logits(model)
        model.merge_lora()
        merged = _flat_logits(model)
        merge_gap = max(abs(a - b) for a, b in zip(adapted, merged))
    return losses, merge_gap


def _check_adapters(backend: str, quantize: bool) -> str:
    device, device_gap = _run_lora(backend, quantize)
    reference, _ = _run_lora("cpu", quantize)
    worst = close("adapter train loss", device, reference, 2e-3)
    if not device[-1] < device[0] - 0.05:
        raise SmokeFailure(f"adapter training did not lower the loss ({device[0]} -> {device[-1]})")
    if not device_gap <= 1e-4:
        raise SmokeFailure(f"merge_lora changed the logits by {device_gap}")
    return (f"loss {device[0]:.3f}->{device[-1]:.3f} (max rel dev vs cpu {worst:.1e}), "
            f"merge gap {device_gap:.1e}")


def check_lora(backend: str) -> str:
    return _check_adapters(backend, quantize=False)


def check_qlora(backend: str) -> str:
    return _check_adapters(backend, quantize=True)


def check_decode_session(backend: str) -> str:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    steps = 12
    notes = []
    with DecoderOnlyTransformer(tiny_config()) as cpu_model, \
            DecoderOnlyTransformer(tiny_config()) as device_model:
        device_model.to(backend)
        for cache in ("paged", "contiguous"):
            worst = 0.0
            with cpu_model.decode_session(cache=cache, block_size=4) as reference, \
                    device_model.decode_session(cache=cache, block_size=4) as session:
                expected, row = reference.prefill(prompt), session.prefill(prompt)
                worst = max(worst, close(f"{cache} prefill logits", row, expected, 1e-4))
                for step in range(steps):
                    token = argmax(expected)  # the CPU's greedy token, fed to both
                    expected, row = reference.step(token), session.step(token)
                    worst = max(worst, close(f"{cache} step {step} logits", row, expected, 1e-4))
                if session.size != len(prompt) + steps:
                    raise SmokeFailure(f"{cache} session holds {session.size} positions")
            notes.append(f"{cache} {steps} steps (max rel dev {worst:.1e})")
    return "; ".join(notes)


def check_batching(backend: str) -> str:
    prompts = [[1, 2, 3, 4, 5], [7, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1], [10, 20, 30]]
    steps = 10
    worst = 0.0
    with DecoderOnlyTransformer(tiny_config()) as cpu_model, \
            DecoderOnlyTransformer(tiny_config()) as device_model:
        device_model.to(backend)
        with cpu_model.kv_cache_pool(block_size=4, block_count=32) as cpu_pool, \
                device_model.kv_cache_pool(block_size=4, block_count=32) as device_pool:
            pairs = [(cpu_pool.session(), device_pool.session()) for _ in prompts]
            try:
                pending = {}  # session index -> the next tokens to feed
                # The first three start together; the last joins after three steps.
                for index in range(3):
                    pending[index] = prompts[index]
                for step in range(steps):
                    if step == 3:
                        pending[3] = prompts[3]
                    order = sorted(pending)
                    tokens = [pending[i] for i in order]
                    expected = riftco_transformer.decode_batch([pairs[i][0] for i in order],
                                                               tokens)
                    rows = riftco_transformer.decode_batch([pairs[i][1] for i in order], tokens)
                    for i, reference, row in zip(order, expected, rows):
                        worst = max(worst, close(f"batch step {step} session {i}", row,
                                                 reference, 1e-4))
                        pending[i] = [argmax(reference)]
                if device_pool.leased_block_count == 0:
                    raise SmokeFailure("the device pool leased no pages")
            finally:
                for cpu_session, device_session in pairs:
                    cpu_session.close()
                    device_session.close()
        notes = [f"decode_batch over a shared paged pool, {steps} passes (max rel dev {worst:.1e})"]

        # The serving stack: the scheduler's continuous batching over native sessions on cuda.
        with Tokenizer(ALPHABET) as tokenizer:
            engine = NativeEngine(device_model, block_size=4, block_count=32)
            requests = [("hello there", GenerationConfig(max_new_tokens=6)),
                        ("a", GenerationConfig(max_new_tokens=12, temperature=1.0, seed=5)),
                        ("the quick brown fox jumps", GenerationConfig(max_new_tokens=9)),
                        ("zz", GenerationConfig(max_new_tokens=4))]
            with Scheduler(engine, tokenizer, prefill_chunk_tokens=3,
                           close_engine=True) as scheduler:
                handles = [scheduler.submit(tokenizer.encode(prompt), config)
                           for prompt, config in requests]
                results = [handle.result(60.0) for handle in handles]
                for (prompt, config), result in zip(requests, results):
                    count = len(result.generated_token_ids)
                    if count != config.max_new_tokens:
                        raise SmokeFailure(f"request {prompt!r}: {count} tokens, expected "
                                           f"{config.max_new_tokens}")
                capacity = engine.capacity()
                if (capacity.open_stream_count, capacity.leased_block_count) != (0, 0):
                    raise SmokeFailure(f"pages not returned after serving: {capacity}")
                stats = scheduler.stats()
                if stats.completed_count != len(requests) or stats.failed_count:
                    raise SmokeFailure(f"scheduler: {stats}")
                # One request after another would take this many engine steps (prefill chunks
                # of 3, the last one giving the first token, then one step per token).
                sequential = sum(-(-len(prompt) // 3) + config.max_new_tokens - 1
                                 for prompt, config in requests)
                if stats.step_count >= sequential:
                    raise SmokeFailure(f"the scheduler never batched requests together "
                                       f"({stats.step_count} steps, {sequential} one by one)")
        notes.append(f"scheduler served {len(results)} requests in {stats.step_count} batched "
                     f"steps, {sequential} one by one ({stats.decode_row_count} decode rows, "
                     f"{stats.prefill_row_count} prefill chunks)")
    return "; ".join(notes)


CHECKS = {
    "pretraining": check_pretraining,
    "evaluation": check_evaluation,
    "lora": check_lora,
    "qlora": check_qlora,
    "decode_session": check_decode_session,
    "batching": check_batching,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cuda", help="the device backend (default cuda)")
    parser.add_argument("--require-device", action="store_true",
                        help="fail instead of skipping when no CUDA device is visible")
    parser.add_argument("--only", action="append", choices=sorted(CHECKS),
                        help="run only this check (repeatable)")
    arguments = parser.parse_args()
    backend = arguments.backend

    if not backend_available(backend):
        reason = unavailability_reason(backend)
        if reason == NO_DEVICE and not arguments.require_device:
            print(f"SKIP: gpu_smoke: {NO_DEVICE} (backend {backend!r} unavailable)")
            return 0
        print(f"FAIL: gpu_smoke: backend {backend!r} is unavailable: {reason}")
        return 1

    print(f"gpu_smoke: library {os.environ.get('RIFTCO_TRANSFORMER_LIBRARY', '(default search)')}"
          f", backend {backend}")
    outcomes = []
    for name in arguments.only or CHECKS:
        start = time.perf_counter()
        try:
            note = CHECKS[name](backend)
            outcomes.append((name, True))
            print(f"PASS {name} ({time.perf_counter() - start:.1f} s): {note}", flush=True)
        except Exception as error:  # noqa: BLE001 (every failure is reported, then counted)
            outcomes.append((name, False))
            print(f"FAIL {name} ({time.perf_counter() - start:.1f} s): "
                  f"{type(error).__name__}: {error}", flush=True)
            traceback.print_exc()
    failed = [name for name, passed in outcomes if not passed]
    print(f"gpu_smoke: {len(outcomes) - len(failed)} of {len(outcomes)} checks passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
