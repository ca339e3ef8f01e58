#!/usr/bin/env python3
"""Write valid seed inputs for the loader fuzzers (tools/fuzz/fuzz_loaders.py).

Usage::

    RIFTCO_TRANSFORMER_LIBRARY=build/release/libriftco_transformer_c.so.2 PYTHONPATH=python \\
        python tools/fuzz/make_seeds.py OUT_DIR [--target TARGET ...]

For each target it makes ``OUT_DIR/<target>/`` and writes files that the target's loader
accepts, all made by the package itself (so they are valid by construction):

- ``bundle``: ``.rift`` bundles from :meth:`ModelBundle.capture` of tiny models (a byte and a
  BPE tokenizer, with and without lineage/metadata);
- ``checkpoint``: ``.riftckpt`` checkpoints after one Adam step (model scope with batch
  source and trainer state, and adapter scope with a LoRA adapter);
- ``safetensors``: files from :func:`encode_safetensors` (several tensors, metadata, a 0-d
  and a zero-size tensor, an empty file);
- ``jsonl``: instruction JSONL texts of both shapes;
- ``tokenizer_state``: tokenizer states as JSON (byte and BPE).

The functions ``bundle_samples()`` ... ``tokenizer_state_samples()`` return the same data as
``(name, bytes)`` pairs; the fuzz harness imports them to get valid samples to mutate.
Everything is deterministic: running the script twice writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CORPUS = b"hello world, the quick brown fox jumps over the lazy dog. hello again!\n" * 3


def _tiny_model(tokenizer, seed: int = 1):
    from riftco_transformer import DecoderOnlyTransformer, TransformerConfig

    return DecoderOnlyTransformer(
        TransformerConfig(
            vocabulary_size=tokenizer.vocab_size,
            maximum_context=4,
            model_width=4,
            head_count=1,
            block_count=1,
            feed_forward_width=4,
            random_seed=seed,
        )
    )


def _tokenizers():
    from riftco_transformer import Tokenizer

    return [
        ("byte", Tokenizer(b"abc")),
        ("byte_corpus", Tokenizer(CORPUS)),
        ("bpe", Tokenizer(CORPUS, method="bpe", vocabulary_size=264)),
    ]


def bundle_samples() -> list[tuple[str, bytes]]:
    from riftco_transformer.artifacts import ModelBundle

    samples = []
    for name, tokenizer in _tokenizers():
        with tokenizer, _tiny_model(tokenizer) as model:
            base = ModelBundle.capture(model, tokenizer, "pretrained")
            samples.append((f"{name}.rift", base.to_bytes()))
            if name == "byte":
                child = ModelBundle.capture(
                    model,
                    tokenizer,
                    "fine_tuned",
                    parent_artifact_id=base.artifact_id,
                    metadata={"note": "seed", "steps": 1, "loss": 0.5, "tags": ["a", None]},
                )
                samples.append((f"{name}_child.rift", child.to_bytes()))
    return samples


def _ids(tokenizer):
    return tokenizer.encode_to_array(CORPUS)


def checkpoint_samples() -> list[tuple[str, bytes]]:
    from riftco_transformer import Adam, LoraConfig
    from riftco_transformer.batching import RandomWindowBatchSource
    from riftco_transformer.checkpoints import capture_training_checkpoint
    from riftco_transformer.training import CausalLanguageModelTrainer, TrainingLoopConfig

    samples = []
    for name, tokenizer in _tokenizers()[::2]:  # byte "abc" and BPE
        with tokenizer:
            ids = _ids(tokenizer) if name == "bpe" else tokenizer.encode_bytes(b"abcabcabcab")
            # Model scope, with batch source and trainer state.
            with _tiny_model(tokenizer) as model, Adam(model.parameters(), learning_rate=1e-2) as adam:
                source = RandomWindowBatchSource(ids, 2, 4, 7)
                trainer = CausalLanguageModelTrainer(model, adam)
                trainer.run(source, TrainingLoopConfig(1))
                checkpoint = capture_training_checkpoint(model, adam, tokenizer, source, trainer)
                samples.append((f"{name}_model.riftckpt", checkpoint.to_bytes()))
                # Without tokenizer, source or trainer (the optional parts are null).
                bare = capture_training_checkpoint(model, adam, metadata={"run": name})
                samples.append((f"{name}_bare.riftckpt", bare.to_bytes()))
        # Adapter scope: a LoRA adapter on the attention projections.
        if name == "byte":
            with tokenizer.__class__(b"abc") as again, _tiny_model(again) as model:
                model.attach_lora(LoraConfig(rank=1, alpha=2.0))
                with Adam(model.adapter_parameters(), learning_rate=1e-2) as adam:
                    source = RandomWindowBatchSource(again.encode_bytes(b"abcabcabcab"), 2, 4, 3)
                    trainer = CausalLanguageModelTrainer(model, adam)
                    trainer.run(source, TrainingLoopConfig(1))
                    checkpoint = capture_training_checkpoint(model, adam, again, source, trainer)
                    samples.append(("byte_lora.riftckpt", checkpoint.to_bytes()))
    return samples


def safetensors_samples() -> list[tuple[str, bytes]]:
    from array import array

    from riftco_transformer.interchange.safetensors import encode_safetensors

    return [
        (
            "two.safetensors",
            encode_safetensors(
                {"weight": ((2, 3), array("f", [0.5, -1, 2, 3, 4, 5])), "bias": ((3,), [1, 2, 3])}
            ),
        ),
        (
            "metadata.safetensors",
            encode_safetensors(
                {"scalar": ((), [7.0]), "empty": ((0, 4), []), "row": ((1, 2), [1.5, -2.5])},
                metadata={"format": "pt", "note": "\u00e9t\u00e9"},
            ),
        ),
        ("none.safetensors", encode_safetensors({})),
    ]


JSONL_TEXTS = [
    '{"prompt": "What is 2 + 2?", "response": "4"}\n',
    '{"prompt": "Hi", "response": "Hello", "id": 3}\n\n{"prompt": "a", "response": "b"}\r\n',
    '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": '
    '"Hi"}, {"role": "assistant", "content": "Hello"}]}\n',
    '\ufeff{"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": '
    '"caf\\u00e9 \\ud83d\\ude00"}]}\n   \n{"prompt": "x", "response": "y"}',
]


def jsonl_samples() -> list[tuple[str, bytes]]:
    return [(f"example_{index}.jsonl", text.encode("utf-8")) for index, text in enumerate(JSONL_TEXTS)]


def tokenizer_state_samples() -> list[tuple[str, bytes]]:
    states = [
        ("byte_abc", {"method": "byte", "byte_vocabulary": [97, 98, 99]}),
        ("byte_all", {"method": "byte", "byte_vocabulary": list(range(256))}),
        ("byte_shuffled", {"method": "byte", "byte_vocabulary": [200, 3, 0, 255, 17]}),
        ("bpe_empty", {"method": "bpe", "merge_rules": []}),
        ("bpe_chain", {"method": "bpe", "merge_rules": [[97, 98, 256], [256, 99, 257], [257, 257, 258]]}),
    ]
    from riftco_transformer import Tokenizer

    with Tokenizer(CORPUS, method="bpe", vocabulary_size=280) as trained:
        rules = [list(rule) for rule in trained.merge_rules]
    states.append(("bpe_trained", {"method": "bpe", "merge_rules": rules}))
    return [(f"{name}.json", json.dumps(state).encode("utf-8")) for name, state in states]


SAMPLES = {
    "bundle": bundle_samples,
    "checkpoint": checkpoint_samples,
    "safetensors": safetensors_samples,
    "jsonl": jsonl_samples,
    "tokenizer_state": tokenizer_state_samples,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory to create <target>/ seed folders in")
    parser.add_argument(
        "--target", action="append", choices=sorted(SAMPLES), help="only these targets (repeatable)"
    )
    parser.add_argument(
        "--flat", action="store_true", help="write the files into OUT_DIR itself (one target only)"
    )
    arguments = parser.parse_args(argv)
    targets = arguments.target or list(SAMPLES)
    if arguments.flat and len(targets) != 1:
        parser.error("--flat needs exactly one --target")
    for target in targets:
        directory = arguments.out_dir if arguments.flat else arguments.out_dir / target
        directory.mkdir(parents=True, exist_ok=True)
        samples = SAMPLES[target]()
        for name, data in samples:
            (directory / name).write_bytes(data)
        print(f"{target}: {len(samples)} seeds in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
