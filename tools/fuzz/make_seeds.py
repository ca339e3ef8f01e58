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
- ``tokenizer_state``: tokenizer states as JSON (byte and BPE);
- ``tokenizer_json``: Hugging Face ``tokenizer.json`` files with a BPE model, written here
  (the ``tokenizers`` package is not needed): byte-level ones with each supported
  pre-tokenizer (GPT-2's ByteLevel, Llama 3's and Qwen 2's Split regexes, SmolLM's Digits),
  merges as "left right" strings or as pairs, added special and non-special tokens (one also
  in ``model.vocab``), and SentencePiece-style ones (``byte_fallback``, the 256 ``<0xXX>``
  tokens, ``<unk>``) with Llama 2's Prepend normalizer, Gemma's Replace only, and an older
  file's Metaspace pre-tokenizer.

The functions ``bundle_samples()`` ... ``tokenizer_json_samples()`` return the same data as
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


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each byte (printable Latin-1
    bytes stand for themselves, the others for U+0100 onwards, in byte order)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra = iter(range(0x100, 0x200))
    return [chr(byte) if byte in printable else chr(next(extra)) for byte in range(256)]


# Merges over GPT-2 symbols ("\u0120" is the byte-level space): each part is a byte symbol or an
# earlier merge's result.
_BYTE_LEVEL_MERGES = [
    ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "t"), ("\u0120t", "h"),
    ("\u0120th", "e"), ("o", "r"), ("w", "or"), ("wor", "l"), ("worl", "d"), ("\u0120", "wor"),
    ("1", "2"), ("12", "3"), ("\u0120", "\u0120"),
]
_SPLIT_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_QWEN2 = _SPLIT_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def _byte_level_document(pre_tokenizer: dict, pairs: bool, ignore_merges: bool = False) -> dict:
    vocab = {symbol: byte for byte, symbol in enumerate(byte_level_alphabet())}
    for left, right in _BYTE_LEVEL_MERGES:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)  # also an added token (real files list it twice)
    end = vocab["<|endoftext|>"]
    model = {
        "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
        "ignore_merges": ignore_merges, "vocab": vocab,
        "merges": [[left, right] if pairs else f"{left} {right}"
                   for left, right in _BYTE_LEVEL_MERGES],
    }
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": end, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
            {"id": end + 1, "content": "<|im_start|>", "special": True},
            {"id": end + 2, "content": "<|im_end|>", "special": True},
            {"id": end + 3, "content": "<tool>", "special": False},
        ],
        "normalizer": None, "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": model,
    }


def _split_then_byte_level(regex: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}


def _sentencepiece_document(normalizer, pre_tokenizer) -> dict:
    words = ["\u2581", "h", "e", "l", "o", "t", "w", "r", "d", "he", "ll", "hell", "hello",
             "\u2581hello", "\u2581t", "\u2581th", "\u2581the", "or", "wor", "\u2581wor"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *words]
    merges = ["h e", "l l", "he ll", "hell o", "\u2581 hello", "\u2581 t", "\u2581t h",
              "\u2581th e", "o r", "w or", "\u2581 wor"]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": index, "content": text, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for index, text in enumerate(tokens[:3])],
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {text: index for index, text in enumerate(tokens)}, "merges": merges},
    }


def tokenizer_json_documents() -> list[tuple[str, dict]]:
    """Valid tokenizer.json documents (parsed), one per supported shape."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    prepend = {"type": "Prepend", "prepend": "\u2581"}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return [
        ("byte_level_gpt2", _byte_level_document(byte_level, pairs=False)),
        ("byte_level_llama3", _byte_level_document(_split_then_byte_level(_SPLIT_LLAMA3),
                                                   pairs=True, ignore_merges=True)),
        ("byte_level_qwen2", _byte_level_document(_split_then_byte_level(_SPLIT_QWEN2),
                                                  pairs=False)),
        ("byte_level_smollm", _byte_level_document({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}, pairs=True)),
        ("sentencepiece_llama2", _sentencepiece_document(
            {"type": "Sequence", "normalizers": [prepend, replace]}, None)),
        ("sentencepiece_gemma", _sentencepiece_document(replace, None)),
        ("sentencepiece_metaspace", _sentencepiece_document(None, {
            "type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True,
            "prepend_scheme": "always"})),
    ]


def tokenizer_json_samples() -> list[tuple[str, bytes]]:
    return [(f"{name}.json", json.dumps(document, indent=1).encode("utf-8"))
            for name, document in tokenizer_json_documents()]


SAMPLES = {
    "bundle": bundle_samples,
    "checkpoint": checkpoint_samples,
    "safetensors": safetensors_samples,
    "jsonl": jsonl_samples,
    "tokenizer_state": tokenizer_state_samples,
    "tokenizer_json": tokenizer_json_samples,
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
