"""Serve a tiny, briefly trained chat model over HTTP (chat page, OpenAI-compatible API).

Fits a byte tokenizer on a few PlainChat-formatted dialogues (plus every printable ASCII
character, so any ASCII prompt encodes), trains a small decoder-only transformer on them for
``--train-steps`` Adam steps (seconds on one core), and serves it with the continuous-batching
scheduler until Ctrl-C or ``--max-requests`` requests. The model is far too small to be
useful; it shows the plumbing. Open the printed URL for the chat page, or:

    PYTHONPATH=python python3 examples/python/serve_tiny.py --port 8000
    curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}'
"""

from __future__ import annotations

import argparse
import random
import string
import sys

from riftco_transformer import (
    Adam,
    DecoderOnlyTransformer,
    RiftcoTransformerError,
    Tokenizer,
    TransformerConfig,
    cross_entropy,
)
from riftco_transformer.serving import ModelService, PlainChatTemplate, ServingConfig, serve

DIALOGUES = [
    ("hello", "Hello! How can I help you today?"),
    ("what is two plus two?", "Two plus two is four."),
    ("name a colour", "Blue is a colour."),
    ("how are you?", "I am a tiny model, but I am fine, thank you."),
    ("say something short", "Something short."),
    ("what do you do?", "I continue text, one byte at a time."),
]
CONTEXT = 64
LEARNING_RATE = 1e-2
BATCH_SIZE = 8
SEED = 11


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {text}")
    return value


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="bind address [127.0.0.1]")
    parser.add_argument("--port", type=port_number, default=8000, help="0 picks a free port")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-loopback --host (no authentication, no TLS)")
    parser.add_argument("--max-requests", type=positive_int, default=None,
                        help="exit after serving this many requests")
    parser.add_argument("--train-steps", type=non_negative_int, default=200,
                        help="Adam steps before serving (0: random weights) [200]")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128,
                        help="the most tokens one request may ask for")
    parser.add_argument("--kv-cache", choices=("paged", "contiguous"), default="paged",
                        help="the native KV cache, when the library has decode sessions")
    return parser.parse_args()


def build_model(train_steps: int) -> tuple[DecoderOnlyTransformer, Tokenizer]:
    template = PlainChatTemplate()
    corpus = "".join(
        template.render([{"role": "user", "content": prompt},
                         {"role": "assistant", "content": reply}], add_generation_prompt=False)
        for prompt, reply in DIALOGUES
    )
    tokenizer = Tokenizer(corpus + string.printable, method="byte")
    config = TransformerConfig(
        vocabulary_size=tokenizer.vocab_size, maximum_context=CONTEXT, model_width=32,
        head_count=4, block_count=2, feed_forward_width=64, random_seed=SEED,
    )
    model = DecoderOnlyTransformer(config)
    tokens = tokenizer.encode(corpus * 4)
    generator = random.Random(SEED)
    with Adam(model.parameters(), learning_rate=LEARNING_RATE) as optimizer:
        for _ in range(train_steps):
            starts = [generator.randrange(len(tokens) - CONTEXT) for _ in range(BATCH_SIZE)]
            inputs = [tokens[start : start + CONTEXT] for start in starts]
            targets = [tokens[start + 1 : start + CONTEXT + 1] for start in starts]
            with model(inputs) as logits, cross_entropy(logits, targets) as loss:
                loss.backward()
            optimizer.step()
    return model, tokenizer


def main() -> int:
    arguments = parse_arguments()
    try:
        config = ServingConfig(
            host=arguments.host, port=arguments.port, allow_remote=arguments.allow_remote,
            maximum_new_tokens=arguments.max_new_tokens, kv_cache=arguments.kv_cache,
            model_name="riftco-tiny",
        )
    except ValueError as error:
        print(f"serve_tiny: {error}", file=sys.stderr)
        return 2
    try:
        model, tokenizer = build_model(arguments.train_steps)
    except RiftcoTransformerError as error:
        print(f"serve_tiny: {error}", file=sys.stderr)
        return 1
    with model, tokenizer, ModelService(model, tokenizer, config) as service:
        def ready(server) -> None:
            print(f"serve_tiny: serving {service.model_name} ({service.engine.kind} engine) "
                  f"at {server.url}/", flush=True)

        serve(service, max_requests=arguments.max_requests, ready=ready)
    print("serve_tiny: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
