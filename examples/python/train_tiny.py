"""Train a tiny decoder-only transformer on a text and report held-out loss.

The whole pipeline of the Python client in one screen: fit a tokenizer on the text, hold out
its last tokens for validation, train with Adam on random windows of the rest, and print the
training loss of every step and the validation loss before training, every --eval-every
steps and at the end.

The tokenizer is fitted on the whole text, validation tail included (a byte tokenizer could
not encode bytes it never saw); the model never trains on the validation tokens.

    PYTHONPATH=python python3 examples/python/train_tiny.py --steps 20 --backend cpu
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque
from pathlib import Path

from riftco_transformer import (
    Adam,
    DecoderOnlyTransformer,
    RiftcoTransformerError,
    Tokenizer,
    TransformerConfig,
    cross_entropy,
)

BUILT_IN_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it "
    "was the season of Light, it was the season of Darkness, it was the spring of hope, it "
    "was the winter of despair, we had everything before us, we had nothing before us, we "
    "were all going direct to Heaven, we were all going direct the other way.\n"
)

MODEL_WIDTH = 16
HEAD_COUNT = 4
BLOCK_COUNT = 1
FEED_FORWARD_WIDTH = 32
MODEL_SEED = 7
LEARNING_RATE = 1e-2
VALIDATION_SEED = 17

Batch = tuple[list[list[int]], list[list[int]]]  # (inputs [B][T], next-token targets [B][T])


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def bpe_vocabulary_size(text: str) -> int:
    value = int(text)
    if not 256 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be in [256, 2**32), got {text}")
    return value


def open_unit_fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--text", help="train on this text (default: a built-in paragraph)")
    source.add_argument("--file", type=Path, help="train on this file's bytes")
    parser.add_argument(
        "--backend", choices=("auto", "cpu", "metal", "cuda", "tpu", "pjrt"), default="auto"
    )
    parser.add_argument("--attention", choices=("materialized", "flash"), default="materialized")
    parser.add_argument(
        "--activation-checkpointing", choices=("disabled", "block"), default="disabled"
    )
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--context", type=positive_int, default=16, help="tokens per window")
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--validation-fraction", type=open_unit_fraction, default=0.1)
    parser.add_argument("--validation-batches", type=positive_int, default=4)
    parser.add_argument("--eval-every", type=positive_int, default=10)
    parser.add_argument("--loss-average-window", type=positive_int, default=10)
    parser.add_argument("--tokenizer", choices=("bpe", "byte"), default="bpe")
    parser.add_argument("--vocab-size", type=bpe_vocabulary_size, default=272)
    parser.add_argument("--min-pair-frequency", type=positive_int, default=2)
    return parser.parse_args()


def split_tokens(tokens: list[int], fraction: float, context: int) -> tuple[list[int], list[int]]:
    """(training tokens, validation tail): the tail holds about ``fraction`` of the tokens and
    at least one window (context + 1 tokens); the training part must hold one window too."""
    window = context + 1
    validation_count = max(window, round(fraction * len(tokens)))
    if len(tokens) - validation_count < window:
        raise SystemExit(
            f"the text has {len(tokens)} tokens: too few for a training window and a "
            f"validation window of {window} tokens each (lower --context or give more text)"
        )
    return tokens[:-validation_count], tokens[-validation_count:]


def random_batch(
    tokens: list[int], batch_size: int, context: int, generator: random.Random
) -> Batch:
    """``batch_size`` windows at uniformly random offsets; targets are inputs shifted by one."""
    starts = [generator.randrange(len(tokens) - context) for _ in range(batch_size)]
    inputs = [tokens[start : start + context] for start in starts]
    targets = [tokens[start + 1 : start + context + 1] for start in starts]
    return inputs, targets


def validation_loss(model: DecoderOnlyTransformer, batches: list[Batch]) -> float:
    """The mean of the batches' mean losses; no backward, and every variable is closed at
    once so the model is not left pinned."""
    total = 0.0
    for inputs, targets in batches:
        with model(inputs) as logits, cross_entropy(logits, targets) as loss:
            total += loss.item()
    return total / len(batches)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def train(arguments: argparse.Namespace) -> None:
    if arguments.file is not None:
        corpus: str | bytes = arguments.file.read_bytes()
    else:
        corpus = arguments.text if arguments.text is not None else BUILT_IN_TEXT

    if arguments.tokenizer == "bpe":
        tokenizer = Tokenizer(
            corpus,
            method="bpe",
            vocabulary_size=arguments.vocab_size,
            minimum_pair_frequency=arguments.min_pair_frequency,
        )
    else:
        tokenizer = Tokenizer(corpus, method="byte")
    data = corpus.encode("utf-8") if isinstance(corpus, str) else corpus
    tokens = tokenizer.encode_bytes(data)
    context = arguments.context
    training_tokens, validation_tokens = split_tokens(
        tokens, arguments.validation_fraction, context
    )

    validation_generator = random.Random(VALIDATION_SEED)
    validation_batches = [
        random_batch(validation_tokens, arguments.batch_size, context, validation_generator)
        for _ in range(arguments.validation_batches)
    ]

    config = TransformerConfig(
        vocabulary_size=tokenizer.vocab_size,
        maximum_context=context,
        model_width=MODEL_WIDTH,
        head_count=HEAD_COUNT,
        block_count=BLOCK_COUNT,
        feed_forward_width=FEED_FORWARD_WIDTH,
        random_seed=MODEL_SEED,
    )
    model = DecoderOnlyTransformer(
        config,
        attention=arguments.attention,
        activation_checkpointing=arguments.activation_checkpointing,
    ).to(arguments.backend)
    optimizer = Adam(model.parameters(), learning_rate=LEARNING_RATE)

    print(
        f"train_tiny: backend={model.backend} attention={model.full_sequence_attention} "
        f"activation_checkpointing={model.activation_checkpointing} "
        f"tokenizer={tokenizer.method} vocab={tokenizer.vocab_size} "
        f"tokens={len(training_tokens)} train + {len(validation_tokens)} validation "
        f"parameters={model.parameter_count} steps={arguments.steps}"
    )
    loss = validation_loss(model, validation_batches)
    print(f"step 0 validation loss {loss:.4f} perplexity {perplexity(loss):.2f}")

    training_generator = random.Random(MODEL_SEED)
    recent_losses: deque[float] = deque(maxlen=arguments.loss_average_window)
    for step in range(1, arguments.steps + 1):
        inputs, targets = random_batch(
            training_tokens, arguments.batch_size, context, training_generator
        )
        with model(inputs) as logits, cross_entropy(logits, targets) as loss_variable:
            loss = loss_variable.item()
            loss_variable.backward()
        stats = optimizer.step()
        recent_losses.append(loss)
        average = sum(recent_losses) / len(recent_losses)
        print(
            f"step {step} train loss {loss:.4f} average {average:.4f} "
            f"gradient_norm {stats.gradient_norm:.4f} clip_scale {stats.clip_scale:.4f}"
        )
        if step % arguments.eval_every == 0 or step == arguments.steps:
            loss = validation_loss(model, validation_batches)
            print(f"step {step} validation loss {loss:.4f} perplexity {perplexity(loss):.2f}")

    optimizer.close()
    model.close()
    tokenizer.close()


def main() -> None:
    arguments = parse_arguments()
    try:
        train(arguments)
    except RiftcoTransformerError as error:  # e.g. an explicitly requested backend is missing
        raise SystemExit(f"train_tiny: {error}") from None


if __name__ == "__main__":
    main()
