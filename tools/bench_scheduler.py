#!/usr/bin/env python3
"""Aggregate decode throughput through the continuous-batching scheduler with 1, 4 and 8
concurrent streams (riftco_transformer.serving.Scheduler over NativeEngine: one shared paged
KV pool, each scheduler step one native batched decode over every active stream, greedy
sampling in Python per stream).

Workloads are the PyTorch yardstick's shapes (tiny, small, gpt2; random init, fp32). The
tokenizer is a synthetic BPE state with exactly the model's vocabulary (the scheduler decodes
every token to text, as a server does), so V - 256 arbitrary merge rules. Each run submits S
requests of a --prompt-token prompt and --gen new tokens at once and times, from each
request's first token to the last token of all, the tokens generated after each request's
first (the decode phase); it also reports end-to-end tokens/s (prefill included). The figure
is the median over --reps runs; the ratio is against 1 stream in the same process.

    RIFTCO_TRANSFORMER_LIBRARY=build/release/libriftco_transformer_c.so.2 PYTHONPATH=python \\
        python3 tools/bench_scheduler.py --config small --threads 2

This is a report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

CONFIGS = {
    "tiny": dict(vocabulary_size=256, maximum_context=128, model_width=128, head_count=4,
                 block_count=4, feed_forward_width=512),
    "small": dict(vocabulary_size=8192, maximum_context=256, model_width=512, head_count=8,
                  block_count=6, feed_forward_width=2048),
    "gpt2": dict(vocabulary_size=50257, maximum_context=1024, model_width=768, head_count=12,
                 block_count=12, feed_forward_width=3072),
}


def synthetic_tokenizer(tokenizer_class, vocabulary: int):
    rules = []
    for index in range(vocabulary - 256):
        left, right = divmod(index, 256)
        rules.append((left % 256, right, 256 + index))
    return tokenizer_class.from_state("bpe", merge_rules=rules)


def run_once(scheduler, config_class, streams: int, prompt: list[int], generate: int):
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def recorder(stream: int):
        def on_event(event) -> None:
            now = time.perf_counter()
            with lock:
                first.setdefault(stream, now)
                last[stream] = now
                counts[stream] = counts.get(stream, 0) + 1
        return on_event

    start = time.perf_counter()
    handles = []
    for stream in range(streams):
        ids = list(prompt)
        ids[0] = (ids[0] + 31 * stream) % 256  # distinct streams
        handles.append(scheduler.submit(ids, config_class(max_new_tokens=generate),
                                        on_event=recorder(stream)))
    for handle in handles:
        handle.result(timeout=600)
    end = time.perf_counter()
#The decode phase : every token after each stream 's first, from the first stream' s first
#token to the last token of all.
    decode_tokens = sum(counts[s] - 1 for s in range(streams))
    return {
        "end_to_end_tokens_per_s": streams * generate / (end - start),
        "decode_tokens_per_s": decode_tokens / (max(last.values()) - min(first.values())),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="small", choices=sorted(CONFIGS))
    parser.add_argument("--streams", default="1,4,8")
    parser.add_argument("--prompt", default=16, type=int)
    parser.add_argument("--gen", default=64, type=int)
    parser.add_argument("--reps", default=3, type=int)
    parser.add_argument("--threads", default=2, type=int)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    os.environ.setdefault("RIFTCO_TRANSFORMER_NUM_THREADS", str(args.threads))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from riftco_transformer import DecoderOnlyTransformer, Tokenizer, TransformerConfig, cpu_info
    from riftco_transformer.serving import GenerationConfig, NativeEngine, Scheduler

    shape = CONFIGS[args.config]
    model = DecoderOnlyTransformer(TransformerConfig(**shape, random_seed=1234))
    tokenizer = synthetic_tokenizer(Tokenizer, shape["vocabulary_size"])
    streams = [int(s) for s in args.streams.split(",")]
    per_stream = args.prompt + args.gen
    blocks = max(streams) * -(-min(per_stream, shape["maximum_context"]) // 16)
    engine = NativeEngine(model, kv_cache="paged", block_size=16,
                          block_count=max(blocks, -(-shape["maximum_context"] // 16)))
    scheduler = Scheduler(engine, tokenizer, max_active_requests=max(streams),
                          prefill_chunk_tokens=256)
    prompt = [(7 * i) % 256 for i in range(args.prompt)]
    print(f"config {args.config}; {cpu_info()}; prompt {args.prompt}, {args.gen} new tokens "
          f"per stream, greedy; median of {args.reps}")
    results = {}
    try:
        run_once(scheduler, GenerationConfig, 1, prompt, min(8, args.gen))  # warm-up
        for count in streams:
            runs = [run_once(scheduler, GenerationConfig, count, prompt, args.gen)
                    for _ in range(args.reps)]
            results[count] = {
key: statistics.median(r[key] for r in runs) for key in runs[0]}
    finally:
        scheduler.close()
        engine.close()
        model.close()
    single = results.get(1)
    print(f"{'streams':>7} {'decode tok/s':>13} {'vs 1':>6} {'end-to-end tok/s':>17}")
    for count, figures in results.items():
        ratio = figures["decode_tokens_per_s"] / single["decode_tokens_per_s"] if single else 0
        print(f"{count:>7} {figures['decode_tokens_per_s']:>13.1f} {ratio:>5.2f}x "
              f"{figures['end_to_end_tokens_per_s']:>17.1f}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"config": args.config, "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
