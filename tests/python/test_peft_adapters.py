"""PEFT LoRA adapters (interchange/peft.py): our adapters written as PEFT adapter directories
(from a live model, a LoRA/QLoRA checkpoint, a post-training result: the adapter-only save) and
PEFT adapters attached onto a base, every refusal, the CLI paths (export --to peft, --adapter,
post-train --adapter-output, inspect), and, when the oracle venv named by
$RIFTCO_TRANSFORMER_HF_PYTHON has transformers and peft, PEFT itself reading ours and writing
adapters we read."""

from __future__ import annotations

import json
import math
import random
import shutil
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from test_cli import INSTRUCTIONS, riftco
from test_decoder_families import forward_values
from test_huggingface_export import (
    TOKENS,
    close_enough,
    hf_python,
    max_difference,
    run_oracle,
    tokenizer,
    variant_config,
)

from riftco_transformer import LlamaMistralTransformer, LoraConfig, load_pretrained
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.checkpoints import TrainingCheckpoint
from riftco_transformer.instructions import read_instructions_jsonl
from riftco_transformer.interchange import (
    capture_lora_adapter,
    export_huggingface,
    export_peft,
    load_peft_adapter,
    read_peft_adapter,
    read_safetensors,
    write_safetensors,
)
from riftco_transformer.interchange.huggingface import read_safetensors_header
from riftco_transformer.post_training import PostTrainingConfig, post_train

ALL_LINEAR = ("attention.query", "attention.key", "attention.value", "attention.output",
              "feed_forward.gate", "feed_forward.up", "feed_forward.down")
HF_NAMES = {"attention.query": "self_attn.q_proj", "attention.key": "self_attn.k_proj",
            "attention.value": "self_attn.v_proj", "attention.output": "self_attn.o_proj",
            "feed_forward.gate": "mlp.gate_proj", "feed_forward.up": "mlp.up_proj",
            "feed_forward.down": "mlp.down_proj"}
# The families, each with the targets PEFT can express (Phi-3 fuses q/k/v and gate/up).
FAMILY_TARGETS = {
    "llama": (*ALL_LINEAR, "language_model_head"),
    "mistral": ALL_LINEAR,
    "qwen2": ("attention.query", "attention.value"),
    "qwen3": (*ALL_LINEAR, "language_model_head"),
    "gemma2": ALL_LINEAR,
    "gemma3": ("attention.key", "feed_forward.down"),
    "phi3": ("attention.output", "feed_forward.down", "language_model_head"),
}


def base_bundle(variant: str = "llama", seed: int = 11) -> ModelBundle:
    with LlamaMistralTransformer(variant_config(variant, seed)) as model, tokenizer() as vocabulary:
        return ModelBundle.capture(model, vocabulary, "pretrained")


def randomize_adapter(model, seed: int = 3, scale: float = 0.3) -> None:
    """Adapter values with B != 0, so the adapter changes the logits."""
    generator = random.Random(seed)
    with model.adapter_parameters() as parameters:
        parameters.load_flat_values([generator.uniform(-scale, scale)
                                     for _ in range(parameters.total_numel)])


def logits(model, tokens=TOKENS) -> list[float]:
    return forward_values(model, tokens)


def adapted(bundle: ModelBundle, lora: LoraConfig, seed: int = 3):
    """A runtime of ``bundle`` with ``lora`` attached and random factors."""
    runtime = bundle.instantiate()
    runtime.model.attach_lora(lora)
    randomize_adapter(runtime.model, seed)
    return runtime


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def assert_unchanged(model, before) -> None:
    """A refused load changed nothing: no adapter, the same logits."""
    assert model.lora_config is None
    assert logits(model) == before


# ---- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILY_TARGETS))
def test_an_adapter_round_trips_through_peft_with_the_same_logits(tmp_path, family):
    bundle = base_bundle(family)
    lora = LoraConfig(rank=3, alpha=5.0, targets=FAMILY_TARGETS[family],
                      rank_stabilized=family in ("qwen3", "gemma2"))
    with adapted(bundle, lora) as runtime:
        expected = logits(runtime.model)
        with bundle.instantiate() as plain:
            assert max_difference(logits(plain.model), expected) > 1e-3  # the adapter acts
        directory = export_peft(runtime.model, tmp_path / "adapter")
    assert listing(directory) == ["adapter_config.json", "adapter_model.safetensors"]
    assert listing(tmp_path) == ["adapter"]  # no temporary left
    with bundle.instantiate() as runtime:
        attached = load_peft_adapter(runtime.model, directory)
        assert (attached.rank, attached.alpha, attached.rank_stabilized) == (3, 5.0,
                                                                              lora.rank_stabilized)
        # A head tied to the embeddings takes no adapter (ours attaches none there either).
        tied = bundle.config.tie_embeddings
        assert set(attached.targets) == set(lora.targets) - ({"language_model_head"} if tied
                                                             else set())
        worst = max_difference(logits(runtime.model), expected)
        assert worst <= 1e-6, worst
        print(f"{family}: max |exported - original| {worst:.3g}")


def test_the_files_follow_peft_conventions_and_hold_our_factors(tmp_path):
    bundle = base_bundle("llama")
    lora = LoraConfig(rank=2, alpha=6.0, targets=(*ALL_LINEAR, "language_model_head"))
    with adapted(bundle, lora) as runtime:
        with runtime.model.adapter_parameters() as parameters:
            ours = dict(zip(parameters.names, parameters.shapes, strict=True))
            values = parameters.flat_values()
        directory = export_peft(runtime.model, tmp_path / "adapter",
                                base_model_name_or_path="org/tiny-llama")
    config = json.loads((directory / "adapter_config.json").read_text())
    assert {key: config[key] for key in ("peft_type", "task_type", "r", "lora_alpha",
                                         "lora_dropout", "use_rslora", "bias", "use_dora",
                                         "base_model_name_or_path")} == {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 6.0,
        "lora_dropout": 0.0, "use_rslora": False, "bias": "none", "use_dora": False,
        "base_model_name_or_path": "org/tiny-llama"}
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj", "lm_head"]
    tensors, metadata = read_safetensors(directory / "adapter_model.safetensors")
    assert metadata == {"format": "pt",
                        "riftco.base.weights_sha256": bundle.manifest["weights"]["sha256"]}
    config_ = bundle.config
    d = config_.resolved_head_width
    widths = {"attention.query": (config_.query_head_count * d, 16),
              "attention.key": (config_.key_value_head_count * d, 16),
              "attention.value": (config_.key_value_head_count * d, 16),
              "attention.output": (16, config_.query_head_count * d),
              "feed_forward.gate": (24, 16), "feed_forward.up": (24, 16),
              "feed_forward.down": (16, 24)}
    expected = {}
    for block in range(config_.block_count):
        for target, (rows, columns) in widths.items():
            module = f"base_model.model.model.layers.{block}.{HF_NAMES[target]}"
            expected[f"{module}.lora_A.weight"] = ((2, columns), f"blocks.{block}.{target}.lora_a")
            expected[f"{module}.lora_B.weight"] = ((rows, 2), f"blocks.{block}.{target}.lora_b")
    expected["base_model.model.lm_head.lora_A.weight"] = ((2, 16), "language_model_head.lora_a")
    expected["base_model.model.lm_head.lora_B.weight"] = ((config_.vocabulary_size, 2),
                                                          "language_model_head.lora_b")
    assert set(tensors) == set(expected)
    offsets, offset = {}, 0
    for name, shape in ours.items():
        offsets[name] = (offset, math.prod(shape))
        offset += math.prod(shape)
    for name, (shape, ours_name) in expected.items():
        assert tensors[name].shape == shape, name
        assert ours[f"{ours_name}.weight"] == shape
        begin, count = offsets[f"{ours_name}.weight"]
        assert tensors[name].values == values[begin:begin + count], name


def test_rslora_scaling_is_written_as_use_rslora_and_read_back(tmp_path):
    """alpha/sqrt(r) and alpha/r differ (r = 4): the flag decides the logits both ways."""
    bundle = base_bundle("mistral")
    lora = LoraConfig(rank=4, alpha=3.0, targets=("attention.query",), rank_stabilized=True)
    with adapted(bundle, lora) as runtime:
        expected = logits(runtime.model)
        directory = export_peft(runtime.model, tmp_path / "adapter")
    assert json.loads((directory / "adapter_config.json").read_text())["use_rslora"] is True
    with bundle.instantiate() as runtime:
        assert load_peft_adapter(runtime.model, directory).rank_stabilized
        assert max_difference(logits(runtime.model), expected) <= 1e-6
    config = json.loads((directory / "adapter_config.json").read_text())
    config["use_rslora"] = False
    (directory / "adapter_config.json").write_text(json.dumps(config))
    with bundle.instantiate() as runtime:
        load_peft_adapter(runtime.model, directory)
        assert max_difference(logits(runtime.model), expected) > 1e-4
