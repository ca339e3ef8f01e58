"""Llama 3 GGUF files carry RoPE frequency factors (rope_freqs.weight, C ABI 2.11): a model
loaded from one keeps them through the library, a bundle and a training checkpoint, so a
fine-tuned Llama 3 reopens with the same logits; the config rules name the field."""
from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from riftco_transformer import LlamaMistralConfig, LlamaMistralTransformer
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.native.pretrained_tokenizer import PretrainedTokenizer

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY / "tools" / "fuzz"))
import gguf_seeds  # noqa: E402  (tools/fuzz/gguf_seeds.py: struct-only GGUF writer)

# Divisors of the 4 frequencies of a head width of 8 (Llama 3's bands: kept, blended, divided).
FACTORS = (1.0, 1.0, 2.75, 8.0)


def llama3_gguf(path: Path, factors=FACTORS) -> Path:
    """A tiny F32 Llama GGUF (D=16, Hq=2, Hkv=1, d=8, F=24, V=256, 2 blocks) with
    rope_freqs.weight holding `factors`."""
    rng = random.Random(11)
    d_model, hq, hkv, width, ff, vocabulary, blocks = 16, 2, 1, 8, 24, 256, 2
    tensors = []

    def tensor(name, *dims, values=None):  # dims ne0 first, GGUF order
        count = 1
        for dim in dims:
            count *= dim
        values = values if values is not None else [rng.uniform(-0.5, 0.5) for _ in range(count)]
        tensors.append((name, list(dims), 0, struct.pack(f"<{count}f", *values)))

    tensor("token_embd.weight", d_model, vocabulary)
    for i in range(blocks):
        b = f"blk.{i}."
        tensor(b + "attn_norm.weight", d_model)
        tensor(b + "attn_q.weight", d_model, hq * width)
        tensor(b + "attn_k.weight", d_model, hkv * width)
        tensor(b + "attn_v.weight", d_model, hkv * width)
        tensor(b + "attn_output.weight", hq * width, d_model)
        tensor(b + "ffn_norm.weight", d_model)
        tensor(b + "ffn_gate.weight", d_model, ff)
        tensor(b + "ffn_up.weight", d_model, ff)
        tensor(b + "ffn_down.weight", ff, d_model)
    tensor("output_norm.weight", d_model)
    tensor("output.weight", d_model, vocabulary)
    tensor("rope_freqs.weight", width // 2, values=list(factors))
    STR, U32, F32 = gguf_seeds.STR, gguf_seeds.U32, gguf_seeds.F32
    metadata = [("general.architecture", STR, "llama"), ("llama.context_length", U32, 64),
                ("llama.embedding_length", U32, d_model), ("llama.block_count", U32, blocks),
                ("llama.feed_forward_length", U32, ff), ("llama.attention.head_count", U32, hq),
                ("llama.attention.head_count_kv", U32, hkv),
                ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
                ("llama.rope.freq_base", F32, 500000.0)]
    path.write_bytes(gguf_seeds.gguf_file(metadata, tensors))
    return path


def byte_tokenizer() -> PretrainedTokenizer:
    return PretrainedTokenizer.from_vocabulary([f"<{byte}>" for byte in range(256)])


def logits_of(model, tokens):
    with model(tokens) as variable:
        return variable.tolist()


TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


def test_a_gguf_models_frequency_factors_survive_a_bundle(tmp_path):
    path = llama3_gguf(tmp_path / "llama3.gguf")
    with LlamaMistralTransformer.from_gguf(str(path)) as model:
        config = model.config
        assert config.rope_scaling == "frequency_factors"
        assert config.rope_frequency_factors == FACTORS
        logits = logits_of(model, TOKENS)
        bundle = ModelBundle.capture(model, byte_tokenizer(), "pretraining")
    assert bundle.manifest["config"]["rope_frequency_factors"] == list(FACTORS)
    loaded = ModelBundle.load(bundle.save(tmp_path / "llama3.rift"))
    assert loaded.config == config
    with loaded.instantiate() as runtime:
        assert runtime.model.config == config
        runtime.model.set_full_sequence_attention("flash")  # as a GGUF file loads
        assert logits_of(runtime.model, TOKENS) == logits
    inspected = subprocess.run(
        [sys.executable, "-m", "riftco_transformer", "inspect", str(tmp_path / "llama3.rift")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY / "python")})
    assert inspected.returncode == 0, inspected.stderr
    assert "rope         theta=500000 frequency_factors=[1, 1, 2.75, 8]" in inspected.stdout
    # The factors matter: the same weights with the factors set to 1 give other logits.
    with LlamaMistralTransformer.from_gguf(
            str(llama3_gguf(tmp_path / "plain.gguf", factors=(1.0,) * 4))) as plain:
        assert logits_of(plain, TOKENS) != logits


def test_a_training_checkpoint_of_a_gguf_model_keeps_its_factors(tmp_path):
    from riftco_transformer import Adam, AdamOptions
    from riftco_transformer.checkpoints import TrainingCheckpoint, capture_training_checkpoint

    with LlamaMistralTransformer.from_gguf(str(llama3_gguf(tmp_path / "l.gguf"))) as model:
        with model.parameters() as parameters:
            adam = Adam(parameters, AdamOptions())
            checkpoint = capture_training_checkpoint(model, adam, byte_tokenizer())
        loaded = TrainingCheckpoint.load(checkpoint.save(tmp_path / "checkpoint.ckpt"))
        loaded.check_model(model)  # the same config, factors included
    other = llama3_gguf(tmp_path / "other.gguf", factors=(1.0, 1.0, 2.0, 8.0))
    with LlamaMistralTransformer.from_gguf(str(other)) as different:
        with pytest.raises(ValueError, match="rope_frequency_factors"):
            loaded.check_model(different)
    # A checkpoint without the factors (no scaling recorded) refuses a model that has them.
    with LlamaMistralTransformer.from_gguf(str(other)) as scaled:
        config = replace(scaled.config, rope_scaling="none", rope_frequency_factors=())
    with LlamaMistralTransformer(config) as plain:
        with plain.parameters() as parameters:
            unscaled = capture_training_checkpoint(plain, Adam(parameters, AdamOptions()),
                                                   byte_tokenizer())
    with LlamaMistralTransformer.from_gguf(str(other)) as scaled:
        difference = r"rope_frequency_factors = \[1.0, 1.0, 2.0, 8.0\], the checkpoint has \[\]"
        with pytest.raises(ValueError, match=difference):
            unscaled.check_model(scaled)


def test_frequency_factor_rules_name_the_field():
    dims = dict(vocabulary_size=256, maximum_context=32, model_width=16, query_head_count=2,
                key_value_head_count=1, block_count=1, feed_forward_width=8)
    with pytest.raises(ValueError, match=r"rope_frequency_factors\[1\] must be finite and > 0"):
        LlamaMistralConfig(**dims, rope_scaling="frequency_factors",
                           rope_frequency_factors=(1.0, -2.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="exactly with rope_scaling 'frequency_factors'"):
        LlamaMistralConfig(**dims, rope_frequency_factors=(1.0, 1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="exactly with rope_scaling 'frequency_factors'"):
        LlamaMistralConfig(**dims, rope_scaling="frequency_factors")
    with pytest.raises(TypeError, match="rope_frequency_factors must be a sequence"):
        LlamaMistralConfig(**dims, rope_scaling="frequency_factors", rope_frequency_factors="1")
    from riftco_transformer import RiftcoTransformerError

    # Three factors for a head width of 8: the library's count rule names the field.
    with pytest.raises(RiftcoTransformerError, match="frequency_factors"):
        LlamaMistralTransformer(LlamaMistralConfig(
            **dims, rope_scaling="frequency_factors", rope_frequency_factors=(1.0, 2.0, 3.0)))
