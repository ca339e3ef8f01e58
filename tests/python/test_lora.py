"""LoRA and QLoRA from Python: LoraConfig rules, attach/merge lifecycle, adapter-only training,
NF4 conversion and packed state, and an independent PyTorch reimplementation of LoRA's math."""

from __future__ import annotations

import math
import random

import pytest
from support import native_error

from riftco_transformer import (
    LORA_TARGETS,
    Adam,
    DecoderOnlyTransformer,
    LoraConfig,
    QuantizedMemoryStats,
    TransformerConfig,
    cross_entropy,
)

CONFIG = TransformerConfig(
    vocabulary_size=32,
    maximum_context=8,
    model_width=16,
    head_count=4,
    block_count=2,
    feed_forward_width=32,
    random_seed=7,
)
TOKENS = [[1, 5, 9, 3, 7, 2], [4, 8, 6, 0, 31, 12]]
TARGETS = [5, 9, 3, 7, 2, 11, 8, 6, 0, 31, 12, 4]
# Every projection of the GPT decoder (the gated feed-forward names are Llama/Mistral's).
ALL = tuple(name for name in LORA_TARGETS if not name.startswith(("feed_forward.gate",
                                                                  "feed_forward.up",
                                                                  "feed_forward.down")))


def flat_logits(model) -> list[float]:
    with model(TOKENS) as logits:
        return logits.tolist()


def randomize_adapters(model, seed: int) -> None:
    generator = random.Random(seed)
    with model.adapter_parameters() as adapters:
        adapters.load_flat_values(
            [generator.uniform(-0.3, 0.3) for _ in range(adapters.total_numel)]
        )


# ---- LoraConfig ---------------------------------------------------------------------------


def test_lora_config_defaults_are_the_specs():
    config = LoraConfig()
    assert (config.rank, config.alpha, config.random_seed) == (4, 8.0, 5489)
    assert config.targets == ("attention.query", "attention.value")
    assert config.target_mask == 0x5
    assert LoraConfig(targets=ALL).target_mask == 0x7F
    assert LoraConfig(targets=tuple(LORA_TARGETS)).target_mask == 0x3FF


@pytest.mark.parametrize(
    ("keywords", "error", "fragment"),
    [
        ({"rank": 0}, ValueError, "rank"),
        ({"rank": 2.0}, TypeError, "rank"),
        ({"rank": True}, TypeError, "rank"),
        ({"alpha": 0.0}, ValueError, "alpha"),
        ({"alpha": -1.0}, ValueError, "alpha"),
        ({"alpha": math.nan}, ValueError, "alpha"),
        ({"alpha": math.inf}, ValueError, "alpha"),
        ({"alpha": 1e39}, ValueError, "float32"),
        ({"rank": 4, "alpha": 1e-45}, ValueError, "float32"),
        ({"alpha": "8"}, TypeError, "alpha"),
        ({"targets": ()}, ValueError, "at least one"),
        ({"targets": "attention.query"}, TypeError, "tuple"),
        ({"targets": ("attention.qkv",)}, ValueError, "attention.qkv"),
        ({"targets": ("attention.query", "attention.query")}, ValueError, "repeats"),
        ({"targets": (3,)}, TypeError, "str"),
        ({"random_seed": -1}, ValueError, "random_seed"),
        ({"random_seed": 1 << 32}, ValueError, "random_seed"),
        ({"dropout": -0.1}, ValueError, "dropout"),
        ({"dropout": 1.0}, ValueError, "dropout"),
        ({"dropout": 1.0 - 1e-12}, ValueError, "dropout"),  # 1 in float32
        ({"dropout": math.nan}, ValueError, "dropout"),
        ({"dropout": "0.1"}, TypeError, "dropout"),
        ({"dropout": True}, TypeError, "dropout"),
    ],
)
def test_lora_config_rejects_bad_fields_naming_them(keywords, error, fragment):
    with pytest.raises(error, match=fragment):
        LoraConfig(**keywords)


# ---- lifecycle --------------------------------------------------------------------------


def test_attach_preserves_outputs_keeps_the_base_list_and_names_the_factors():
    with DecoderOnlyTransformer(CONFIG) as model:
        before = flat_logits(model)
        with model.parameters() as base:
            names = base.names
        assert model.lora_config is None and not model.lora_attached
        model.attach_lora(LoraConfig(rank=2, alpha=4.0, targets=("attention.value", "language_model_head")))
        assert model.lora_attached
        assert model.lora_config == LoraConfig(
            rank=2, alpha=4.0, targets=("attention.value", "language_model_head")
        )
        assert flat_logits(model) == before
        with model.parameters() as base:
            assert base.names == names
        with model.adapter_parameters() as adapters:
            assert adapters.names == (
                "blocks.0.attention.value.lora_a.weight",
                "blocks.0.attention.value.lora_b.weight",
                "blocks.1.attention.value.lora_a.weight",
                "blocks.1.attention.value.lora_b.weight",
                "language_model_head.lora_a.weight",
                "language_model_head.lora_b.weight",
            )
            assert adapters.shapes[4:] == ((2, 16), (32, 2))
        error = native_error(lambda: model.attach_lora(LoraConfig()))
        assert error.status_name == "runtime_error"


def test_lifecycle_errors_change_nothing():
    with DecoderOnlyTransformer(CONFIG) as model:
        with pytest.raises(TypeError, match="LoraConfig"):
            model.attach_lora({"rank": 2})
        assert native_error(model.merge_lora).status_name == "runtime_error"
        assert native_error(model.adapter_parameters).status_name == "runtime_error"
        error = native_error(lambda: model.attach_lora(LoraConfig(rank=17, targets=ALL)))
        assert error.status_name == "invalid_argument" and "rank" in str(error)
        with model(TOKENS):  # an open variable pins the model
            assert native_error(lambda: model.attach_lora(LoraConfig())).status_name == (
                "runtime_error"
            )
        assert not model.lora_attached and model.lora_config is None
        model.attach_lora(LoraConfig())
        assert model.lora_attached


def test_a_graph_that_backward_consumed_no_longer_pins_the_model():
    # The probe: after loss.backward(), merge_lora failed with "pinned by 1 live variable(s)"
    # until the user deleted `loss`. A consumed graph holds only its value.
    with DecoderOnlyTransformer(CONFIG) as model:
        model.attach_lora(LoraConfig(rank=4, alpha=8.0, targets=ALL))
        logits = model(TOKENS)
        loss = cross_entropy(logits, TARGETS)
        error = native_error(model.merge_lora)  # not yet consumed: both pin
        assert error.status_name == "runtime_error"
        assert "2 live variable(s) whose graph no backward has consumed" in str(error)
        assert model.lora_attached
        loss.backward()
        value = loss.item()
        model.merge_lora()  # logits and loss are still open
        assert not model.lora_attached
        assert loss.item() == value  # values stay readable
        assert native_error(loss.backward).status_name == "runtime_error"  # still consumed
        fresh = model(TOKENS)
        assert native_error(lambda: model.quantize_nf4()).status_name == "runtime_error"
        fresh.close()
        loss.close()
        logits.close()


def test_adapter_only_training_reduces_the_loss_and_merge_reproduces_it():
    with DecoderOnlyTransformer(CONFIG) as model:
        with model.parameters() as base:
            base_values = base.flat_values()
        model.attach_lora(LoraConfig(rank=4, alpha=8.0, targets=ALL))
        with model.parameters() as base:
            assert native_error(lambda: Adam(base)).status_name == "invalid_argument"
        losses = []
        with model.adapter_parameters() as adapters, Adam(adapters, learning_rate=1e-2) as adam:
            for _ in range(25):
                with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
                    losses.append(loss.item())
                    loss.backward()
                adam.step()
        assert losses[-1] < losses[0] - 0.1
        with model.parameters() as base:
            assert base.flat_values() == base_values
        adapted = flat_logits(model)
        with model.adapter_parameters():
            assert native_error(model.merge_lora).status_name == "runtime_error"
        model.merge_lora()
        assert not model.lora_attached and model.lora_config is not None
        merged = flat_logits(model)
        assert max(abs(a - b) for a, b in zip(adapted, merged)) <= 1e-5
        with model.parameters() as base, Adam(base):
            pass  # the merged base trains again
        assert native_error(model.merge_lora).status_name == "runtime_error"


# ---- PyTorch oracle -----------------------------------------------------------------------


def _torch_lora_logits(torch, parameters, adapters, config: TransformerConfig, scale: float):
    F = torch.nn.functional
    d, h = config.model_width, config.head_count
    width = d // h
    batch, time = len(TOKENS), len(TOKENS[0])
    ids = torch.tensor(TOKENS)
    p = parameters

    def project(x, path, bias=True):
        y = F.linear(x, p[path + ".weight"], p[path + ".bias"] if bias else None)
        if path + ".lora_a.weight" in adapters:
            a = adapters[path + ".lora_a.weight"]
            b = adapters[path + ".lora_b.weight"]
            y = y + scale * F.linear(F.linear(x, a), b)
        return y

    x = p["token_embedding.weight"][ids] + p["position_embedding.weight"][torch.arange(time)]
    mask = torch.ones(time, time, dtype=torch.bool).tril()
    for i in range(config.block_count):
        b = f"blocks.{i}."
        a = F.layer_norm(x, (d,), p[b + "attention_norm.scale"], p[b + "attention_norm.bias"], 1e-5)

        def heads(name):
            return project(a, b + "attention." + name).reshape(batch, time, h, width).permute(0, 2, 1, 3)

        q, k, v = heads("query"), heads("key"), heads("value")
        scores = (q @ k.transpose(-1, -2) / width**0.5).masked_fill(~mask, float("-inf"))
        context = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(batch, time, d)
        x = x + project(context, b + "attention.output")
        f = F.layer_norm(x, (d,), p[b + "feed_forward_norm.scale"], p[b + "feed_forward_norm.bias"], 1e-5)
        x = x + project(F.gelu(project(f, b + "feed_forward.expand")), b + "feed_forward.project")
    x = F.layer_norm(x, (d,), p["final_norm.scale"], p["final_norm.bias"], 1e-5)
    return project(x, "language_model_head")


def _named_tensors(torch, parameter_list, requires_grad=False):
    values = parameter_list.flat_values()
    tensors, offset = {}, 0
    for name, shape in zip(parameter_list.names, parameter_list.shapes):
        count = math.prod(shape)
        tensors[name] = torch.tensor(values[offset : offset + count], dtype=torch.float64).reshape(shape)
        tensors[name].requires_grad_(requires_grad)
        offset += count
    return tensors


def test_lora_forward_and_factor_gradients_match_a_pytorch_reimplementation():
    torch = pytest.importorskip("torch")
    config = LoraConfig(rank=3, alpha=5.0, targets=ALL)
    with DecoderOnlyTransformer(CONFIG) as model:
        model.attach_lora(config)
        randomize_adapters(model, 3)
        with model.parameters() as base, model.adapter_parameters() as adapters:
            p = _named_tensors(torch, base)
            lora = _named_tensors(torch, adapters, requires_grad=True)
            adapter_names = adapters.names
        expected = _torch_lora_logits(torch, p, lora, CONFIG, 5.0 / 3.0)
        ours = torch.tensor(flat_logits(model), dtype=torch.float64).reshape(expected.shape)
        assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4), float((ours - expected).abs().max())

        loss = torch.nn.functional.cross_entropy(
            expected.reshape(-1, CONFIG.vocabulary_size), torch.tensor(TARGETS)
        )
        loss.backward()
        # Our gradients, read through Adam's first moment after one unclipped step: m = 0.1·g.
        with model.adapter_parameters() as adapters, Adam(
            adapters, maximum_gradient_norm=1e30
        ) as adam:
            with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as ours_loss:
                assert abs(ours_loss.item() - float(loss)) < 1e-5
                ours_loss.backward()
            adam.step()
            moments = adam.state().first_moments
        offset = 0
        for name in adapter_names:
            reference = lora[name].grad.flatten()
            count = reference.numel()
            mine = torch.tensor(moments[offset : offset + count], dtype=torch.float64) / 0.1
            offset += count
            assert torch.allclose(mine, reference, atol=2e-5, rtol=1e-3), (
                name,
                float((mine - reference).abs().max()),
            )


# ---- NF4 / QLoRA --------------------------------------------------------------------------


def _expected_bytes(n: int, block: int, scale_block: int | None) -> dict[str, int]:
    m = -(-n // block)
    codes = -(-n // 2)
    if scale_block is None:
        return {"packed_code_bytes": codes, "fp32_scale_bytes": 4 * m, "scale_bytes": 4 * m}
    second = 4 * -(-m // scale_block)
    return {
        "packed_code_bytes": codes,
        "scale_code_bytes": m,
        "second_level_scale_bytes": second,
        "scale_offset_bytes": 4,
        "scale_bytes": m + second + 4,
    }


@pytest.mark.parametrize("double_quantization", [False, True])
def test_quantize_nf4_reports_exact_bytes_and_still_runs(double_quantization):
    config = CONFIG
    d, f, v, n_blocks = config.model_width, config.feed_forward_width, config.vocabulary_size, 2
    sizes = [d * d] * 4 + [d * f, f * d]
    sizes = sizes * n_blocks + [v * d]
    with DecoderOnlyTransformer(config) as model:
        dense = flat_logits(model)
        assert model.quantized_memory == QuantizedMemoryStats(*([0] * 11))
        with model.parameters():
            assert native_error(model.quantize_nf4).status_name == "runtime_error"
        with pytest.raises(TypeError, match="double_quantization"):
            model.quantize_nf4(double_quantization=1)
        assert native_error(lambda: model.quantize_nf4(block_size=48)).status_name == (
            "invalid_argument"
        )
        model.quantize_nf4(block_size=32, double_quantization=double_quantization, scale_block_size=64)
        assert model.quantized_linear_weights
        stats = model.quantized_memory
        expected = {name: 0 for name in QuantizedMemoryStats.__dataclass_fields__}
        for n in sizes:
            for name, value in _expected_bytes(n, 32, 64 if double_quantization else None).items():
                expected[name] += value
        expected["weight_count"] = len(sizes)
        expected["double_quantized_weight_count"] = len(sizes) if double_quantization else 0
        expected["fp32_equivalent_bytes"] = 4 * sum(sizes)
        expected["logical_payload_bytes"] = expected["packed_code_bytes"] + expected["scale_bytes"]
        expected["resident_payload_bytes"] = expected["logical_payload_bytes"]
        assert stats == QuantizedMemoryStats(**expected)
        packed = flat_logits(model)
        moved = max(abs(a - b) for a, b in zip(dense, packed))
        assert 0.0 < moved < 0.35 * max(abs(a) for a in dense)
        assert native_error(model.quantize_nf4).status_name == "invalid_argument"


def test_qlora_trains_adapters_on_packed_weights_and_merges_to_a_dense_model():
    with DecoderOnlyTransformer(CONFIG) as model:
        model.quantize_nf4()
        state = model.packed_quantized_state()
        assert state[:8] == b"RTNF4ST1"
        model.attach_lora(LoraConfig(targets=ALL))
        losses = []
        with model.adapter_parameters() as adapters, Adam(adapters, learning_rate=1e-2) as adam:
            for _ in range(20):
                with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
                    losses.append(loss.item())
                    loss.backward()
                adam.step()
        assert losses[-1] < losses[0] - 0.1
        # The packed base did not move.
        assert model.packed_quantized_state() == state
        adapted = flat_logits(model)
        model.merge_lora()
        assert not model.quantized_linear_weights
        assert model.quantized_memory.weight_count == 0
        merged = flat_logits(model)
        assert max(abs(a - b) for a, b in zip(adapted, merged)) <= 1e-5
        with model.parameters() as base:
            assert "blocks.0.attention.query.weight" in base.names


def test_packed_state_round_trips_and_rejects_mismatches():
    with DecoderOnlyTransformer(CONFIG) as first, DecoderOnlyTransformer(
        TransformerConfig(**{**CONFIG.__dict__, "random_seed": 8})
    ) as second:
        assert native_error(first.packed_quantized_state).status_name == "runtime_error"
        first.quantize_nf4(double_quantization=False)
        second.quantize_nf4(double_quantization=False)
        with first.parameters() as source, second.parameters() as target:
            target.load_flat_values(source.flat_values())
        state = first.packed_quantized_state()
        second.load_packed_quantized_state(state)
        assert flat_logits(second) == flat_logits(first)
        assert second.packed_quantized_state() == state
        with pytest.raises(TypeError, match="state"):
            second.load_packed_quantized_state("RTNF4ST1")
        for corrupt in (state[:-1], state + b"\0", b"X" + state[1:]):
            assert native_error(lambda: second.load_packed_quantized_state(corrupt)).status_name == (
                "invalid_argument"
            )
        assert flat_logits(second) == flat_logits(first)


def test_rank_stabilized_lora_round_trips_and_scales_by_the_square_root_of_the_rank(tmp_path):
    """rsLoRA (C ABI 2.13): the config reads back from the library, the training checkpoint
    records it and resumes it, and the merged update is alpha/√rank·B·A: after one step from
    the same draws, the rsLoRA model's merged change is √rank times the plain one's (rank 4:
    twice), since B's first Adam step is the same and A is drawn the same."""
    from riftco_transformer import Adam, LoraConfig
    from riftco_transformer.checkpoints import TrainingCheckpoint, save_training_checkpoint
    from riftco_transformer.native import cross_entropy

    from conftest import TINY_CONFIG

    with pytest.raises(TypeError, match="rank_stabilized"):
        LoraConfig(rank_stabilized=1)
    changes = []
    for stabilized in (False, True):
        with DecoderOnlyTransformer(TINY_CONFIG) as model:
            with model.parameters() as parameters:
                before = list(parameters.flat_values())
            config = LoraConfig(rank=4, alpha=8.0, rank_stabilized=stabilized)
            model.attach_lora(config)
            assert model.lora_config == config
            with model.adapter_parameters() as adapters, Adam(adapters,
                                                              learning_rate=1e-2) as optimizer:
                loss = cross_entropy(model([[1, 2, 3, 4]]), [[2, 3, 4, 5]])
                loss.backward()
                loss.close()
                optimizer.step()
                if stabilized:
                    path = tmp_path / "rs.riftckpt"
                    save_training_checkpoint(path, model, optimizer)
            model.merge_lora()
            with model.parameters() as parameters:
                after = list(parameters.flat_values())
            changes.append([a - b for a, b in zip(after, before, strict=True)])
    plain, stabilized_change = changes
    moved = [i for i, value in enumerate(plain) if abs(value) > 1e-6]
    assert moved
    for i in moved:
        assert stabilized_change[i] == pytest.approx(2.0 * plain[i], rel=1e-3, abs=1e-7)
    checkpoint = TrainingCheckpoint.load(path)
    assert checkpoint.manifest["model"]["lora"]["rank_stabilized"] is True
    resumed = checkpoint.resume("cpu")
    assert resumed.model.lora_config.rank_stabilized is True
    resumed.optimizer.close()
    resumed.model.close()


def test_lora_dropout_is_training_only_follows_the_key_and_resumes(tmp_path):
    """Dropout on the adapter input (C ABI 2.15): the config reads back; evaluation mode
    (and a no-dropout model) give the same logits; training forwards take one key each and
    setting the key back replays them bit for bit; a training checkpoint records the key and a
    resume continues it."""
    from riftco_transformer.checkpoints import TrainingCheckpoint, save_training_checkpoint

    def adapted(dropout):
        model = DecoderOnlyTransformer(CONFIG)
        model.attach_lora(LoraConfig(rank=2, targets=ALL, dropout=dropout))
        randomize_adapters(model, 3)
        return model

    with adapted(0.0) as plain, adapted(0.3) as model:
        assert model.lora_config.dropout == pytest.approx(0.3)
        assert model.lora_dropout_key == 0 and model.lora_dropout_enabled is True
        reference = flat_logits(plain)
        assert plain.lora_dropout_key == 0  # p = 0 takes no key
        with model.lora_dropout_disabled():
            assert model.lora_dropout_enabled is False
            assert flat_logits(model) == reference
        assert model.lora_dropout_enabled is True and model.lora_dropout_key == 0
        model.lora_dropout_key = 40
        first, second = flat_logits(model), flat_logits(model)
        assert model.lora_dropout_key == 42
        assert first != reference and first != second
        model.lora_dropout_key = 40
        assert flat_logits(model) == first
        for bad, error in ((-1, ValueError), (1 << 64, ValueError), (1.5, TypeError)):
            with pytest.raises(error, match="lora_dropout_key"):
                model.lora_dropout_key = bad
        assert model.lora_dropout_key == 41
        with pytest.raises(TypeError, match="lora_dropout_enabled"):
            model.lora_dropout_enabled = 1

        with model.adapter_parameters() as adapters, Adam(adapters, learning_rate=1e-2) as adam:
            loss = cross_entropy(model(TOKENS), TARGETS)
            loss.backward()
            loss.close()
            adam.step()
            save_training_checkpoint(tmp_path / "run.riftckpt", model, adam)
            assert model.lora_dropout_key == 42
            expected = flat_logits(model)
        checkpoint = TrainingCheckpoint.load(tmp_path / "run.riftckpt")
        record = checkpoint.manifest["model"]["lora"]
        assert record["dropout"] == pytest.approx(0.3) and record["dropout_key"] == 42
        resumed = checkpoint.resume("cpu")
        try:
            assert resumed.model.lora_dropout_key == 42
            assert flat_logits(resumed.model) == expected
        finally:
            resumed.optimizer.close()
            resumed.model.close()
