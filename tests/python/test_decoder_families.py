"""The rotary decoder's families from Python (C ABI 2.10; Gemma 2's soft caps: 2.11): presets,
the config's new fields through the ABI and back, bundles that reopen with the same logits,
and `riftco inspect` on them. Logits against Hugging Face transformers and llama.cpp:
tests/oracle/decoder_families_parity.py; the C++ rules: tests/test_decoder_families.cpp."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

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
    "gemma2": dict(block_count=4, head_width=6, sliding_window=4, tie_embeddings=True),
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
    assert gemma.attention_logit_softcap == gemma.final_logit_softcap == 0.0
    gemma2 = preset("gemma2")
    assert gemma2.architecture == "gemma2" and not gemma2.query_key_norm
    assert gemma2.norm_weight_offset and gemma2.post_block_norms
    assert gemma2.feed_forward_activation == "gelu_tanh"
    assert gemma2.embedding_scale == pytest.approx(4.0) and gemma2.attention_scale == 0.0
    assert gemma2.sliding_window_period == 2 and gemma2.rope_local_theta == 0.0
    assert (gemma2.attention_logit_softcap, gemma2.final_logit_softcap) == (50.0, 30.0)
    # Caps that are given are kept (0, not given, takes the preset's).
    given = LlamaMistralConfig.preset("gemma2", **DIMENSIONS, attention_logit_softcap=20.0)
    assert (given.attention_logit_softcap, given.final_logit_softcap) == (20.0, 30.0)
    # Without a window every layer is dense.
    assert LlamaMistralConfig.preset("gemma2", **DIMENSIONS).sliding_window_period == 0
    llama = preset("llama")
    assert not (llama.query_key_value_bias or llama.query_key_norm or llama.post_block_norms)
    assert llama.rope_scaling == "llama3"


def test_preset_and_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="architecture"):
        LlamaMistralConfig.preset("gemma4", **DIMENSIONS)
    for name in ("attention_logit_softcap", "final_logit_softcap"):
        with pytest.raises(ValueError, match=f"{name} must be finite and >= 0"):
            LlamaMistralConfig(**DIMENSIONS, **{name: -1.0})
        with pytest.raises(ValueError, match=name):
            LlamaMistralConfig(**DIMENSIONS, **{name: float("inf")})
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaMistralConfig(**DIMENSIONS, rope_scaling="longrope")
    for name in ("rope_yarn_beta_fast", "rope_yarn_beta_slow", "rope_yarn_attention_factor"):
        with pytest.raises(ValueError, match=f"{name} must be finite and >= 0"):
            LlamaMistralConfig(**DIMENSIONS, rope_scaling="yarn", **{name: -1.0})
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


# ---- GGUF files of the new families (written with the fuzz seeds' standard-library writer) ----

sys.path.insert(0, str(REPOSITORY / "tools" / "fuzz"))
import gguf_seeds  # noqa: E402  (tools/fuzz/gguf_seeds.py: struct-only GGUF writer)

STR, U32, F32, ARR = gguf_seeds.STR, gguf_seeds.U32, gguf_seeds.F32, gguf_seeds.ARR


def family_gguf(path, architecture, blocks=2, head_width=6, extra_metadata=(), drop=(),
                extra_tensors=(), qkv_bias=False, qk_norm=False, post_norms=False,
                fused_phi3=False, value_length=None):
    """A tiny F32 GGUF of `architecture`: D=16, Hq=4, Hkv=2, F=20, V=32, head width 6."""
    import random
    import struct

    rng = random.Random(7)
    d_model, hq, hkv, ff, vocabulary = 16, 4, 2, 20, 32
    q, kv = hq * head_width, hkv * head_width
    tensors = []

    def tensor(name, *dims):  # dims ne0 first, GGUF order
        count = 1
        for dim in dims:
            count *= dim
        tensors.append((name, list(dims), 0,
                        struct.pack(f"<{count}f", *(rng.uniform(-0.5, 0.5) for _ in range(count)))))

    tensor("token_embd.weight", d_model, vocabulary)
    for i in range(blocks):
        b = f"blk.{i}."
        tensor(b + "attn_norm.weight", d_model)
        if fused_phi3:
            tensor(b + "attn_qkv.weight", d_model, q + 2 * kv)
        else:
            tensor(b + "attn_q.weight", d_model, q)
            tensor(b + "attn_k.weight", d_model, kv)
            tensor(b + "attn_v.weight", d_model, kv)
        if qkv_bias:
            tensor(b + "attn_q.bias", q)
            tensor(b + "attn_k.bias", kv)
            tensor(b + "attn_v.bias", kv)
        tensor(b + "attn_output.weight", q, d_model)
        if qk_norm:
            tensor(b + "attn_q_norm.weight", head_width)
            tensor(b + "attn_k_norm.weight", head_width)
        if post_norms:
            tensor(b + "post_attention_norm.weight", d_model)
            tensor(b + "post_ffw_norm.weight", d_model)
        tensor(b + "ffn_norm.weight", d_model)
        if fused_phi3:
            tensor(b + "ffn_up.weight", d_model, 2 * ff)
        else:
            tensor(b + "ffn_gate.weight", d_model, ff)
            tensor(b + "ffn_up.weight", d_model, ff)
        tensor(b + "ffn_down.weight", ff, d_model)
    tensor("output_norm.weight", d_model)
    for name, dims in extra_tensors:
        tensor(name, *dims)
    tensors = [entry for entry in tensors if entry[0] not in drop]
    a = architecture
    metadata = [("general.architecture", STR, a), (f"{a}.context_length", U32, 64),
                (f"{a}.embedding_length", U32, d_model), (f"{a}.block_count", U32, blocks),
                (f"{a}.feed_forward_length", U32, ff), (f"{a}.attention.head_count", U32, hq),
                (f"{a}.attention.head_count_kv", U32, hkv),
                (f"{a}.attention.layer_norm_rms_epsilon", F32, 1e-6),
                (f"{a}.attention.key_length", U32, head_width),
                (f"{a}.attention.value_length", U32, value_length or head_width),
                *extra_metadata]
    path.write_bytes(gguf_seeds.gguf_file(metadata, tensors))
    return path


def load_error(path) -> str:
    from riftco_transformer import RiftcoTransformerError

    with pytest.raises(RiftcoTransformerError) as caught:
        LlamaMistralTransformer.from_gguf(path).close()
    return str(caught.value)


def test_gguf_files_of_each_family_load_with_the_familys_choices(tmp_path):
    with LlamaMistralTransformer.from_gguf(
            family_gguf(tmp_path / "q2.gguf", "qwen2", qkv_bias=True)) as model:
        assert model.config.architecture == "qwen2" and model.config.query_key_value_bias
        assert model.config.head_width == 6
    with LlamaMistralTransformer.from_gguf(
            family_gguf(tmp_path / "q3.gguf", "qwen3", qk_norm=True)) as model:
        assert model.config.query_key_norm and model.config.tie_embeddings
    with LlamaMistralTransformer.from_gguf(
            family_gguf(tmp_path / "phi.gguf", "phi3", fused_phi3=True)) as model:
        assert model.config.architecture == "phi3"
        with model.parameters() as parameters:
            shapes = dict(zip(parameters.names, parameters.shapes))
        assert shapes["blocks.0.attention.query.weight"] == (24, 16)
        assert shapes["blocks.0.feed_forward.gate.weight"] == (20, 16)
    gemma = family_gguf(tmp_path / "g3.gguf", "gemma3", qk_norm=True, post_norms=True,
                        extra_metadata=[("gemma3.attention.sliding_window", U32, 4)])
    with LlamaMistralTransformer.from_gguf(gemma) as model:
        config = model.config
        # GGUF stores Gemma's norms as 1 + w: read as plain RMSNorm weights.
        assert not config.norm_weight_offset and config.post_block_norms
        assert config.feed_forward_activation == "gelu_tanh"
        assert config.sliding_window_period == 6 and config.rope_local_theta == 10000.0
        assert config.embedding_scale == pytest.approx(4.0) and config.attention_scale == 0.0


def gemma2_gguf(path, blocks=2, caps=(), window=4):
    """A tiny Gemma 2 GGUF: Gemma 3's tensors without QK-norm; ``caps`` its soft-cap keys
    (name suffix, value) as F32 metadata."""
    metadata = [(f"gemma2.{key}", F32, value) for key, value in caps]
    if window is not None:
        metadata.append(("gemma2.attention.sliding_window", U32, window))
    return family_gguf(path, "gemma2", blocks=blocks, post_norms=True, extra_metadata=metadata)


def test_gguf_gemma2_loads_with_its_soft_caps(tmp_path):
    path = gemma2_gguf(tmp_path / "g2.gguf", caps=[("attn_logit_softcapping", 20.0),
                                                   ("final_logit_softcapping", 0.25)])
    with LlamaMistralTransformer.from_gguf(path) as model:
        config = model.config
        assert config.architecture == "gemma2" and not config.query_key_norm
        # GGUF stores Gemma's norms as 1 + w: read as plain RMSNorm weights.
        assert not config.norm_weight_offset and config.post_block_norms
        assert config.feed_forward_activation == "gelu_tanh"
        assert config.sliding_window == 4 and config.sliding_window_period == 2
        assert config.rope_local_theta == 0.0 and config.tie_embeddings
        assert config.embedding_scale == pytest.approx(4.0) and config.attention_scale == 0.0
        assert (config.attention_logit_softcap, config.final_logit_softcap) == (20.0, 0.25)
        capped = forward_values(model, [1, 2, 3, 4, 5, 6])
        assert max(abs(value) for value in capped) <= 0.25
    # Absent: the preset's 50 and 30 (what llama.cpp assumes); an explicit 0 turns a cap off.
    with LlamaMistralTransformer.from_gguf(gemma2_gguf(tmp_path / "default.gguf")) as model:
        assert (model.config.attention_logit_softcap, model.config.final_logit_softcap) == \
            (50.0, 30.0)
    off = gemma2_gguf(tmp_path / "off.gguf", caps=[("attn_logit_softcapping", 0.0),
                                                   ("final_logit_softcapping", 0.0)])
    with LlamaMistralTransformer.from_gguf(off) as model:
        assert (model.config.attention_logit_softcap, model.config.final_logit_softcap) == \
            (0.0, 0.0)
        # The same weights uncapped: logits beyond the 0.25 the capped file bounds them by.
        assert max(abs(value) for value in forward_values(model, [1, 2, 3, 4, 5, 6])) > 0.25
    one = gemma2_gguf(tmp_path / "one.gguf", caps=[("final_logit_softcapping", 0.0)])
    with LlamaMistralTransformer.from_gguf(one) as model:
        assert (model.config.attention_logit_softcap, model.config.final_logit_softcap) == \
            (50.0, 0.0)


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "final_logit_softcapping"])
@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_gguf_gemma2_cap_that_is_no_cap_names_the_key_and_file(tmp_path, key, value):
    message = load_error(gemma2_gguf(tmp_path / "bad-cap.gguf", caps=[(key, value)]))
    assert f"gemma2.{key} must be finite and >= 0" in message and "bad-cap.gguf" in message


def test_gguf_gemma2_tensors_are_gemma3s_without_qk_norm(tmp_path):
    extra = family_gguf(tmp_path / "qk.gguf", "gemma2", post_norms=True, qk_norm=True)
    assert "attn_q_norm.weight" in load_error(extra) and "qk.gguf" in load_error(extra)
    missing = family_gguf(tmp_path / "np.gguf", "gemma2", post_norms=False)
    assert "post_attention_norm.weight" in load_error(missing)


def test_gguf_gemma2_27b_scores_with_width_over_heads(tmp_path):
    # 46 blocks is the 27B layout: query_pre_attn_scalar = D/Hq = 4, so the scale is 1/2.
    with LlamaMistralTransformer.from_gguf(gemma2_gguf(tmp_path / "g27.gguf", blocks=46)) as model:
        assert model.config.attention_scale == 0.5
    with LlamaMistralTransformer.from_gguf(gemma2_gguf(tmp_path / "g9.gguf", blocks=42)) as model:
        assert model.config.attention_scale == 0.0


def test_gguf_gemma3_27b_scores_with_width_over_heads(tmp_path):
    # 62 blocks is the 27B layout: query_pre_attn_scalar = D/Hq = 4, so the scale is 1/2.
    path = family_gguf(tmp_path / "g27.gguf", "gemma3", blocks=62, qk_norm=True, post_norms=True)
    with LlamaMistralTransformer.from_gguf(path) as model:
        assert model.config.attention_scale == 0.5


@pytest.mark.parametrize("key, fragment", [
    ("qwen2.embedding_length", "qwen2.embedding_length is 0"),
    ("qwen2.block_count", "qwen2.block_count is 0"),
    ("qwen2.feed_forward_length", "qwen2.feed_forward_length is 0"),
    ("qwen2.attention.head_count", "qwen2.attention.head_count is 0"),
    ("qwen2.attention.head_count_kv", "qwen2.attention.head_count_kv is 0"),
    ("qwen2.context_length", "qwen2.context_length is 0"),
    ("qwen2.attention.key_length", "qwen2.attention.key_length is 0"),
])
def test_a_zero_gguf_dimension_names_its_key(tmp_path, key, fragment):
    path = family_gguf(tmp_path / "zero.gguf", "qwen2", qkv_bias=True)
    data = bytearray(path.read_bytes())
    # The key's u32 value follows its name and the value type (4 bytes).
    name = key.encode()
    at = data.index(len(name).to_bytes(8, "little") + name + (4).to_bytes(4, "little"))
    value_at = at + 8 + len(name) + 4
    data[value_at:value_at + 4] = (0).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    message = load_error(path)
    assert fragment in message and "zero.gguf" in message


@pytest.mark.parametrize("arguments, fragment", [
    (dict(qkv_bias=True, extra_tensors=[("blk.0.extra.weight", (16,))]),
     "tensor 'blk.0.extra.weight' is not part of a qwen2 model of 2 blocks"),
    (dict(qkv_bias=True, extra_tensors=[("output.weight\0", (16, 16))]),
     "tensor 'output.weight\\x00' is not part of a qwen2 model of 2 blocks"),
    (dict(qkv_bias=False), "attn_q.bias"),
    (dict(qkv_bias=True, extra_tensors=[("rope_freqs.weight", (5,))]), "rope_freqs.weight"),
    (dict(qkv_bias=True, extra_tensors=[("rope_factors_long.weight", (3,))]), "LongRoPE"),
    (dict(qkv_bias=True, extra_metadata=[("qwen2.rope.scaling.type", STR, "longrope")]),
     "qwen2.rope.scaling.type 'longrope'"),
    (dict(qkv_bias=True, value_length=8),
     "qwen2.attention.value_length 8 differs from qwen2.attention.key_length 6"),
])
def test_gguf_rules_name_the_tensor_or_key(tmp_path, arguments, fragment):
    path = family_gguf(tmp_path / "bad.gguf", "qwen2", **arguments)
    assert fragment in load_error(path)
    assert "bad.gguf" in load_error(path)
    unknown = family_gguf(tmp_path / "gemma4.gguf", "gemma4")
    assert "general.architecture 'gemma4' is not supported" in load_error(unknown)


# ---- YaRN (C ABI 2.11): the config through the ABI, bundles, inspect and GGUF ----------------

YARN = dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_context=16,
            rope_yarn_beta_fast=8.0, rope_yarn_beta_slow=0.5, rope_yarn_attention_factor=1.25)


def test_a_yarn_config_round_trips_through_the_library_and_a_bundle(tmp_path):
    config = LlamaMistralConfig.preset("qwen2", **DIMENSIONS, **YARN)
    for field, value in YARN.items():
        assert getattr(config, field) == value, field
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    tokens = tokenizer.encode("YaRN past the original context of sixteen tokens.")[:30]
    assert len(tokens) > config.rope_original_context
    with LlamaMistralTransformer(config) as model:
        assert model.config == config
        logits = forward_values(model, tokens)
        bundle = ModelBundle.capture(model, tokenizer, "pretraining")
    # The scaling is applied: the same weights without it give other logits.
    with LlamaMistralTransformer(replace(config, rope_scaling="none")) as plain:
        assert forward_values(plain, tokens) != logits
    assert {name: bundle.manifest["config"][name] for name in YARN} == YARN
    path = bundle.save(tmp_path / "yarn.rift")
    loaded = ModelBundle.load(path)
    assert loaded.config == config
    with loaded.instantiate() as runtime:
        assert forward_values(runtime.model, tokens) == logits
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    inspected = subprocess.run([sys.executable, "-m", "riftco_transformer", "inspect", str(path)],
                               capture_output=True, text=True, env=environment, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    assert ("rope         theta=10000 yarn factor=4 original_context=16 beta_fast=8 "
            "beta_slow=0.5 attention_factor=1.25") in inspected.stdout


def test_yarn_defaults_stay_out_of_the_manifest_and_old_bundles_load(tmp_path):
    """A manifest records only the YaRN fields off their defaults, so a bundle written before
    them (none of the three) loads with the defaults: beta_fast 32, beta_slow 1, the computed
    attention factor (0)."""
    config = LlamaMistralConfig.preset("qwen2", **DIMENSIONS, rope_scaling="yarn",
                                       rope_scaling_factor=2.0, rope_original_context=16)
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    with LlamaMistralTransformer(config) as model:
        bundle = ModelBundle.capture(model, tokenizer, "pretraining")
    record = bundle.manifest["config"]
    assert record["rope_scaling"] == "yarn" and record["rope_scaling_factor"] == 2.0
    assert not {"rope_yarn_beta_fast", "rope_yarn_beta_slow",
                "rope_yarn_attention_factor"} & set(record)
    loaded = ModelBundle.load(bundle.save(tmp_path / "defaults.rift"))
    assert (loaded.config.rope_yarn_beta_fast, loaded.config.rope_yarn_beta_slow,
            loaded.config.rope_yarn_attention_factor) == (32.0, 1.0, 0.0)
    assert loaded.config == config
    with LlamaMistralTransformer(preset("llama")) as model:
        old = ModelBundle.capture(model, tokenizer, "pretraining")
    assert not any(name.startswith("rope_yarn") for name in old.manifest["config"])
    assert ModelBundle.load(old.save(tmp_path / "llama.rift")).config == preset("llama")


def yarn_metadata(architecture="qwen2", **keys):
    """GGUF YaRN metadata under llama.cpp's key names: rope.scaling.<key> for each of
    ``keys`` (a float unless it is original_context_length)."""
    metadata = [(f"{architecture}.rope.scaling.type", STR, "yarn")]
    for key, value in keys.items():
        metadata.append((f"{architecture}.rope.scaling.{key}",
                         U32 if key == "original_context_length" else F32, value))
    return metadata


def test_gguf_yarn_loads_with_its_fields(tmp_path):
    path = family_gguf(tmp_path / "yarn.gguf", "qwen2", qkv_bias=True, extra_metadata=yarn_metadata(
        factor=4.0, original_context_length=16, yarn_beta_fast=8.0, yarn_beta_slow=0.5,
        yarn_attn_factor=0.75, yarn_ext_factor=1.0))
    with LlamaMistralTransformer.from_gguf(path) as model:
        config = model.config
    assert (config.rope_scaling, config.rope_scaling_factor, config.rope_original_context) == (
        "yarn", 4.0, 16)
    assert (config.rope_yarn_beta_fast, config.rope_yarn_beta_slow) == (8.0, 0.5)
    # yarn_attn_factor is transformers' attention_factor as convert_hf_to_gguf writes it.
    assert config.rope_yarn_attention_factor == 0.75
    # rope.scaling.attn_factor multiplies it, or the computed 0.1·ln(factor) + 1 without it.
    extra = family_gguf(tmp_path / "extra.gguf", "qwen2", qkv_bias=True,
                        extra_metadata=yarn_metadata(factor=4.0, original_context_length=16,
                                                     yarn_attn_factor=0.75, attn_factor=2.0))
    with LlamaMistralTransformer.from_gguf(extra) as model:
        assert model.config.rope_yarn_attention_factor == 1.5
    computed = family_gguf(tmp_path / "computed.gguf", "qwen2", qkv_bias=True,
                           extra_metadata=yarn_metadata(factor=4.0, original_context_length=16,
                                                        attn_factor=2.0))
    with LlamaMistralTransformer.from_gguf(computed) as model:
        assert model.config.rope_yarn_attention_factor == pytest.approx(
            2.0 * (0.1 * math.log(4.0) + 1.0), rel=1e-12)
    # Without the optional keys: beta_fast 32, beta_slow 1, the computed attention factor.
    plain = family_gguf(tmp_path / "plain.gguf", "qwen2", qkv_bias=True,
                        extra_metadata=yarn_metadata(factor=4.0, original_context_length=16))
    with LlamaMistralTransformer.from_gguf(plain) as model:
        config = model.config
    assert (config.rope_scaling, config.rope_yarn_beta_fast, config.rope_yarn_beta_slow,
            config.rope_yarn_attention_factor) == ("yarn", 32.0, 1.0, 0.0)


@pytest.mark.parametrize("keys, fragment", [
    (dict(factor=4.0), "qwen2.rope.scaling.original_context_length"),
    (dict(original_context_length=16), "qwen2.rope.scaling.factor"),
    (dict(factor=4.0, original_context_length=16, yarn_ext_factor=0.5),
     "qwen2.rope.scaling.yarn_ext_factor"),
    (dict(factor=4.0, original_context_length=16, yarn_log_multiplier=0.1),
     "qwen2.rope.scaling.yarn_log_multiplier"),
    (dict(factor=4.0, original_context_length=16, yarn_beta_fast=1.0, yarn_beta_slow=2.0),
     "beta_fast"),
    (dict(factor=4.0, original_context_length=16, attn_factor=-1.0),
     "qwen2.rope.scaling.attn_factor must be finite and > 0"),
])
def test_gguf_yarn_that_cannot_be_honoured_names_the_key_and_file(tmp_path, keys, fragment):
    path = family_gguf(tmp_path / "bad-yarn.gguf", "qwen2", qkv_bias=True,
                       extra_metadata=yarn_metadata(**keys))
    message = load_error(path)
    assert fragment in message and "bad-yarn.gguf" in message


# ---- post-training with checkpoints, for every family --------------------------------------

INSTRUCTIONS = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"


def interruption_at(step: int):
    """An exception class and an on_step hook that raises it at ``step`` (a run stopped there,
    after the checkpoints written before it)."""

    class Interrupted(Exception):
        pass

    def interrupt(metric):
        if metric.step == step:
            raise Interrupted

    return Interrupted, interrupt


def family_bundle(architecture: str, maximum_context: int = 256) -> ModelBundle:
    """A random-weight bundle of ``architecture``'s preset: a rotary family of FAMILIES, or
    "gpt2" (the learned-position preset built through the general config, Hkv = Hq). Its
    context holds every tiny instruction example whole (byte tokens: at most 157, or a little
    more in a family's chat template)."""
    if architecture == "gpt2":
        config = LlamaMistralConfig.preset("gpt2", **{**DIMENSIONS, "key_value_head_count": 4})
    else:
        config = preset(architecture)
    config = replace(config, maximum_context=maximum_context)
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    with LlamaMistralTransformer(config) as model:
        return ModelBundle.capture(model, tokenizer, "pretraining")


@pytest.mark.parametrize("architecture, method", [
    ("llama", "full"), ("qwen2", "lora"), ("qwen3", "qlora"), ("gemma2", "lora"),
    ("gemma3", "qlora"), ("phi3", "lora"), ("gpt2", "qlora"),
])
def test_an_interrupted_post_training_resumes_to_the_same_bundle(tmp_path, architecture, method):
    from riftco_transformer.checkpoints import TrainingCheckpoint
    from riftco_transformer.instructions import read_instructions_jsonl
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    base = family_bundle(architecture)
    examples = read_instructions_jsonl(INSTRUCTIONS)[:20]
    config = PostTrainingConfig(steps=6, batch_size=2, backend="cpu",
                                fine_tuning_method=method, learning_rate=1e-2,
                                response_only_loss=True)
    expected = post_train(base, examples, config).bundle
    Interrupted, interrupt = interruption_at(5)
    path = tmp_path / "post.riftckpt"
    with pytest.raises(Interrupted):
        post_train(base, examples, config, on_step=interrupt, checkpoint_path=path,
                   checkpoint_interval=3)
    checkpoint = TrainingCheckpoint.load(path)
    assert checkpoint.global_step == 3
    assert checkpoint.manifest["model"]["config"]["architecture"] == architecture
    resumed = post_train(base, examples, config, resume_from=path)
    assert resumed.bundle.weights == expected.weights
    assert resumed.bundle.config == base.config
    assert expected.weights != base.weights  # the run trained something


def test_a_checkpoint_refuses_a_model_of_the_other_decoder_class(tmp_path):
    from riftco_transformer import Adam, AdamOptions
    from riftco_transformer.checkpoints import capture_training_checkpoint

    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    with LlamaMistralTransformer(preset("qwen3")) as model, model.parameters() as parameters, \
            Adam(parameters, AdamOptions()) as optimizer:
        checkpoint = capture_training_checkpoint(model, optimizer, tokenizer)
        assert checkpoint.manifest["tokenizer"]["method"] == "pretrained"
        with LlamaMistralTransformer(preset("qwen2")) as other:
            with pytest.raises(ValueError, match="config architecture = .qwen2., the checkpoint has .qwen3."):
                checkpoint.check_model(other)
    from riftco_transformer import DecoderOnlyTransformer, TransformerConfig

    with DecoderOnlyTransformer(TransformerConfig(256, 16, 16, 2, 1, 32)) as gpt:
        with pytest.raises(ValueError, match="riftco_decoder_v1 decoder"):
            checkpoint.check_model(gpt)
    with pytest.raises(TypeError, match="DecoderOnlyTransformer or a LlamaMistralTransformer"):
        capture_training_checkpoint(object(), None)


def test_fine_tuning_a_pretrained_model_resumes_exactly(tmp_path):
    from riftco_transformer import load_pretrained
    from riftco_transformer.instructions import read_instructions_jsonl
    from riftco_transformer.post_training import PostTrainingConfig, fine_tune_pretrained

    path = family_bundle("qwen3").save(tmp_path / "qwen3.rift")
    examples = read_instructions_jsonl(INSTRUCTIONS)[:20]
    config = PostTrainingConfig(steps=6, batch_size=2, backend="cpu",
                                fine_tuning_method="qlora", learning_rate=1e-2,
                                response_only_loss=True)

    def tuned_weights(**options):
        with load_pretrained(path) as loaded:
            fine_tune_pretrained(loaded, examples, config, **options)
            with loaded.model.parameters() as parameters:
                return parameters.flat_values()

    expected = tuned_weights()
    Interrupted, interrupt = interruption_at(5)
    checkpoint = tmp_path / "run.riftckpt"
    with pytest.raises(Interrupted):
        tuned_weights(on_step=interrupt, checkpoint_path=checkpoint, checkpoint_interval=3,
                      base_id="qwen3-base")
    assert tuned_weights(resume_from=checkpoint, base_id="qwen3-base") == expected
    with pytest.raises(ValueError, match="not taken while fine-tuning this model"):
        tuned_weights(resume_from=checkpoint, base_id="another-model")


def test_riftco_post_train_model_adapts_every_projection_of_a_plain_feed_forward(tmp_path):
    """`riftco post-train --model` puts LoRA on every block projection by name, whatever the
    preset: on a GPT-2-preset bundle (plain feed-forward) that is expand and project, not the
    gated gate/up/down, and the merged result moves them."""
    from riftco_transformer.artifacts import ModelBundle as Bundle

    base_path = family_bundle("gpt2").save(tmp_path / "gpt2.rift")
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    output = tmp_path / "tuned.rift"
    completed = subprocess.run(
        [sys.executable, "-m", "riftco_transformer", "post-train", "--model", str(base_path),
         "--instructions", str(INSTRUCTIONS), "--method", "lora", "--steps", "4",
         "--batch-size", "2", "--learning-rate", "0.05", "--no-progress", "--output",
         str(output)], env=environment, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    base, tuned = Bundle.load(base_path), Bundle.load(output)
    assert tuned.config == base.config
    before, after = base.weights, tuned.weights
    changed = {spec.name for spec in base.parameters
               if before[spec.offset:spec.offset + spec.count]
               != after[spec.offset:spec.offset + spec.count]}
    for projection in ("attention.query", "attention.output", "feed_forward.expand",
                       "feed_forward.project"):
        assert f"blocks.0.{projection}.weight" in changed, (projection, sorted(changed))


def test_riftco_post_train_model_checkpoint_survives_sigkill(tmp_path):
    """`riftco post-train --model` (a pretrained Qwen 3 bundle, QLoRA) killed with SIGKILL
    right after its first checkpoint resumes to the uninterrupted run's bundle."""
    import signal
    import time

    from riftco_transformer.artifacts import ModelBundle as Bundle

    base = family_bundle("qwen3").save(tmp_path / "qwen3.rift")
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}

    def command(output, *extra):
        return [sys.executable, "-m", "riftco_transformer", "post-train", "--model", str(base),
                "--instructions", str(INSTRUCTIONS), "--method", "qlora", "--steps", "60",
                "--batch-size", "2", "--learning-rate", "0.01",
                "--response-only", "--no-progress", "--output", str(output), *extra]

    subprocess.run(command(tmp_path / "whole.rift"), env=environment, check=True,
                   capture_output=True, timeout=300)
    checkpoint = tmp_path / "run.riftckpt"
    process = subprocess.Popen(command(tmp_path / "killed.rift", "--checkpoint", checkpoint,
                                       "--checkpoint-every", "2"),
                               env=environment, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL, "the run ended before it was killed"
    assert not (tmp_path / "killed.rift").exists()
    subprocess.run(command(tmp_path / "resumed.rift", "--resume", checkpoint, "--checkpoint",
                           checkpoint, "--checkpoint-every", "2"),
                   env=environment, check=True, capture_output=True, timeout=300)
    whole = Bundle.load(tmp_path / "whole.rift")
    resumed = Bundle.load(tmp_path / "resumed.rift")
    assert resumed.weights == whole.weights


def test_riftco_post_train_sigint_then_sigkill_resumes_to_the_same_curve_and_bundle(tmp_path):
    """A QLoRA run on a Llama model: Ctrl-C (SIGINT) stops it at a step boundary with a
    checkpoint and exit status 130; the resumed run is killed with SIGKILL after its next
    periodic checkpoint; a third run finishes. Its metrics and bundle equal the uninterrupted
    run's."""
    import json
    import signal
    import time

    from riftco_transformer.artifacts import ModelBundle as Bundle

    base = family_bundle("llama").save(tmp_path / "llama.rift")
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    steps = 60

    def command(output, metrics, *extra):
        return [sys.executable, "-m", "riftco_transformer", "post-train", "--model", str(base),
                "--instructions", str(INSTRUCTIONS), "--method", "qlora", "--steps", str(steps),
                "--batch-size", "2", "--learning-rate", "0.01",
                "--response-only", "--no-progress", "--output", str(output),
                "--metrics", str(metrics), *extra]

    def lines(path):
        if not path.exists():
            return []
        return [line for line in path.read_text().splitlines() if line.strip()]

    def curve(path):
        return [{key: value for key, value in json.loads(line).items()
                 if key not in ("elapsed_seconds", "tokens_per_second")}  # timings
                for line in lines(path)]

    def wait_until(condition, process):
        deadline = time.monotonic() + 120
        while not condition() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert process.poll() is None, "the run ended before it was interrupted"

    subprocess.run(command(tmp_path / "whole.rift", tmp_path / "whole.jsonl"), env=environment,
                   check=True, capture_output=True, timeout=300)
    checkpoint = tmp_path / "run.riftckpt"
    metrics = tmp_path / "run.jsonl"
    interrupted = subprocess.Popen(
        command(tmp_path / "run.rift", metrics, "--checkpoint", checkpoint,
                "--checkpoint-every", str(10 * steps)),
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: len(lines(metrics)) >= 5, interrupted)
    interrupted.send_signal(signal.SIGINT)
    _, stderr = interrupted.communicate(timeout=120)
    assert interrupted.returncode == 130, stderr
    stopped_at = len(lines(metrics))
    assert f"interrupted after step {stopped_at}; checkpoint {checkpoint} saved" in stderr
    assert checkpoint.is_file() and not (tmp_path / "run.rift").exists()
    assert 5 <= stopped_at < steps

    first = checkpoint.stat()
    killed = subprocess.Popen(
        command(tmp_path / "run.rift", metrics, "--resume", checkpoint, "--checkpoint",
                checkpoint, "--checkpoint-every", "7"),
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: checkpoint.stat().st_ino != first.st_ino, killed)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert not (tmp_path / "run.rift").exists()
    subprocess.run(command(tmp_path / "run.rift", metrics, "--resume", checkpoint),
                   env=environment, check=True, capture_output=True, timeout=300)
    assert curve(metrics) == curve(tmp_path / "whole.jsonl")
    assert Bundle.load(tmp_path / "run.rift").weights == \
        Bundle.load(tmp_path / "whole.rift").weights


@pytest.mark.parametrize("architecture", ["llama", "gemma2", "gemma3", "phi3"])
def test_riftco_convert_round_trips_a_family_bundle_through_safetensors(tmp_path, architecture):
    from riftco_transformer.artifacts import ModelBundle as Bundle

    bundle = family_bundle(architecture)
    path = bundle.save(tmp_path / "model.rift")
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    for source, destination in ((path, tmp_path / "model.safetensors"),
                                (tmp_path / "model.safetensors", tmp_path / "back.rift")):
        subprocess.run([sys.executable, "-m", "riftco_transformer", "convert", str(source),
                        str(destination)], env=environment, check=True, capture_output=True,
                       timeout=120)
    back = Bundle.load(tmp_path / "back.rift")
    assert back.artifact_id == bundle.artifact_id
    assert back.config == bundle.config and back.weights == bundle.weights


QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level_document(split_pattern: str | None) -> dict:
    """A tokenizer.json of the 256 byte-level symbols and the token "20" (merge "2 0"), with
    an optional Split stage."""
    stages = [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": split_pattern is None}]
    if split_pattern is not None:
        stages.insert(0, {"type": "Split", "pattern": {"Regex": split_pattern},
                          "behavior": "Isolated", "invert": False})
    return {"version": "1.0", "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": stages},
            "model": {"type": "BPE",
                      "vocab": {**{s: i for i, s in enumerate(byte_alphabet())}, "20": 256},
                      "merges": ["2 0"]}}


def test_tokenizer_json_split_patterns_are_recognised_exactly():
    # Qwen's digits are pre-tokens of their own, so "2 0" never merges; Llama 3's groups of
    # three let it.
    with PretrainedTokenizer.from_tokenizer_document(byte_level_document(QWEN2_SPLIT)) as qwen:
        assert qwen.state()["pretokenizer"] == "qwen2"
        assert qwen.encode("2024") == [ord("2"), ord("0"), ord("2"), ord("4")]
    with PretrainedTokenizer.from_tokenizer_document(byte_level_document(LLAMA3_SPLIT)) as llama:
        assert llama.state()["pretokenizer"] == "llama3"
        assert llama.encode("2024") == [256, ord("2"), ord("4")]
    with pytest.raises(ValueError, match="Split pattern .* is not supported"):
        PretrainedTokenizer.from_tokenizer_document(byte_level_document(r"\p{N}+|\p{L}+"))


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "gemma2", "gemma3"])
def test_riftco_pretrain_architecture_trains_a_family_from_scratch(tmp_path, architecture):
    """`riftco pretrain --architecture X`: the family's preset, our BPE tokenizer, a bundle that
    reopens and generates; the held-out loss falls below its first evaluation."""
    import json

    from riftco_transformer import load_pretrained
    from riftco_transformer.artifacts import ModelBundle as Bundle

    corpus = REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt"
    text = tmp_path / "corpus.txt"
    text.write_bytes(corpus.read_bytes()[:40000])
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    output = tmp_path / f"{architecture}.rift"
    subprocess.run([sys.executable, "-m", "riftco_transformer", "pretrain", "--file", str(text),
                    "--output", str(output), "--architecture", architecture, "--steps", "40",
                    "--context", "32", "--model-width", "32", "--heads", "4", "--blocks", "2",
                    "--feed-forward-width", "64", "--eval-every", "20", "--no-progress",
                    "--backend", "cpu"],
                   env=environment, check=True, capture_output=True, timeout=300)
    bundle = Bundle.load(output)
    assert bundle.architecture == architecture
    assert bundle.metadata["config"]["architecture"] == architecture
    validation = [json.loads(line) for line in output.with_name(output.name + ".metrics.jsonl")
                  .read_text().splitlines() if json.loads(line)["phase"] == "validation"]
    assert validation[-1]["loss"] < validation[0]["loss"]
    with load_pretrained(output) as loaded:
        assert loaded.model.config == bundle.config
        assert loaded.generate("Alice", max_new_tokens=4).text is not None


def test_a_padded_vocabulary_saves_reopens_and_never_samples_its_padding(tmp_path):
    """Real checkpoints round V up past their tokenizer: such a model bundles, reopens and
    generates, and sampling stays within the tokenizer's ids."""
    from riftco_transformer import load_pretrained

    config = LlamaMistralConfig.preset("qwen3", **{**DIMENSIONS, "vocabulary_size": 300})
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())  # 256 tokens
    with LlamaMistralTransformer(config) as model:
        path = ModelBundle.capture(model, tokenizer, "pretraining").save(tmp_path / "p.rift")
    with load_pretrained(path) as loaded:
        assert (loaded.tokenizer.vocabulary_size, loaded.model.config.vocabulary_size) == (256, 300)
        for seed in range(3):
            result = loaded.generate("padding", max_new_tokens=12, temperature=3.0, seed=seed)
            assert result.generated_token_ids and max(result.generated_token_ids) < 256
    too_big = LlamaMistralConfig.preset("qwen3", **{**DIMENSIONS, "vocabulary_size": 200})
    with LlamaMistralTransformer(too_big) as model:
        with pytest.raises(ValueError, match="tokenizer vocabulary 256 != model vocabulary_size"):
            ModelBundle.capture(model, tokenizer, "pretraining")


def test_bundles_record_only_the_choices_that_differ_from_llama():
    from riftco_transformer.artifacts import LLAMA_REQUIRED_CONFIG_FIELDS

    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    with LlamaMistralTransformer(LlamaMistralConfig(**DIMENSIONS)) as model:
        llama = ModelBundle.capture(model, tokenizer, "pretraining")
    # A plain Llama bundle's config is what bundles held before the family choices existed.
    assert set(llama.manifest["config"]) == set(LLAMA_REQUIRED_CONFIG_FIELDS)
    qwen3 = family_bundle("qwen3")
    assert set(qwen3.manifest["config"]) - set(LLAMA_REQUIRED_CONFIG_FIELDS) == {
        "query_key_norm", "head_width"}
    # Gemma 2 records its caps; a bundle without them (every one before C ABI 2.11, and a
    # Gemma 3 one still) reads them as 0, no cap.
    gemma2 = family_bundle("gemma2")
    assert (gemma2.manifest["config"]["attention_logit_softcap"],
            gemma2.manifest["config"]["final_logit_softcap"]) == (50.0, 30.0)
    gemma3 = family_bundle("gemma3")
    assert not {"attention_logit_softcap", "final_logit_softcap"} & set(gemma3.manifest["config"])
    assert gemma3.config.attention_logit_softcap == gemma3.config.final_logit_softcap == 0.0


def test_a_bundle_of_the_first_gemma3_release_loads_without_the_cap_fields(tmp_path):
    """A Gemma 3 bundle saved before the caps existed has no cap fields: it loads, with the
    same config, logits and artifact id (saving it again writes the same manifest)."""
    bundle = family_bundle("gemma3")
    path = bundle.save(tmp_path / "g3.rift")
    loaded = ModelBundle.load(path)
    assert "attention_logit_softcap" not in loaded.manifest["config"]
    assert loaded.artifact_id == bundle.artifact_id and loaded.config == bundle.config


def sentencepiece_document(prepend: bool) -> dict:
    """A SentencePiece-style tokenizer.json (byte fallback): Llama 2's normalizer with its
    Prepend("\u2581"), or Gemma's, which only replaces spaces."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)),
              "\u2581", "h", "i", "hi", "\u2581hi"]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend",
                                                        "prepend": "\u2581"}, replace]}
                  if prepend else replace)
    return {"version": "1.0", "normalizer": normalizer, "pre_tokenizer": None,
            "added_tokens": [{"id": i, "content": t, "special": True}
                             for i, t in enumerate(tokens[:3])],
            "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>",
                      "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": ["h i", "\u2581 hi"]}}


def test_gemma_tokenizer_json_has_no_dummy_prefix():
    with PretrainedTokenizer.from_tokenizer_document(sentencepiece_document(True)) as llama2, \
            PretrainedTokenizer.from_tokenizer_document(sentencepiece_document(False)) as gemma:
        assert llama2.state()["add_dummy_prefix"] and not gemma.state()["add_dummy_prefix"]
        assert llama2.encode("hi") == [263]  # "\u2581hi"
        assert gemma.encode("hi") == [262]  # "hi"
        assert gemma.decode(gemma.encode("hi hi")) == "hi hi"


# ---- GPT-2 as a preset of the one decoder (C ABI 2.12) ------------------------------------

GPT2_DIMENSIONS = dict(vocabulary_size=256, maximum_context=32, model_width=12, block_count=2,
                       feed_forward_width=20)
GPT2_CHOICES = dict(positions="learned", norm="layer", feed_forward="plain",
                    plain_activation="gelu_tanh", query_key_value_bias=True, output_bias=True,
                    feed_forward_bias=True, head_bias=True)
NEW_FIELDS = ("positions", "norm", "feed_forward", "plain_activation", "output_bias",
              "feed_forward_bias", "head_bias")


def gpt2_preset(seed: int = 11, **fields) -> LlamaMistralConfig:
    return LlamaMistralConfig.preset("gpt2", query_head_count=4, key_value_head_count=4,
                                     random_seed=seed, **{**GPT2_DIMENSIONS, **fields})


def gpt_decoder_config(seed: int = 11, **fields):
    from riftco_transformer import TransformerConfig

    return TransformerConfig(head_count=4, random_seed=seed,
                             **{**GPT2_DIMENSIONS, "feed_forward_activation": "gelu_tanh",
                                **fields})


def test_the_gpt2_preset_sets_its_choices_through_the_library():
    config = gpt2_preset()
    assert config.architecture == "gpt2"
    for field, value in GPT2_CHOICES.items():
        assert getattr(config, field) == value, field
    assert not (config.query_key_norm or config.norm_weight_offset or config.post_block_norms)
    assert config.rope_scaling == "none" and config.sliding_window_period == 0
    # Llama's choices are the defaults of every new field, and other presets keep them.
    plain = LlamaMistralConfig(**DIMENSIONS)
    assert (plain.positions, plain.norm, plain.feed_forward, plain.plain_activation) == (
        "rotary", "rms", "gated", "gelu")
    assert not (plain.output_bias or plain.feed_forward_bias or plain.head_bias)
    for architecture in FAMILIES:
        family = preset(architecture)
        assert {name: getattr(family, name) for name in NEW_FIELDS} == {
            name: getattr(plain, name) for name in NEW_FIELDS}, architecture


def test_a_gpt2_preset_decoder_is_the_gpt_decoder_bit_for_bit():
    from riftco_transformer import DecoderOnlyTransformer

    tokens = [[5, 17, 200, 3, 255, 0, 42, 9], [1, 2, 3, 4, 5, 6, 7, 8]]
    for seed in (11, 12345):
        with DecoderOnlyTransformer(gpt_decoder_config(seed)) as gpt, \
                LlamaMistralTransformer(gpt2_preset(seed)) as general:
            with gpt.parameters() as left, general.parameters() as right:
                assert left.names == right.names
                assert left.shapes == right.shapes
                assert left.flat_values().tobytes() == right.flat_values().tobytes()
            assert forward_values(gpt, tokens) == forward_values(general, tokens)
    # Another seed draws other weights (the comparison above is not vacuous).
    with LlamaMistralTransformer(gpt2_preset(11)) as first, \
            LlamaMistralTransformer(gpt2_preset(12)) as second:
        assert forward_values(first, tokens) != forward_values(second, tokens)


def test_a_gpt_decoders_general_config_is_the_gpt2_preset():
    from riftco_transformer import DecoderOnlyTransformer

    with DecoderOnlyTransformer(gpt_decoder_config(77)) as gpt:
        general = gpt.decoder_config()
    assert general == gpt2_preset(77)
    assert general.architecture == "gpt2" and general.random_seed == 77
    # The GPT decoder's own choices read back: exact GELU, tied embeddings.
    with DecoderOnlyTransformer(gpt_decoder_config(
            3, feed_forward_activation="gelu", tie_embeddings=True)) as tied:
        general = tied.decoder_config()
    assert general.plain_activation == "gelu" and general.tie_embeddings
    assert general.random_seed == 3
    with DecoderOnlyTransformer(gpt_decoder_config(3, feed_forward_activation="relu")) as relu:
        assert relu.decoder_config().plain_activation == "relu"
    # A rotary decoder reads back its own config.
    config = preset("qwen3")
    with LlamaMistralTransformer(config) as model:
        assert model.decoder_config() == config


@pytest.mark.parametrize(("field", "value", "error"), [
    ("positions", "alibi", ValueError),
    ("positions", 1, TypeError),
    ("norm", 3, TypeError),
    ("norm", "batch", ValueError),
    ("feed_forward", "moe", ValueError),
    ("plain_activation", "swish", ValueError),
    ("plain_activation", None, TypeError),
    ("output_bias", 1, TypeError),
    ("feed_forward_bias", "yes", TypeError),
    ("head_bias", None, TypeError),
])
def test_bad_gpt2_choices_are_refused_naming_the_field_and_value(field, value, error):
    from riftco_transformer import RiftcoTransformerError
    from riftco_transformer.native._loader import library

    # A native failure leaves its text; any later native call would clear it.
    with pytest.raises(RiftcoTransformerError):
        LlamaMistralTransformer(LlamaMistralConfig(**DIMENSIONS, head_width=5))
    native_text = library().rt_last_error()
    assert native_text
    with pytest.raises(error) as caught:
        LlamaMistralConfig(**DIMENSIONS, **{field: value})
    assert field in str(caught.value) and repr(value) in str(caught.value)
    with pytest.raises(error, match=field):
        LlamaMistralConfig.preset("gpt2", **DIMENSIONS, **{field: value})
    assert library().rt_last_error() == native_text


@pytest.mark.parametrize(("fields", "fragment"), [
    (dict(positions="learned", rope_scaling="linear", rope_scaling_factor=2.0), "rope_scaling"),
    (dict(positions="learned", rope_local_theta=10000.0), "rope_local_theta"),
    (dict(norm="layer", norm_weight_offset=True), "norm_weight_offset"),
    (dict(positions="rotary", head_width=5), "even head width"),
])
def test_the_library_refuses_gpt2_choices_that_cannot_go_together(fields, fragment):
    from riftco_transformer import RiftcoTransformerError

    with pytest.raises(RiftcoTransformerError, match=fragment):
        LlamaMistralTransformer(LlamaMistralConfig(**DIMENSIONS, **fields))


GPT2_MIXES = {
    "gpt2": dict(),
    "gpt2_odd_head_tied": dict(model_width=15, query_head_count=5, key_value_head_count=5,
                               tie_embeddings=True),
    "learned_rms_gated": dict(positions="learned", feed_forward_bias=True, head_bias=True),
    "layer_norm_qwen3": dict(norm="layer", query_key_norm=True, post_block_norms=True,
                             output_bias=True, head_width=6),
}


def gpt2_mix(name: str) -> LlamaMistralConfig:
    fields = GPT2_MIXES[name]
    if name.startswith("gpt2"):
        return LlamaMistralConfig.preset("gpt2", **{
            **GPT2_DIMENSIONS, "query_head_count": 4, "key_value_head_count": 4, **fields})
    return LlamaMistralConfig(**{**DIMENSIONS, **fields})


@pytest.mark.parametrize("name", sorted(GPT2_MIXES))
def test_gpt2_choices_save_as_a_bundle_and_reopen_with_the_same_logits(tmp_path, name):
    from riftco_transformer.artifacts import llama_parameter_shapes

    config = gpt2_mix(name)
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    tokens = tokenizer.encode("GPT-2 is a preset of the one decoder.")[:24]
    with LlamaMistralTransformer(config) as model:
        logits = forward_values(model, tokens)
        with model.parameters() as parameters:
            table = list(zip(parameters.names, parameters.shapes, strict=True))
        assert table == llama_parameter_shapes(config)
        bundle = ModelBundle.capture(model, tokenizer, "pretraining")
    record = bundle.manifest["config"]
    for field in NEW_FIELDS:
        default = getattr(LlamaMistralConfig(**DIMENSIONS), field)
        assert (field in record) == (getattr(config, field) != default), field
    path = bundle.save(tmp_path / f"{name}.rift")
    loaded = ModelBundle.load(path)
    assert loaded.config == config and loaded.artifact_id == bundle.artifact_id
    with loaded.instantiate() as runtime:
        assert isinstance(runtime.model, LlamaMistralTransformer)
        assert runtime.model.config == config
        assert forward_values(runtime.model, tokens) == logits
    if name == "gpt2":
        environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
        inspected = subprocess.run(
            [sys.executable, "-m", "riftco_transformer", "inspect", str(path)],
            capture_output=True, text=True, env=environment, timeout=120)
        assert inspected.returncode == 0, inspected.stderr
        assert "gpt2 Hq=4 Hkv=4 d=3" in inspected.stdout
        assert ("layout       positions=learned norm=layer feed_forward=plain(gelu_tanh) "
                "biases=qkv,output,feed_forward,head") in inspected.stdout


def test_configs_and_bundles_without_the_gpt2_keys_load_with_llamas_choices(tmp_path):
    from riftco_transformer.artifacts import LLAMA_ARCHITECTURE, validate_model_config

    # A config record as written before 2.12: none of the new keys.
    with LlamaMistralTransformer(preset("qwen2")) as model:
        bundle = ModelBundle.capture(model, PretrainedTokenizer.from_vocabulary(byte_alphabet()),
                                     "pretraining")
    record = bundle.manifest["config"]
    assert not set(NEW_FIELDS) & set(record)
    parsed = validate_model_config(LLAMA_ARCHITECTURE, dict(record), "test")
    assert parsed == preset("qwen2")
    assert (parsed.positions, parsed.norm, parsed.feed_forward, parsed.plain_activation) == (
        "rotary", "rms", "gated", "gelu")
    loaded = ModelBundle.load(bundle.save(tmp_path / "qwen2.rift"))
    assert loaded.config == preset("qwen2") and loaded.artifact_id == bundle.artifact_id
    # A bad value in a record is refused naming the field.
    with pytest.raises(ValueError, match="norm"):
        validate_model_config(LLAMA_ARCHITECTURE, {**record, "norm": "batch"}, "test")
    # An odd head width is refused with rotary positions only.
    odd = {**record, "model_width": 15, "query_head_count": 5, "key_value_head_count": 5}
    with pytest.raises(ValueError, match="even head width"):
        validate_model_config(LLAMA_ARCHITECTURE, odd, "test")
    assert validate_model_config(LLAMA_ARCHITECTURE, {**odd, "positions": "learned"},
                                 "test").resolved_head_width == 3


def test_pretraining_gpt2_stays_the_gpt_decoder():
    from riftco_transformer.pretraining import ARCHITECTURES

    assert ARCHITECTURES.count("gpt2") == 1 and ARCHITECTURES[0] == "gpt2"
    assert set(ARCHITECTURES) == {"gpt2", *FAMILIES}


# ---- the one architecture table (C ABI 2.12, rt_checkpoint_tensor_name)


def test_the_architecture_table_names_checkpoint_tensors_for_both_importers():
    from riftco_transformer.interchange.huggingface import huggingface_name
    from riftco_transformer.native.llama import checkpoint_tensor_name

    assert checkpoint_tensor_name("qwen2", "huggingface", "blocks.7.attention.value.bias") == (
        "model.layers.7.self_attn.v_proj.bias", None)
    assert checkpoint_tensor_name("phi3", "huggingface", "blocks.1.feed_forward.up.weight") == (
        "model.layers.1.mlp.gate_up_proj.weight", 1)
    assert checkpoint_tensor_name("phi3", "gguf", "blocks.1.attention.key.weight", 1) == (
        "blk.1.attn_qkv.weight", 1)
    assert checkpoint_tensor_name("llama", "gguf", "blocks.1.attention.key.weight", 1) is None
    assert checkpoint_tensor_name("gpt2", "huggingface", "blocks.0.attention.value.weight") == (
        "h.0.attn.c_attn.weight", 2)
    # The Hugging Face importer's names are the table's.
    assert huggingface_name("blocks.2.feed_forward_norm.scale", "gemma3") == (
        "model.layers.2.pre_feedforward_layernorm.weight")
    with pytest.raises(ValueError, match="blocks.0.attention.nothing"):
        checkpoint_tensor_name("llama", "huggingface", "blocks.0.attention.nothing")
    with pytest.raises(ValueError, match="gpt2"):
        checkpoint_tensor_name("gpt2", "gguf", "token_embedding.weight")
    with pytest.raises(ValueError, match="checkpoint_format"):
        checkpoint_tensor_name("llama", "onnx", "token_embedding.weight")
    with pytest.raises(ValueError, match="architecture"):
        checkpoint_tensor_name("falcon", "gguf", "token_embedding.weight")
    with pytest.raises(TypeError, match="parameter"):
        checkpoint_tensor_name("llama", "gguf", 3)


def test_a_bundle_keeps_every_pretokenizer_the_library_has(tmp_path):
    """Bundles accept each pre-tokenizer of the library (Qwen 2/3's "qwen2" among them: real
    Qwen checkpoints use it) and reopen with the same ids."""
    from riftco_transformer.native.pretrained_tokenizer import PRETOKENIZER_VALUES

    text = "Qwen 2.5: 12345 tokens, ça va? 東京"
    for pretokenizer in PRETOKENIZER_VALUES:
        tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet(), pretokenizer=pretokenizer)
        with LlamaMistralTransformer(preset("qwen2")) as model:
            bundle = ModelBundle.capture(model, tokenizer, "pretraining")
        path = bundle.save(tmp_path / f"{pretokenizer}.rift")
        reopened = ModelBundle.load(path)
        assert reopened.tokenizer_state["pretokenizer"] == pretokenizer
        again = PretrainedTokenizer.from_state(reopened.tokenizer_state)
        assert again.encode(text) == tokenizer.encode(text), pretokenizer
        again.close()
        tokenizer.close()
