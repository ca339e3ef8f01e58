"""Pretrain a tiny transformer on one text, then fine-tune it on another: full, LoRA or QLoRA.

The fine-tuning workflow of the Python client in one screen:

1. pretrain every parameter on --text for --pretrain-steps;
2. fine-tune on --fine-tune-text with --fine-tuning-method:
   - ``full``: Adam over every parameter;
   - ``lora``: attach low-rank adapters (--lora-rank, --lora-alpha) to every projection, freeze
     the base and train only the adapters;
   - ``qlora``: pack the projections as 4-bit NF4 first (--nf4-block-size, double-quantized
     scales), then the same as ``lora``; the packed base is decoded inside the kernels;
3. merge the adapters (LoRA/QLoRA), which leaves an ordinary dense float32 model.

It prints the held-out loss on the fine-tuning text before and after fine-tuning (the tail
of that text is held out), the trainable parameter count, and for QLoRA the packed memory.

    PYTHONPATH=python python3 examples/python/fine_tune_tiny.py --fine-tuning-method qlora
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tiny import (  # noqa: E402 (the example beside this one)
    BUILT_IN_TEXT,
    positive_int,
    random_batch,
    split_tokens,
    validation_loss,
)

from riftco_transformer import (  # noqa: E402
    Adam,
    DecoderOnlyTransformer,
    LoraConfig,
    LORA_TARGETS,
    RiftcoTransformerError,
    Tokenizer,
    TransformerConfig,
    cross_entropy,
)

FINE_TUNE_TEXT = (
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money "
    "in my purse, and nothing particular to interest me on shore, I thought I would sail about "
    "a little and see the watery part of the world.\n"
)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default=BUILT_IN_TEXT, help="the pretraining text")
    parser.add_argument("--fine-tune-text", default=FINE_TUNE_TEXT)
    parser.add_argument("--fine-tuning-method", choices=("full", "lora", "qlora"), default="lora")
    parser.add_argument("--pretrain-steps", type=positive_int, default=30)
    parser.add_argument("--steps", type=positive_int, default=30, help="fine-tuning steps")
    parser.add_argument("--context", type=positive_int, default=16)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--lora-rank", type=positive_int, default=4)
    parser.add_argument("--lora-alpha", type=float, default=8.0)
    parser.add_argument("--nf4-block-size", type=positive_int, default=64)
    return parser.parse_args()


def train_steps(model, parameters, tokens, arguments, steps, seed) -> float:
    generator = random.Random(seed)
    loss = float("nan")
    with Adam(parameters, learning_rate=arguments.learning_rate) as optimizer:
        for _ in range(steps):
            inputs, targets = random_batch(tokens, arguments.batch_size, arguments.context, generator)
            with model(inputs) as logits, cross_entropy(logits, targets) as loss_variable:
                loss = loss_variable.item()
                loss_variable.backward()
            optimizer.step()
    return loss


def run(arguments: argparse.Namespace) -> None:
    # One byte-level BPE over both texts, so the fine-tuning text encodes with the same ids.
    tokenizer = Tokenizer(arguments.text + arguments.fine_tune_text, method="bpe",
                          vocabulary_size=300, minimum_pair_frequency=2)
    pretraining = tokenizer.encode(arguments.text)
    fine_tuning, held_out = split_tokens(tokenizer.encode(arguments.fine_tune_text), 0.25,
                                         arguments.context)
    held_out_batches = [random_batch(held_out, arguments.batch_size, arguments.context,
                                     random.Random(17))]
    config = TransformerConfig(vocabulary_size=tokenizer.vocab_size,
                               maximum_context=arguments.context, model_width=32, head_count=4,
                               block_count=2, feed_forward_width=64, random_seed=7)
    with DecoderOnlyTransformer(config) as model:
        with model.parameters() as parameters:
            loss = train_steps(model, parameters, pretraining, arguments,
                               arguments.pretrain_steps, 1)
        print(f"fine_tune_tiny: pretrained {arguments.pretrain_steps} steps, train loss {loss:.4f}")
        before = validation_loss(model, held_out_batches)

        method = arguments.fine_tuning_method
        if method == "qlora":
            model.quantize_nf4(block_size=arguments.nf4_block_size, double_quantization=True)
            memory = model.quantized_memory
            print(f"qlora: {memory.weight_count} projections packed, "
                  f"{memory.resident_payload_bytes} bytes resident for "
                  f"{memory.fp32_equivalent_bytes} float32 bytes "
                  f"({memory.resident_payload_bytes / memory.fp32_equivalent_bytes:.3f}x)")
        if method != "full":
            model.attach_lora(LoraConfig(rank=arguments.lora_rank, alpha=arguments.lora_alpha,
                                         targets=tuple(LORA_TARGETS)))
        trainable = model.parameters() if method == "full" else model.adapter_parameters()
        with trainable:
            print(f"{method}: {trainable.total_numel} trainable parameters")
            loss = train_steps(model, trainable, fine_tuning, arguments, arguments.steps, 2)
        after = validation_loss(model, held_out_batches)
        if method != "full":
            model.merge_lora()  # a dense float32 model again, ready to save or serve
        merged = validation_loss(model, held_out_batches)
        print(f"{method}: held-out loss {before:.4f} -> {after:.4f} (after merge {merged:.4f}), "
              f"last train loss {loss:.4f}")
    tokenizer.close()


def main() -> None:
    try:
        run(parse_arguments())
    except RiftcoTransformerError as error:
        raise SystemExit(f"fine_tune_tiny: {error}") from None


if __name__ == "__main__":
    main()
