"""The rotary decoder's families from Python (C ABI 2.10): presets, the config's new fields
through the ABI and back, bundles that reopen with the same logits, and `riftco inspect` on
them. Logits against Hugging Face transformers and llama.cpp:
tests/oracle/decoder_families_parity.py; the C++ rules: tests/test_decoder_families.cpp."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from riftco_transformer import LlamaMistralConfig, LlamaMistralTransformer
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.native.pretrained_tokenizer import PretrainedTokenizer

REPOSITORY = __import__("pathlib").Path(__file__).resolve().parents[2]


def forward_values(model, tokens):
    with model(tokens) as variable:
        return variable.tolist()


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table: 256 single-character tokens, one per byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    table = dict(zip(printable, characters))
    return [chr(table[byte]) for byte in range(256)]


DIMENSIONS = dict(vocabulary_size=256, maximum_context=32, model_width=16, query_head_count=4,
                  key_value_head_count=2, block_count=2, feed_forward_width=24)

FAMILIES = {
    "llama": dict(rope_scaling="llama3", rope_scaling_factor=8.0, rope_original_context=16),
    "mistral": dict(sliding_window=4),
    "qwen2": {},
    "qwen3": dict(head_width=6, tie_embeddings=True),
    "gemma3": dict(block_count=6, head_width=6, sliding_window=4, tie_embeddings=True),
    "phi3": dict(sliding_window=4),
}


def preset(architecture: str) -> LlamaMistralConfig:
    return LlamaMistralConfig.preset(architecture, **{**DIMENSIONS, **FAMILIES[architecture]})


def test_presets_set_each_familys_choices_through_the_library():
    assert preset("qwen2").query_key_value_bias and not preset("qwen2").query_key_norm
    assert preset("qwen3").query_key_norm and preset("qwen3").head_width == 6
    gemma = preset("gemma3")
    assert gemma.architecture == "gemma3"
    assert gemma.query_key_norm and gemma.norm_weight_offset and gemma.post_block_norms
    assert gemma.feed_forward_activation == "gelu_tanh"
    assert gemma.embedding_scale == pytest.approx(4.0)
    assert gemma.sliding_window_period == 6 and gemma.rope_local_theta == 10000.0
    llama = preset("llama")
    assert not (llama.query_key_value_bias or llama.query_key_norm or llama.post_block_norms)
    assert llama.rope_scaling == "llama3"


def test_preset_and_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="architecture"):
        LlamaMistralConfig.preset("gemma2", **DIMENSIONS)
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaMistralConfig(**DIMENSIONS, rope_scaling="yarn")
    with pytest.raises(ValueError, match="feed_forward_activation"):
        LlamaMistralConfig(**DIMENSIONS, feed_forward_activation="relu")
    with pytest.raises(ValueError, match="embedding_scale"):
        LlamaMistralConfig(**DIMENSIONS, embedding_scale=-1.0)
    with pytest.raises(TypeError, match="query_key_norm"):
        LlamaMistralConfig(**DIMENSIONS, query_key_norm=1)
    # The library's rules: a window period needs a window; an odd head width.
    from riftco_transformer import RiftcoTransformerError

    with pytest.raises(RiftcoTransformerError, match="sliding_window_period"):
        LlamaMistralTransformer(LlamaMistralConfig(**DIMENSIONS, sliding_window_period=6))
    with pytest.raises(RiftcoTransformerError, match="even head width"):
        LlamaMistralTransformer(LlamaMistralConfig(**DIMENSIONS, head_width=5))


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
def test_every_family_builds_and_its_bundle_reopens_with_the_same_logits(tmp_path, architecture):
    config = preset(architecture)
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    tokens = tokenizer.encode("One decoder for every family, past the window.")[:20]
    with LlamaMistralTransformer(config) as model:
        assert model.config == config
        logits = forward_values(model, tokens)
        with model.parameters() as parameters:
            names = parameters.names
        assert ("blocks.0.attention.query.bias" in names) == config.query_key_value_bias
        assert ("blocks.0.attention.key_norm.scale" in names) == config.query_key_norm
        bundle = ModelBundle.capture(model, tokenizer, "pretraining")
    path = bundle.save(tmp_path / f"{architecture}.rift")
    loaded = ModelBundle.load(path)
    assert loaded.config == config
    with loaded.instantiate() as runtime:
        assert runtime.model.config == config
        assert forward_values(runtime.model, tokens) == logits
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    inspected = subprocess.run([sys.executable, "-m", "riftco_transformer", "inspect", str(path)],
                               capture_output=True, text=True, env=environment, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    assert f"{architecture} Hq=4 Hkv=2 d={config.resolved_head_width}" in inspected.stdout
