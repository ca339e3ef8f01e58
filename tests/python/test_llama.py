"""The Llama/Mistral model from Python: config rules, parameter names, the rt_model surface it
shares (LoRA on every projection by name, NF4, decode sessions, Adam), GGUF errors."""

from __future__ import annotations

import math

import pytest

import riftco_transformer as rt
from riftco_transformer import LlamaMistralConfig, LlamaMistralTransformer, RiftcoTransformerError

CONFIG = LlamaMistralConfig(vocabulary_size=13, maximum_context=9, model_width=16,
                            query_head_count=4, key_value_head_count=2, block_count=2,
                            feed_forward_width=24, rope_theta=500.0, random_seed=3)


def forward_values(model, tokens):
    with model(tokens) as variable:
        return variable.tolist()


def test_parameter_names_follow_the_contract():
    with LlamaMistralTransformer(CONFIG) as model, model.parameters() as parameters:
        names = parameters.names
    expected = ["token_embedding.weight"]
    for block in range(2):
        expected += [f"blocks.{block}.{name}" for name in (
            "attention_norm.scale", "attention.query.weight", "attention.key.weight",
            "attention.value.weight", "attention.output.weight", "feed_forward_norm.scale",
            "feed_forward.gate.weight", "feed_forward.up.weight", "feed_forward.down.weight")]
    expected += ["final_norm.scale", "language_model_head.weight"]
    assert list(names) == expected


@pytest.mark.parametrize("changes, fragment", [
    (dict(model_width=18), "query_head_count"),
    (dict(key_value_head_count=3), "key_value_head_count"),
    (dict(model_width=12), "even head width"),
])
def test_config_rules_are_the_librarys(changes, fragment):
    config = LlamaMistralConfig(**{**CONFIG.__dict__, **changes})
    with pytest.raises(RiftcoTransformerError) as caught:
        LlamaMistralTransformer(config)
    assert caught.value.status == rt.STATUS_INVALID_ARGUMENT
    assert fragment in str(caught.value)


@pytest.mark.parametrize("changes, error", [
    (dict(rope_theta=math.nan), ValueError),
    (dict(rope_theta=0.0), ValueError),
    (dict(rms_norm_epsilon=-1.0), ValueError),
    (dict(sliding_window=0), ValueError),
    (dict(architecture="gpt"), ValueError),
    (dict(tie_embeddings=1), TypeError),
    (dict(block_count=0), ValueError),
])
def test_config_fields_are_checked_in_python(changes, error):
    with pytest.raises(error):
        LlamaMistralConfig(**{**CONFIG.__dict__, **changes})


def test_config_round_trips_through_the_library():
    config = LlamaMistralConfig(**{**CONFIG.__dict__, "architecture": "mistral",
                                   "sliding_window": 4, "tie_embeddings": True})
    with LlamaMistralTransformer(config) as model:
        assert model.config == config
        assert model.vocabulary_size == 13 and model.maximum_context == 9


def test_decode_session_matches_the_full_forward():
    with LlamaMistralTransformer(CONFIG) as model:
        tokens = [3, 1, 4, 1, 5, 9, 2]
        full = forward_values(model, tokens)
        with model.decode_session(block_size=4) as session:
            rows = [list(session.prefill(tokens[:4]))]
            for token in tokens[4:]:
                rows.append(list(session.step(token)))
        for index, row in enumerate(rows):
            position = 3 if index == 0 else 3 + index
            expected = full[position * 13:(position + 1) * 13]
            assert max(abs(a - b) for a, b in zip(row, expected)) < 1e-4


def test_lora_targets_the_gated_feed_forward_by_name():
    with LlamaMistralTransformer(CONFIG) as model:
        model.attach_lora(rt.LoraConfig(rank=2, targets=("attention.query", "feed_forward.gate",
                                                         "feed_forward.down")))
        with model.adapter_parameters() as adapters:
            names = adapters.names
        assert names[0] == "blocks.0.attention.query.lora_a.weight"
        assert "blocks.1.feed_forward.down.lora_b.weight" in names
        assert len(names) == 12


def test_feed_forward_expand_is_not_a_target_here():
    with LlamaMistralTransformer(CONFIG) as model:
        with pytest.raises(RiftcoTransformerError):
            model.attach_lora(rt.LoraConfig(rank=2, targets=("feed_forward.expand",)))
        assert not model.lora_attached


def test_qlora_step_lowers_the_loss():
    with LlamaMistralTransformer(CONFIG) as model:
        model.quantize_nf4(block_size=32)
        model.attach_lora(rt.LoraConfig(rank=4, alpha=8.0, targets=(
            "attention.query", "attention.key", "attention.value", "attention.output",
            "feed_forward.gate", "feed_forward.up", "feed_forward.down")))
        tokens = [[1, 2, 3, 4, 5, 6, 7, 8]]
        targets = [2, 3, 4, 5, 6, 7, 8, 9]
        with model.adapter_parameters() as adapters:
            optimizer = rt.Adam(adapters, rt.AdamOptions(learning_rate=1e-2))
            losses = []
            for _ in range(15):
                with model(tokens) as logits, rt.cross_entropy(logits, targets) as loss:
                    losses.append(loss.item())
                    loss.backward()
                optimizer.step()
            optimizer.close()
        assert losses[-1] < losses[0] - 0.1


def test_untie_embeddings_keeps_the_logits_and_lets_nf4_pack_the_head():
    tied = LlamaMistralConfig(**{**CONFIG.__dict__, "tie_embeddings": True})
    tokens = [[1, 2, 3, 4, 5]]
    with LlamaMistralTransformer(tied) as model:
        before = forward_values(model, tokens)
        with model.parameters() as parameters:
            with pytest.raises(RiftcoTransformerError) as caught:
                model.untie_embeddings()  # the open list pins the model
            assert caught.value.status_name == "runtime_error"
            assert "parameter list" in caught.value.detail
            assert parameters.names[-1] == "final_norm.scale"
        assert model.config.tie_embeddings
        model.untie_embeddings()
        assert not model.config.tie_embeddings
        with model.parameters() as parameters:
            assert parameters.names[-1] == "language_model_head.weight"
        assert forward_values(model, tokens) == before
        with pytest.raises(RiftcoTransformerError) as caught:
            model.untie_embeddings()
        assert caught.value.status_name == "invalid_argument"
        assert "not tied" in caught.value.detail
        model.quantize_nf4(block_size=32)
        assert model.quantized_memory.weight_count == 7 * CONFIG.block_count + 1
    with LlamaMistralTransformer(tied) as model:
        model.quantize_nf4(block_size=32)
        with pytest.raises(RiftcoTransformerError) as caught:
            model.untie_embeddings()
        assert "before quantize_nf4" in caught.value.detail
        assert model.config.tie_embeddings


def test_gguf_errors_name_the_problem(tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(RiftcoTransformerError) as caught:
        LlamaMistralTransformer.from_gguf(missing)
    assert "missing.gguf" in str(caught.value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x01\x00\x00\x00" + b"\x00" * 16)
    with pytest.raises(RiftcoTransformerError) as caught:
        LlamaMistralTransformer.from_gguf(bad)
    assert "version" in str(caught.value)
    with pytest.raises(ValueError):
        LlamaMistralTransformer.from_gguf("a\0b")
