"""PEFT LoRA adapters (interchange/peft.py): our adapters written as PEFT adapter directories
(from a live model, a LoRA/QLoRA checkpoint, a post-training result: the adapter-only save) and
PEFT adapters attached onto a base, every refusal, the CLI paths (export --to peft, --adapter,
post-train --adapter-output, inspect), and, when the oracle venv named by
$RIFTCO_TRANSFORMER_HF_PYTHON has transformers and peft, PEFT itself reading ours and writing
adapters we read."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from conftest import PYTHON_SOURCE
from riftco_transformer import (
    LlamaMistralTransformer,
    LoraConfig,
    RiftcoTransformerError,
    load_pretrained,
)
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.checkpoints import TrainingCheckpoint
from riftco_transformer.instructions import read_instructions_jsonl
from riftco_transformer.interchange import (
    export_huggingface,
    export_peft,
    load_peft_adapter,
    read_peft_adapter,
    read_safetensors,
    write_safetensors,
)
from riftco_transformer.post_training import PostTrainingConfig, post_train
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


def attachable_targets(bundle: ModelBundle, family: str) -> tuple[str, ...]:
    """FAMILY_TARGETS[family] without the head when ``bundle`` ties it to the embedding (a
    tied head is the embedding table, and attaching an adapter to it is refused)."""
    targets = FAMILY_TARGETS[family]
    if bundle.config.tie_embeddings:
        targets = tuple(target for target in targets if target != "language_model_head")
    return targets


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
    targets = FAMILY_TARGETS[family]
    tied = bundle.config.tie_embeddings
    if tied and "language_model_head" in targets:
        # A tied head is the embedding table: attaching to it is refused, never skipped.
        with bundle.instantiate() as runtime:
            with pytest.raises(RiftcoTransformerError, match="head is tied to the token "
                               "embedding; call untie_embeddings"):
                runtime.model.attach_lora(LoraConfig(rank=3, alpha=5.0, targets=targets))
            assert runtime.model.lora_config is None
    lora = LoraConfig(rank=3, alpha=5.0, targets=attachable_targets(bundle, family),
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
        assert set(attached.targets) == set(lora.targets)
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


def test_lora_dropout_is_written_from_the_config_and_read_back_in_evaluation_mode(tmp_path):
    """lora_dropout both ways: export writes the config's dropout; import sets it and leaves
    the model in evaluation mode (as PEFT's from_pretrained), so the logits are the adapted
    ones; training mode then drops."""
    bundle = base_bundle("mistral")
    lora = LoraConfig(rank=2, alpha=4.0, targets=("attention.query", "feed_forward.down"),
                      dropout=0.1)
    with adapted(bundle, lora) as runtime:
        with runtime.model.lora_dropout_disabled():
            expected = logits(runtime.model)
        directory = export_peft(runtime.model, tmp_path / "adapter")
        written = runtime.model.lora_config.dropout
    assert json.loads((directory / "adapter_config.json").read_text())["lora_dropout"] == written
    assert written == pytest.approx(0.1)
    with bundle.instantiate() as runtime:
        assert load_peft_adapter(runtime.model, directory).dropout == written
        assert runtime.model.lora_config.dropout == written
        assert runtime.model.lora_dropout_enabled is False
        assert logits(runtime.model) == expected
        assert runtime.model.lora_dropout_key == 0
        runtime.model.lora_dropout_enabled = True
        assert logits(runtime.model) != expected
        assert runtime.model.lora_dropout_key == 1


# ---- post-training, checkpoints: the adapter-only save --------------------------------------


def train(base: ModelBundle, method: str, directory: Path, steps: int = 3, **lora):
    """A short post-training run of ``method`` on ``base`` with a checkpoint at its end."""
    config = PostTrainingConfig(steps=steps, batch_size=2, backend="cpu", learning_rate=0.05,
                                fine_tuning_method=method,
                                lora=LoraConfig(**{"rank": 2, "alpha": 4.0,
                                                   "targets": ALL_LINEAR, **lora}))
    path = directory / f"{method}.riftckpt"
    result = post_train(base, read_instructions_jsonl(INSTRUCTIONS)[:8], config,
                        checkpoint_path=path, checkpoint_interval=steps)
    return result, path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A llama base (saved), and its LoRA, QLoRA and full runs with their checkpoints."""
    directory = tmp_path_factory.mktemp("runs")
    base = base_bundle("llama")
    base_path = base.save(directory / "base.rift")
    trained = {method: train(base, method, directory) for method in ("lora", "qlora", "full")}
    return directory, base, base_path, trained


def test_the_adapter_only_save_equals_the_checkpoints_export_and_merges_to_the_bundle(
        runs, tmp_path):
    _, base, base_path, trained = runs
    result, checkpoint = trained["lora"]
    adapter = result.adapter
    assert adapter.base == {"artifact_id": base.artifact_id,
                            "weights_sha256": base.manifest["weights"]["sha256"]}
    saved = adapter.save(tmp_path / "saved")
    exported = export_peft(checkpoint, tmp_path / "exported")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (saved / name).read_bytes() == (exported / name).read_bytes(), name
    with load_pretrained(base_path, adapter=saved) as loaded:  # artifact id from the bundle
        loaded.model.merge_lora()
        merged = logits(loaded.model)
    with result.bundle.instantiate(attention="flash") as tuned:
        assert max_difference(merged, logits(tuned.model)) <= 1e-6


def test_a_qlora_checkpoint_exports_its_adapter_with_the_base_bundles_id(runs, tmp_path):
    """A QLoRA checkpoint's base is packed: the adapter records the base bundle's artifact id
    only, which a model loaded from that bundle proves and an instantiated one cannot."""
    _, base, base_path, trained = runs
    result, checkpoint = trained["qlora"]
    directory = export_peft(TrainingCheckpoint.load(checkpoint), tmp_path / "adapter")
    adapter = read_peft_adapter(directory)
    assert adapter.base == {"artifact_id": base.artifact_id}
    assert result.adapter.base["artifact_id"] == base.artifact_id
    tensors, _ = read_safetensors(directory / "adapter_model.safetensors")
    assert sorted(t.values.tolist() for t in tensors.values()) == sorted(
        t.values.tolist() for t in read_safetensors(
            result.adapter.save(tmp_path / "saved") / "adapter_model.safetensors")[0].values())
    with load_pretrained(base_path, adapter=directory) as loaded:
        assert loaded.model.lora_attached
    with base.instantiate() as runtime:
        before = logits(runtime.model)
        with pytest.raises(ValueError, match="records its base .artifact_id [0-9a-f]{64}., and "
                           "none of these can be checked on this model"):
            load_peft_adapter(runtime.model, directory)
        assert_unchanged(runtime.model, before)
        load_peft_adapter(runtime.model, directory, check_base=False)
        assert runtime.model.lora_attached


def test_a_full_checkpoint_a_bundle_and_other_files_are_refused_naming_them(runs, tmp_path):
    directory, base, base_path, trained = runs
    full = trained["full"][1]
    tuned = trained["lora"][0].bundle.save(tmp_path / "tuned.rift")
    out = tmp_path / "out"
    cases = [
        (full, f"{full} is a checkpoint of a full fine-tuning run .optimizer scope 'model'.: "
               "it holds no LoRA adapter"),
        (tuned, f"{tuned} is a .rift bundle, which holds no LoRA adapter .the adapter of its "
                "lora run was merged into its weights"),
        (base_path, f"{base_path} is a .rift bundle, which holds no LoRA adapter .it holds "
                    "dense weights only"),
        (base, "the bundle is a .rift bundle"),
    ]
    safetensors = write_safetensors(tmp_path / "w.safetensors", {"x": ((1,), [1.0])})
    cases.append((safetensors, "is a safetensors file, not the .riftckpt checkpoint"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(20))
    cases.append((gguf, "model.gguf is a GGUF file, not the .riftckpt checkpoint"))
    for source, fragment in cases:
        with pytest.raises(ValueError, match=fragment):
            export_peft(source, out)
        assert not out.exists()


def test_models_without_an_adapter_gpt_and_fused_phi3_adapters_are_refused(tmp_path):
    from conftest import TINY_CONFIG
    from riftco_transformer import DecoderOnlyTransformer

    out = tmp_path / "out"
    bundle = base_bundle("llama")
    with bundle.instantiate() as runtime:
        with pytest.raises(ValueError, match="no attached LoRA adapter .never attached."):
            export_peft(runtime.model, out)
        runtime.model.attach_lora(LoraConfig(rank=2, targets=("attention.query",)))
        runtime.model.merge_lora()
        with pytest.raises(ValueError, match="no attached LoRA adapter .merged into its weights."):
            export_peft(runtime.model, out)
    with DecoderOnlyTransformer(TINY_CONFIG) as gpt:
        gpt.attach_lora(LoraConfig(rank=2))
        with pytest.raises(ValueError,
                           match="our GPT decoder .riftco_decoder_v1. has no PEFT form"):
            export_peft(gpt, out)
    with adapted(base_bundle("phi3"), LoraConfig(rank=2, targets=("attention.output",
                                                                  "feed_forward.up"))) as runtime:
        with pytest.raises(ValueError, match="phi3 fuses feed_forward.gate, feed_forward.up into "
                           "one module .gate_up_proj., which PEFT adapts with one A shared by "
                           "the parts, while this adapter gives feed_forward.up factors of its "
                           "own"):
            export_peft(runtime.model, out)
    assert not out.exists()


def test_an_existing_destination_is_refused_and_kept(tmp_path):
    with adapted(base_bundle("llama"), LoraConfig(rank=2)) as runtime:
        taken = tmp_path / "taken"
        taken.mkdir()
        (taken / "keep.txt").write_text("mine")
        with pytest.raises(ValueError, match="exists and is not empty: PEFT export writes a new "
                           "directory"):
            export_peft(runtime.model, taken)
        assert listing(taken) == ["keep.txt"]
        file = tmp_path / "file"
        file.write_text("mine")
        with pytest.raises(ValueError, match="exists and is not a directory"):
            export_peft(runtime.model, file)
        assert file.read_text() == "mine"
        empty = tmp_path / "empty"
        empty.mkdir()  # an empty directory is filled
        assert listing(export_peft(runtime.model, empty)) == ["adapter_config.json",
                                                              "adapter_model.safetensors"]
    assert listing(tmp_path) == ["empty", "file", "taken"]


# ---- reading: every refusal leaves the model unchanged --------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A llama base and an all-linear rank-2 adapter on it, exported; the adapted logits."""
    directory = tmp_path_factory.mktemp("exported")
    bundle = base_bundle("llama")
    with adapted(bundle, LoraConfig(rank=2, alpha=4.0, targets=ALL_LINEAR)) as runtime:
        expected = logits(runtime.model)
        export_peft(runtime.model, directory / "adapter")
    return bundle, directory / "adapter", expected


def copy_adapter(source: Path, destination: Path, **changes) -> Path:
    """A copy of the adapter directory with ``changes`` to its config (None deletes a key)."""
    shutil.copytree(source, destination)
    path = destination / "adapter_config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DELETE:
            config.pop(key)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return destination


DELETE = object()
Q_A1 = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"

CONFIG_REFUSALS = [
    ({"peft_type": "LOHA"}, "peft_type 'LOHA' is not supported: only LoRA adapters"),
    ({"task_type": "SEQ_CLS"}, "task_type 'SEQ_CLS' is not supported"),
    ({"use_dora": True}, "use_dora = true is not supported"),
    ({"bias": "all"}, "bias 'all' is not supported"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out = true is not supported"),
    ({"modules_to_save": ["lm_head"]}, 'modules_to_save = \\["lm_head"\\] is not supported'),
    ({"layers_to_transform": [0]}, "layers_to_transform = \\[0\\] is not supported"),
    ({"lora_bias": True}, "lora_bias = true is not supported"),
    ({"layer_replication": [[0, 1]]}, "layer_replication = \\[\\[0, 1\\]\\] is not supported"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern gives 'q_proj' 8, not 2"),
    ({"alpha_pattern": {"v_proj": 1}}, "alpha_pattern gives 'v_proj' 1, not 4.0"),
    ({"init_lora_weights": "pissa"}, "init_lora_weights 'pissa' is not supported"),
    ({"r": 0}, "r must be a positive integer, not 0"),
    ({"r": 3}, "tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has "
               "shape \\[2, 16\\], not \\[r, in\\] with r = 3"),
    ({"lora_alpha": "8"}, "lora_alpha must be a positive number, not '8'"),
    ({"lora_alpha": 1e-45}, "alpha/rank = 1e-45/2 must be finite and > 0 in float32"),
    ({"use_rslora": "yes"}, "use_rslora must be true or false, not 'yes'"),
    ({"lora_dropout": 1.0}, "lora_dropout must be a number in \\[0, 1\\), not 1.0"),
    ({"lora_dropout": "0.1"}, "lora_dropout must be a number in \\[0, 1\\), not '0.1'"),
    ({"target_modules": DELETE}, "target_modules is missing"),
    ({"target_modules": 5}, "target_modules must be a list of module names or a pattern string"),
    ({"target_modules": "(["}, "target_modules '\\(\\[' is not a regular expression"),
    ({"target_modules": "nothing"},
     "target_modules 'nothing' selects no projection of this llama model"),
    ({"exclude_modules": {"k_proj": 1}}, "exclude_modules must be a list of module names"),
    ({"target_modules": ["q_proj", "embed_tokens"]},
     "target_modules entry 'embed_tokens' names no projection of this llama model that LoRA "
     "can adapt \\(its modules: q_proj, k_proj"),
    ({"target_modules": "model\\.layers\\.0\\..*"},
     "target_modules selects model.layers.0.self_attn.q_proj but not "
     "model.layers.1.self_attn.q_proj: layer-selective adapters are not supported"),
    ({"target_modules": ["q_proj"]},
     "tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight is not a factor of "
     "a module target_modules selects"),
    ({"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                         "down_proj", "lm_head"]},
     "no tensor base_model.model.lm_head.lora_A.weight \\(target_modules selects lm_head\\)"),
    ({"exclude_modules": ["k_proj"]},
     "tensor base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight is not a factor"),
]


@pytest.mark.parametrize("changes, fragment", CONFIG_REFUSALS,
                         ids=[f"{next(iter(c))}={c[next(iter(c))]!r}"[:40]
                              for c, _ in CONFIG_REFUSALS])
def test_a_config_option_we_do_not_honour_is_refused_naming_it(exported, tmp_path, changes,
                                                                fragment):
    bundle, directory, _ = exported
    adapter = copy_adapter(directory, tmp_path / "adapter", **changes)
    with bundle.instantiate() as runtime:
        before = logits(runtime.model)
        with pytest.raises(ValueError, match=fragment) as raised:
            load_peft_adapter(runtime.model, adapter)
        assert "adapter_" in str(raised.value)  # the file is named
        assert_unchanged(runtime.model, before)


@pytest.mark.parametrize("changes", [
    {"target_modules": "all-linear"},
    {"target_modules": "model\\.layers\\.\\d+\\.(self_attn|mlp)\\.\\w+_proj"},
    {"target_modules": ["self_attn.q_proj", "k_proj", "v_proj", "o_proj", "mlp.gate_proj",
                        "up_proj", "down_proj"]},
    {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj", "lm_head"], "exclude_modules": ["lm_head"]},
    {"lora_dropout": 0.1, "peft_version": "9.9.9", "use_bdlora": None, "megatron_core": "x",
     "inference_mode": False, "init_lora_weights": "gaussian", "rank_pattern": {"q_proj": 2},
     "task_type": None},
    {"init_lora_weights": False, "exclude_modules": "lm_head",
     "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj", "lm_head"]},
], ids=["all-linear", "regex", "suffixes", "exclude", "neutral-options", "exclude-regex"])
def test_equivalent_configs_load_the_same_adapter(exported, tmp_path, changes):
    bundle, directory, expected = exported
    adapter = copy_adapter(directory, tmp_path / "adapter", **changes)
    with bundle.instantiate() as runtime:
        load_peft_adapter(runtime.model, adapter)
        assert logits(runtime.model) == expected


def rewrite_tensors(directory: Path, change) -> None:
    """Rewrite adapter_model.safetensors with ``change(tensors)`` applied (F32)."""
    path = directory / "adapter_model.safetensors"
    tensors, metadata = read_safetensors(path)
    entries = {name: (tensor.shape, tensor.values) for name, tensor in tensors.items()}
    change(entries)
    path.unlink()
    write_safetensors(path, entries, metadata)


@pytest.mark.parametrize("change, fragment", [
    (lambda t: t.update({Q_A1: ((2, 15), [0.0] * 30)}),
     f"tensor {Q_A1} has shape \\[2, 15\\], expected \\[2, 16\\]: "
     "model.layers.1.self_attn.q_proj maps 16 to 16 features in this model, r = 2"),
    (lambda t: t.pop(Q_A1.replace("lora_A", "lora_B")),
     "no tensor base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight for the lora_A"),
    (lambda t: [t.pop(Q_A1), t.pop(Q_A1.replace("lora_A", "lora_B"))],
     f"no tensor {Q_A1} \\(target_modules selects model.layers.1.self_attn.q_proj\\)"),
    (lambda t: t.update({"base_model.model.lm_head.weight": ((1, 1), [0.0])}),
     "tensor 'base_model.model.lm_head.weight' is not a LoRA factor"),
    (lambda t: t.update({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight":
                         ((2, 16), [0.0] * 32)}),
     "lora_A.default.weight' is not a LoRA factor"),
    (lambda t: t.update({Q_A1: ((2, 4, 4), [0.0] * 32)}),
     f"tensor {Q_A1} has shape \\[2, 4, 4\\], not a matrix"),
    (lambda t: t.clear(), "adapter_model.safetensors: holds no tensor"),
], ids=["shape", "missing-B", "missing-module", "not-lora", "adapter-name", "three-d",
        "empty"])
def test_a_tensor_that_does_not_fit_is_refused_naming_it(exported, tmp_path, change, fragment):
    bundle, directory, _ = exported
    adapter = copy_adapter(directory, tmp_path / "adapter")
    rewrite_tensors(adapter, change)
    with bundle.instantiate() as runtime:
        before = logits(runtime.model)
        with pytest.raises(ValueError, match=fragment) as raised:
            load_peft_adapter(runtime.model, adapter)
        assert "adapter_model.safetensors" in str(raised.value)
        assert_unchanged(runtime.model, before)


def test_missing_files_a_pickle_and_another_base_are_refused(exported, tmp_path):
    bundle, directory, expected = exported
    pickled = copy_adapter(directory, tmp_path / "pickled")
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    no_config = copy_adapter(directory, tmp_path / "no-config")
    (no_config / "adapter_config.json").unlink()
    with bundle.instantiate() as runtime:
        before = logits(runtime.model)
        with pytest.raises(ValueError, match="adapter_model.bin: a pickled adapter is not read"):
            load_peft_adapter(runtime.model, pickled)
        with pytest.raises(FileNotFoundError, match="adapter_config.json: no such file"):
            load_peft_adapter(runtime.model, no_config)
        with pytest.raises(FileNotFoundError, match="no such directory"):
            load_peft_adapter(runtime.model, tmp_path / "absent")
        assert_unchanged(runtime.model, before)
    other = base_bundle("llama", seed=12)  # the same shapes, other weights
    with other.instantiate() as runtime:
        before = logits(runtime.model)
        with pytest.raises(ValueError, match="the adapter was trained on another base "
                           f"\\(weights_sha256 {bundle.manifest['weights']['sha256']} in the "
                           f"adapter, {other.manifest['weights']['sha256']} for this model\\); "
                           "attach it anyway with check_base=False"):
            load_peft_adapter(runtime.model, directory)
        assert_unchanged(runtime.model, before)
        load_peft_adapter(runtime.model, directory, check_base=False)
        assert runtime.model.lora_attached


def test_a_model_with_an_adapter_gpt_and_a_tied_head_are_refused(exported, tmp_path):
    from conftest import TINY_CONFIG
    from riftco_transformer import DecoderOnlyTransformer

    bundle, directory, _ = exported
    with bundle.instantiate() as runtime:
        load_peft_adapter(runtime.model, directory)
        with pytest.raises(ValueError, match="the model already has a LoRA adapter .attached."):
            load_peft_adapter(runtime.model, directory)
        runtime.model.merge_lora()
        with pytest.raises(ValueError, match="already has a LoRA adapter .merged."):
            load_peft_adapter(runtime.model, directory)
    with DecoderOnlyTransformer(TINY_CONFIG) as gpt:
        with pytest.raises(ValueError, match="our GPT decoder .riftco_decoder_v1. has no PEFT "
                           "form: loading a PEFT adapter is for the rotary families"):
            load_peft_adapter(gpt, directory)
        assert gpt.lora_config is None
    head = copy_adapter(directory, tmp_path / "head", target_modules=["q_proj", "lm_head"])
    tied = base_bundle("qwen3")
    with tied.instantiate() as runtime:
        with pytest.raises(ValueError, match="target_modules entry 'lm_head' names no projection "
                           "of this qwen3 model that LoRA can adapt \\(this model ties its head"):
            load_peft_adapter(runtime.model, head, check_base=False)
        assert runtime.model.lora_config is None


def test_bf16_factors_load_as_transformers_reads_them(exported, tmp_path):
    """A BF16 adapter (PEFT saves the training dtype) loads exactly: the same logits as the
    F32 adapter of its rounded values."""
    from riftco_transformer.interchange.huggingface_export import _bf16

    bundle, directory, _ = exported
    tensors, metadata = read_safetensors(directory / "adapter_model.safetensors")
    header, payload, offset = {"__metadata__": metadata}, [], 0
    rounded = {}
    for name, tensor in tensors.items():
        data = _bf16(tensor.values, name)
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        payload.append(data)
        offset += len(data)
        widened = array("I", [int.from_bytes(data[i:i + 2], "little") << 16
                              for i in range(0, len(data), 2)])
        rounded[name] = (tensor.shape, array("f", widened.tobytes()))
    encoded = json.dumps(header).encode()
    bf16 = copy_adapter(directory, tmp_path / "bf16")
    (bf16 / "adapter_model.safetensors").write_bytes(
        len(encoded).to_bytes(8, "little") + encoded + b"".join(payload))
    assert {span.dtype for span in read_peft_adapter(bf16).tensors.values()} == {"BF16"}
    f32 = copy_adapter(directory, tmp_path / "f32")
    rewrite_tensors(f32, lambda entries: entries.update(rounded))
    with bundle.instantiate() as first, bundle.instantiate() as second:
        load_peft_adapter(first.model, bf16)
        load_peft_adapter(second.model, f32)
        assert logits(first.model) == logits(second.model)


def test_phi3_fused_modules_load_as_the_hand_merged_weights(tmp_path):
    """A PEFT adapter on Phi-3's fused qkv_proj and gate_up_proj (one A shared by the parts)
    gives the logits of the weights W + (alpha/r)·B·A merged here with numpy."""
    np = pytest.importorskip("numpy")
    bundle = base_bundle("phi3")
    config = bundle.config
    rank, alpha = 2, 3.0
    d = config.resolved_head_width
    qkv_rows = (config.query_head_count + 2 * config.key_value_head_count) * d
    generator = np.random.default_rng(5)
    shapes = {"self_attn.qkv_proj": (qkv_rows, 16), "mlp.gate_up_proj": (48, 16),
              "self_attn.o_proj": (16, config.query_head_count * d)}
    tensors, factors = {}, {}
    for block in range(config.block_count):
        for module, (rows, columns) in shapes.items():
            a = generator.uniform(-0.4, 0.4, (rank, columns)).astype(np.float32)
            b = generator.uniform(-0.4, 0.4, (rows, rank)).astype(np.float32)
            name = f"base_model.model.model.layers.{block}.{module}"
            tensors[f"{name}.lora_A.weight"] = ((rank, columns), a.ravel())
            tensors[f"{name}.lora_B.weight"] = ((rows, rank), b.ravel())
            factors[(block, module)] = (a, b)
    directory = tmp_path / "phi3-adapter"
    directory.mkdir()
    write_safetensors(directory / "adapter_model.safetensors", tensors)
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "target_modules": ["qkv_proj", "gate_up_proj", "o_proj"], "bias": "none"}))
    weights = np.array(bundle.weights, dtype=np.float32)
    parts = {"self_attn.qkv_proj": [("attention.query", config.query_head_count * d),
                                    ("attention.key", config.key_value_head_count * d),
                                    ("attention.value", config.key_value_head_count * d)],
             "mlp.gate_up_proj": [("feed_forward.gate", 24), ("feed_forward.up", 24)],
             "self_attn.o_proj": [("attention.output", 16)]}
    specs = {spec.name: spec for spec in bundle.parameters}
    for (block, module), (a, b) in factors.items():
        delta = (alpha / rank) * (b.astype(np.float64) @ a.astype(np.float64))
        row = 0
        for target, rows in parts[module]:
            spec = specs[f"blocks.{block}.{target}.weight"]
            view = weights[spec.offset:spec.offset + spec.count].reshape(spec.shape)
            view += delta[row:row + rows].astype(np.float32)
            row += rows
    with bundle.instantiate() as runtime, LlamaMistralTransformer(config) as merged:
        with merged.parameters() as parameters:
            parameters.load_flat_values(weights)
        lora = load_peft_adapter(runtime.model, directory)
        assert lora.targets == ("attention.query", "attention.key", "attention.value",
                                "attention.output", "feed_forward.gate", "feed_forward.up")
        worst = max_difference(logits(runtime.model), logits(merged))
        assert worst <= 1e-5, worst
        print(f"phi3 fused: max |ours - hand-merged| {worst:.3g}")


# ---- the command line -----------------------------------------------------------------------


def refused(*arguments) -> str:
    """riftco's one-line error (exit status 2)."""
    completed = riftco(*arguments, check=False)
    assert completed.returncode == 2, (completed.stdout, completed.stderr)
    assert completed.stderr.count("\n") == 1, completed.stderr
    return completed.stderr


def test_riftco_export_to_peft_inspect_and_the_adapter_on_generate_and_evaluate(runs, tmp_path):
    """`riftco export --to peft` of the LoRA checkpoint, applied with --adapter to the base,
    generates and scores as the run's own (merged) bundle."""
    _, base, base_path, trained = runs
    result, checkpoint = trained["lora"]
    tuned = result.bundle.save(tmp_path / "tuned.rift")
    adapter = tmp_path / "adapter"
    done = riftco("export", checkpoint, adapter, "--to", "peft", "--base-model", "org/base")
    assert f"-> {adapter} (PEFT adapter)" in done.stdout
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "org/base"
    shown = riftco("inspect", adapter).stdout
    for line in (f"peft adapter {adapter}", "type         LoRA r=2 alpha=4 scaling=2 (alpha/r)",
                 "targets      q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
                 "modules      14 (2 q_proj, 2 k_proj, 2 v_proj, 2 o_proj, 2 gate_proj, "
                 "2 up_proj, 2 down_proj)", "tensors      28 (28 F32), ", "base         org/base",
                 f"base check   artifact_id {base.artifact_id}, weights_sha256 "
                 f"{base.manifest['weights']['sha256']}"):
        assert line in shown, shown
    prompt = ("generate", "--prompt", "the cat", "--max-new-tokens", 8)
    with_adapter = riftco(*prompt, "--bundle", base_path, "--adapter", adapter).stdout
    assert with_adapter == riftco(*prompt, "--bundle", tuned).stdout
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 4)
    scores = [json.loads(riftco("evaluate", *source, "--file", text, "--json").stdout)["loss"]
              for source in (("--bundle", base_path, "--adapter", adapter), ("--bundle", tuned),
                             ("--bundle", base_path))]
    assert scores[0] == pytest.approx(scores[1], abs=1e-6) and scores[0] != scores[2]
    chat = subprocess.run([sys.executable, "-m", "riftco_transformer", "chat", "--model",
                           str(base_path), "--adapter", str(adapter)], input="/exit\n",
                          env={**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)},
                          capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr


def test_riftco_refuses_peft_exports_and_adapters_that_do_not_fit(runs, tmp_path):
    directory, base, base_path, trained = runs
    checkpoint = trained["lora"][1]
    tuned = trained["lora"][0].bundle.save(tmp_path / "tuned.rift")
    out = tmp_path / "out"
    assert f"{tuned} is a .rift bundle, which holds no LoRA adapter" in refused(
        "export", tuned, out, "--to", "peft")
    assert "--to peft writes a directory, not a .safetensors file ('out.safetensors')" in \
        refused("export", checkpoint, tmp_path / "out.safetensors", "--to", "peft")
    assert "--to hf writes a directory, not a .riftckpt file" in refused(
        "export", base_path, tmp_path / "out.riftckpt", "--to", "hf")
    assert "a PEFT adapter is written in F32" in refused("export", checkpoint, out, "--to",
                                                         "peft", "--dtype", "f16")
    assert "--from is for bundle and safetensors sources" in refused(
        "export", checkpoint, out, "--to", "peft", "--from", "rift")
    assert "--base-model is for PEFT adapter destinations (--to peft; this one is gguf)" in \
        refused("export", base_path, tmp_path / "out.gguf", "--base-model", "x")
    assert listing(tmp_path) == ["tuned.rift"]
    adapter = export_peft(checkpoint, tmp_path / "adapter")
    other = base_bundle("llama", seed=12).save(tmp_path / "other.rift")
    prompt = ("generate", "--prompt", "hi", "--max-new-tokens", 2)
    assert "the adapter was trained on another base (artifact_id" in refused(
        *prompt, "--bundle", other, "--adapter", adapter)
    assert riftco(*prompt, "--bundle", other, "--adapter", adapter,
                  "--skip-adapter-base-check").returncode == 0
    assert "--skip-adapter-base-check needs --adapter" in refused(
        *prompt, "--bundle", base_path, "--skip-adapter-base-check")
    broken = copy_adapter(adapter, tmp_path / "broken", use_dora=True)
    assert "adapter_config.json: use_dora = true is not supported" in refused(
        *prompt, "--bundle", base_path, "--adapter", broken)


def test_riftco_post_train_adapter_output_saves_the_adapter_alone(runs, tmp_path):
    _, base, base_path, _ = runs
    train_flags = ("post-train", "--instructions", INSTRUCTIONS, "--steps", 2, "--batch-size", 2,
                   "--learning-rate", "0.05", "--no-progress", "--backend", "cpu")
    adapter = tmp_path / "tuned-adapter"
    done = riftco(*train_flags, "--base", base_path, "--method", "lora", "--adapter-output",
                  adapter)
    assert f"wrote the adapter alone to {adapter} (PEFT, r=4; base artifact_id " \
           f"{base.artifact_id[:16]}" in done.stdout
    assert listing(tmp_path) == ["tuned-adapter", "tuned-adapter.loss.svg",
                                 "tuned-adapter.metrics.jsonl"]
    with load_pretrained(base_path, adapter=adapter) as loaded:
        assert loaded.model.lora_config.targets == ("attention.query", "attention.value")
    # Refused before anything trains (no metrics file appears).
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("")
    for flags, fragment in [
        (("--method", "full", "--adapter-output", tmp_path / "a"),
         "--adapter-output needs --method lora or qlora"),
        (("--method", "lora"), "give --output (the tuned bundle), --adapter-output"),
        (("--method", "lora", "--adapter-output", tmp_path / "a.rift"),
         "--adapter-output writes a directory, not a .rift file"),
        (("--method", "lora", "--adapter-output", taken),
         "exists and is not empty: --adapter-output writes a new directory"),
    ]:
        assert fragment in refused(*train_flags, "--base", base_path, *flags)
    phi3 = base_bundle("phi3").save(tmp_path / "phi3.rift")
    assert "phi3 fuses attention.query, attention.key, attention.value into one module " \
           "(qkv_proj)" in refused(*train_flags, "--base", phi3, "--method", "lora",
                                   "--lora-targets", "attention.query", "--adapter-output",
                                   tmp_path / "p")
    assert listing(tmp_path) == ["phi3.rift", "taken", "tuned-adapter", "tuned-adapter.loss.svg",
                                 "tuned-adapter.metrics.jsonl"]


def test_riftco_post_train_lora_dropout_trains_with_it_and_exports_it(runs, tmp_path):
    _, _, base_path, _ = runs
    train_flags = ("post-train", "--instructions", INSTRUCTIONS, "--steps", 2, "--batch-size", 2,
                   "--learning-rate", "0.05", "--no-progress", "--backend", "cpu", "--base",
                   base_path, "--method", "lora")
    adapter = tmp_path / "dropped"
    riftco(*train_flags, "--lora-dropout", "0.1", "--adapter-output", adapter)
    written = json.loads((adapter / "adapter_config.json").read_text())["lora_dropout"]
    assert written == pytest.approx(0.1)
    with load_pretrained(base_path, adapter=adapter) as loaded:
        assert loaded.model.lora_config.dropout == pytest.approx(0.1)
    for value in ("1", "-0.1", "x"):
        assert "--lora-dropout" in refused(*train_flags, "--lora-dropout", value,
                                           "--adapter-output", tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_riftco_post_train_model_adapter_records_the_source_and_reapplies(runs, tmp_path):
    """post-train --model: the adapter records the source's SHA-256 as its base_id; applied
    to that source it gives the run's merged bundle."""
    from riftco_transformer.interchange.peft import source_identity

    _, _, base_path, _ = runs
    adapter, tuned = tmp_path / "adapter", tmp_path / "tuned.rift"
    riftco("post-train", "--model", base_path, "--instructions", INSTRUCTIONS, "--steps", 2,
           "--batch-size", 2, "--learning-rate", "0.05", "--no-progress", "--method", "lora",
           "--lora-rank", 2, "--output", tuned, "--adapter-output", adapter)
    assert read_peft_adapter(adapter).base == {"base_id": source_identity(base_path)}
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_path)
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"]
    prompt = ("generate", "--prompt", "the cat", "--max-new-tokens", 8)
    assert riftco(*prompt, "--model", base_path, "--adapter", adapter).stdout == \
        riftco(*prompt, "--model", tuned).stdout


# ---- transformers + peft (the oracle venv) ---------------------------------------------------

PEFT_ORACLE = r"""
import json, sys
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM


def base(directory):
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                     attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32,
                                                     attn_implementation="eager")
    return model


results = []
for request in json.load(sys.stdin):
    model = base(request["base"])
    if request["adapter_in"]:
        model = PeftModel.from_pretrained(model, request["adapter_in"])
    else:  # PEFT makes an adapter with random A and B, and saves it
        torch.manual_seed(request["seed"])
        model = get_peft_model(model, LoraConfig(
            r=request["r"], lora_alpha=request["alpha"], target_modules=request["targets"],
            use_rslora=request["rslora"], init_lora_weights=False, task_type="CAUSAL_LM"))
        model.save_pretrained(request["adapter_out"])
    if request.get("dtype") == "float64":  # base and adapter widened exactly: the exact model
        model = model.double()
    model.eval()
    with torch.no_grad():
        results.append(model(torch.tensor([request["tokens"]])).logits[0].double().tolist())
print(json.dumps(results))
"""


def test_peft_loads_our_adapters_onto_our_hugging_face_exports_with_our_logits(tmp_path):
    python = hf_python("peft")
    requests, expected = [], []
    for family in ("llama", "qwen2", "qwen3", "gemma2", "phi3"):
        bundle = base_bundle(family)
        lora = LoraConfig(rank=3, alpha=5.0, targets=attachable_targets(bundle, family),
                          rank_stabilized=family == "qwen3")
        with adapted(bundle, lora) as runtime:
            expected.append((family, logits(runtime.model)))
            adapter = export_peft(runtime.model, tmp_path / f"{family}-adapter")
        directory = export_huggingface(bundle, tmp_path / f"{family}-hf")
        requests.append({"base": str(directory), "adapter_in": str(adapter), "tokens": TOKENS})
    for (family, ours), theirs in zip(expected, run_oracle(python, PEFT_ORACLE, requests),
                                      strict=True):
        print(f"{family}: max |ours - transformers+peft| {close_enough(ours, theirs):.3g}")


def test_adapters_peft_makes_load_here_with_its_logits(tmp_path):
    """PEFT's own adapters (random A and B, saved by save_pretrained): rsLoRA on every linear
    layer of Llama, Phi-3's fused qkv_proj and gate_up_proj, Gemma 3's q/v."""
    python = hf_python("peft")
    cases = {"llama": (4, 6.0, "all-linear", True),
             "phi3": (2, 3.0, ["qkv_proj", "gate_up_proj", "o_proj", "down_proj"], False),
             "gemma3": (2, 4.0, ["q_proj", "v_proj"], False)}
    requests, bundles = [], {}
    for seed, (family, (rank, alpha, targets, rslora)) in enumerate(cases.items()):
        bundles[family] = bundle = base_bundle(family)
        directory = export_huggingface(bundle, tmp_path / f"{family}-hf")
        requests.append({"base": str(directory), "adapter_in": None,
                         "adapter_out": str(tmp_path / f"{family}-adapter"), "seed": seed,
                         "r": rank, "alpha": alpha, "targets": targets, "rslora": rslora,
                         "tokens": TOKENS})
    results = run_oracle(python, PEFT_ORACLE, requests)
    for (family, (rank, alpha, _, rslora)), theirs in zip(cases.items(), results, strict=True):
        adapter = read_peft_adapter(tmp_path / f"{family}-adapter")
        assert (adapter.rank, adapter.alpha, adapter.rank_stabilized, adapter.base) == (
            rank, alpha, rslora, {})
        with bundles[family].instantiate() as runtime:
            load_peft_adapter(runtime.model, adapter)
            ours = logits(runtime.model)
        print(f"{family}: max |ours - transformers+peft| {close_enough(ours, theirs):.3g}")


def test_base_identities_given_and_recorded(exported, tmp_path):
    """What identifies a base: names checked when captured; a base_id given at fine-tuning
    is recorded and must be given again (or the source it names) to attach; a malformed
    recorded identity is refused naming the key."""
    from riftco_transformer.interchange import capture_lora_adapter
    from riftco_transformer.post_training import fine_tune_pretrained

    bundle, directory, _ = exported
    with adapted(bundle, LoraConfig(rank=2)) as runtime:
        with pytest.raises(ValueError, match="base identity 'name' is unknown"):
            capture_lora_adapter(runtime.model, {"name": "x"})
        with pytest.raises(ValueError, match="base identity base_id must be a non-empty str"):
            capture_lora_adapter(runtime.model, {"base_id": ""})
        assert capture_lora_adapter(runtime.model, {}).base == {}
        with pytest.raises(TypeError, match="base_model_name_or_path must be a str"):
            capture_lora_adapter(runtime.model).save(tmp_path / "x", base_model_name_or_path=3)
    path = bundle.save(tmp_path / "base.rift")
    config = PostTrainingConfig(steps=1, batch_size=2, backend="cpu", fine_tuning_method="lora",
                                lora=LoraConfig(rank=2, targets=("attention.query",)))
    with load_pretrained(path) as loaded:
        result = fine_tune_pretrained(loaded, read_instructions_jsonl(INSTRUCTIONS)[:4], config,
                                      base_id="my-base")
    assert result.adapter.base == {"base_id": "my-base"}
    adapter = result.adapter.save(tmp_path / "adapter")
    with bundle.instantiate() as runtime:
        with pytest.raises(ValueError, match="trained on another base \\(base_id my-base in "
                           "the adapter, other-base for this model\\)"):
            load_peft_adapter(runtime.model, adapter, base_id="other-base")
        with pytest.raises(ValueError, match="records its base \\(base_id my-base\\), and none "
                           "of these can be checked on this model; give its base_id"):
            load_peft_adapter(runtime.model, adapter)
        assert runtime.model.lora_config is None
        load_peft_adapter(runtime.model, adapter, base_id="my-base")
        assert runtime.model.lora_attached
    bad = copy_adapter(directory, tmp_path / "bad")
    rewrite = read_safetensors(bad / "adapter_model.safetensors")[0]
    (bad / "adapter_model.safetensors").unlink()
    write_safetensors(bad / "adapter_model.safetensors",
                      {name: (t.shape, t.values) for name, t in rewrite.items()},
                      {"riftco.base.weights_sha256": "not-a-digest"})
    with pytest.raises(ValueError, match="metadata riftco.base.weights_sha256 'not-a-digest' is "
                       "not a SHA-256 in hex"):
        read_peft_adapter(bad)
