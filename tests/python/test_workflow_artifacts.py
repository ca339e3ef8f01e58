"""Model bundles (.rift) and exact-resume checkpoints (.riftckpt): round trips, determinism,
content ids, every corruption detected with the live state untouched, atomic saves that
survive SIGKILL, and the resume identity in a fresh process
(docs/ARCHITECTURE.md, 'Bundles' and 'Training checkpoints')."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from array import array

import pytest

from riftco_transformer import (
    Adam,
    DecoderOnlyTransformer,
    LoraConfig,
    Tokenizer,
    TransformerConfig,
)
from riftco_transformer._container import canonical_json, write_stored_zip
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.batching import RandomWindowBatchSource
from riftco_transformer.checkpoints import (
    TrainingCheckpoint,
    capture_training_checkpoint,
    save_training_checkpoint,
)
from riftco_transformer.training import CausalLanguageModelTrainer, TrainingLoopConfig

from conftest import PYTHON_SOURCE, REPOSITORY

TEXT = (REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt").read_bytes()[:30000]


@pytest.fixture(scope="module")
def tokenizer():
    with Tokenizer(TEXT, method="bpe", vocabulary_size=300) as value:
        yield value


def make_model(tokenizer, seed=3):
    return DecoderOnlyTransformer(TransformerConfig(tokenizer.vocab_size, 16, 16, 2, 1, 32, seed))


def bundle_of(tokenizer, seed=3, metadata=None, stage="pretraining"):
    with make_model(tokenizer, seed) as model:
        return ModelBundle.capture(model, tokenizer, stage, metadata=metadata)


# ---- bundles ------------------------------------------------------------------------------


def test_bundle_round_trip_restores_weights_config_and_tokenizer_exactly(tmp_path, tokenizer):
    with make_model(tokenizer) as model:
        bundle = ModelBundle.capture(model, tokenizer, "pretraining", metadata={"note": "x"})
        expected = model.parameters().flat_values()
    path = bundle.save(tmp_path / "model.rift")
    loaded = ModelBundle.load(path)
    assert loaded.artifact_id == bundle.artifact_id
    assert loaded.metadata == {"note": "x"} and loaded.stage == "pretraining"
    assert loaded.parent_artifact_id is None
    with loaded.instantiate() as runtime:
        assert runtime.model.parameters().flat_values() == expected
        assert runtime.tokenizer.merge_rules == tokenizer.merge_rules
        assert runtime.model.config == bundle.config


def test_bundle_bytes_are_deterministic_and_the_id_is_content_derived(tokenizer):
    first, second = bundle_of(tokenizer), bundle_of(tokenizer)
    assert first.to_bytes() == second.to_bytes()
    assert first.artifact_id == second.artifact_id
    assert bundle_of(tokenizer, metadata={"a": 1}).artifact_id != first.artifact_id
    assert bundle_of(tokenizer, seed=4).artifact_id != first.artifact_id
    assert bundle_of(tokenizer, stage="post_training").artifact_id != first.artifact_id
    # The id by its definition (docs/ARCHITECTURE.md, 'Bundles'), computed with the standard library
    # (not the package's canonical_json): SHA-256 of the sorted, compact UTF-8 JSON of the manifest
    # without it.
    manifest = json.loads(first.manifest_bytes)
    del manifest["artifact_id"]
    import hashlib

    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == first.artifact_id


def test_child_bundle_records_its_parent(tokenizer):
    parent = bundle_of(tokenizer)
    with parent.instantiate() as runtime:
        child = ModelBundle.capture(runtime.model, runtime.tokenizer, "post_training",
                                    parent.artifact_id)
    assert child.parent_artifact_id == parent.artifact_id
    with pytest.raises(ValueError, match="parent_artifact_id"):
        with parent.instantiate() as runtime:
            ModelBundle.capture(runtime.model, runtime.tokenizer, "x", "not-an-id")


def test_capture_rejects_adapters_and_packed_weights_until_merged(tokenizer):
    with make_model(tokenizer) as model:
        model.attach_lora(LoraConfig())
        with pytest.raises(ValueError, match="merge_lora"):
            ModelBundle.capture(model, tokenizer, "x")
        model.merge_lora()
        ModelBundle.capture(model, tokenizer, "x")
    config = TransformerConfig(tokenizer.vocab_size, 16, 64, 2, 1, 64, 3)
    with DecoderOnlyTransformer(config) as model:
        model.quantize_nf4()
        with pytest.raises(ValueError, match="NF4"):
            ModelBundle.capture(model, tokenizer, "x")


def _flip(data: bytes, position: int) -> bytes:
    corrupted = bytearray(data)
    corrupted[position] ^= 0x10
    return bytes(corrupted)


def test_every_corrupted_byte_position_is_detected(tokenizer):
    data = bundle_of(tokenizer).to_bytes()
    manifest_start = 30 + len("manifest.json")
    positions = {
        "zip local header": 3,
        "manifest": manifest_start + 10,
        "manifest sha256 field": data.index(b'"sha256":"') + 12,
        "weights": len(data) - 200,
        "central directory": len(data) - 60,
    }
    for what, position in positions.items():
        with pytest.raises(ValueError):
            ModelBundle.from_bytes(_flip(data, position))
    for length in (0, 21, 100, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError):
            ModelBundle.from_bytes(data[:length])
    # Every single byte, for a small bundle: nothing slips through, nothing else is raised.
    for position in range(0, len(data), 7):
        with pytest.raises(ValueError):
            ModelBundle.from_bytes(_flip(data, position))


def _repack(bundle: ModelBundle, edit, keep_id: bool = False) -> bytes:
    """The bundle with its manifest edited, its artifact_id recomputed (unless ``keep_id``)
    and the container rebuilt with valid CRCs: only the manifest rule under test fails."""
    import hashlib

    manifest = bundle.manifest
    edit(manifest)
    if not keep_id:
        manifest.pop("artifact_id", None)
        manifest["artifact_id"] = hashlib.sha256(canonical_json(manifest)).hexdigest()
    weights = array("f", bundle.weights).tobytes()
    import io

    buffer = io.BytesIO()
    write_stored_zip(buffer, [("manifest.json", canonical_json(manifest)), ("weights.f32le", weights)])
    return buffer.getvalue()


def test_manifest_rules_are_checked_past_the_container(tokenizer):
    bundle = bundle_of(tokenizer)
    with pytest.raises(ValueError, match="artifact_id does not match"):
        ModelBundle.from_bytes(_repack(bundle, lambda m: m["metadata"].update(x=1), keep_id=True))
    cases = {
        "format is": lambda m: m.update(format="other"),
        "format_version": lambda m: m.update(format_version=2),
        "head_count": lambda m: m["config"].update(head_count=3),
        "tokenizer vocabulary": lambda m: m["tokenizer"]["merge_rules"].pop(),
        "shape": lambda m: m["parameters"][0].update(shape=[1, 2]),
        "weights.count": lambda m: m["weights"].update(count=5),
        "does not match weights.sha256": lambda m: m["weights"].update(sha256="0" * 64),
        "manifest keys differ": lambda m: m.update(extra=1),
        "layer_norm_epsilon": lambda m: m["config"].update(layer_norm_epsilon=-1.0),
        "result": lambda m: m["tokenizer"]["merge_rules"][0].__setitem__(2, 999),
    }
    for message, edit in cases.items():
        with pytest.raises(ValueError, match=message):
            ModelBundle.from_bytes(_repack(bundle, edit))


def test_non_finite_weights_and_non_canonical_manifests_are_rejected(tokenizer):
    bundle = bundle_of(tokenizer)
    manifest = bundle.manifest
    weights = array("f", bundle.weights)
    weights[5] = float("nan")
    import hashlib
    import io

    manifest["weights"]["sha256"] = hashlib.sha256(weights.tobytes()).hexdigest()
    del manifest["artifact_id"]
    manifest["artifact_id"] = hashlib.sha256(canonical_json(manifest)).hexdigest()
    buffer = io.BytesIO()
    write_stored_zip(buffer, [("manifest.json", canonical_json(manifest)), ("weights.f32le", weights.tobytes())])
    with pytest.raises(ValueError, match="value 5 is not finite"):
        ModelBundle.from_bytes(buffer.getvalue())
    pretty = json.dumps(bundle.manifest, indent=1, sort_keys=True).encode()
    buffer = io.BytesIO()
    write_stored_zip(buffer, [("manifest.json", pretty), ("weights.f32le", array("f", bundle.weights).tobytes())])
    with pytest.raises(ValueError, match="canonical"):
        ModelBundle.from_bytes(buffer.getvalue())


def test_a_failed_save_leaves_the_old_file_whole(tmp_path, tokenizer):
    path = tmp_path / "model.rift"
    bundle_of(tokenizer).save(path)
    before = path.read_bytes()
    with pytest.raises(IsADirectoryError):
        bundle_of(tokenizer).save(tmp_path)
    with pytest.raises(FileNotFoundError):
        bundle_of(tokenizer).save(tmp_path / "missing" / "x.rift")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.rift"]


SAVER = textwrap.dedent(
    """
    import sys
    from riftco_transformer import DecoderOnlyTransformer, Tokenizer, TransformerConfig
    from riftco_transformer.artifacts import ModelBundle
    tokenizer = Tokenizer(b"abcdefgh", method="byte")
    bundles = []
    for seed in (1, 2):
        with DecoderOnlyTransformer(TransformerConfig(tokenizer.vocab_size, 64, 96, 4, 4, 384,
                                                      seed)) as model:
            bundles.append(ModelBundle.capture(model, tokenizer, "x"))
    print(bundles[0].artifact_id, bundles[1].artifact_id, flush=True)
    index = 0
    while True:
        bundles[index % 2].save(sys.argv[1])
        index += 1
    """
)


def test_a_save_killed_at_random_points_never_leaves_a_half_written_file(tmp_path):
    path = tmp_path / "model.rift"
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    import random

    generator = random.Random(5)
    seen = set()
    for round_index in range(12):
        process = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], env=environment,
                                   stdout=subprocess.PIPE, text=True)
        identities = set(process.stdout.readline().split())
        assert len(identities) == 2
        time.sleep(generator.uniform(0.05, 0.4))
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
        if path.exists():
            loaded = ModelBundle.load(path)  # whole and valid: never a torn file
            assert loaded.artifact_id in identities
            seen.add(loaded.artifact_id)
    assert seen, "the saver never completed a save"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "model.rift"]
    assert all(name.startswith(".model.rift.") and name.endswith(".tmp") for name in leftovers)


# ---- checkpoints ----------------------------------------------------------------------------


def _run(tokenizer, tokens, steps, method="full", checkpoint=None):
    """A small run: returns (model, optimizer, source, trainer) after ``steps`` steps.
    ``method`` "lora-dropout" and "qlora-dropout" add LoRA dropout 0.25."""
    config = TransformerConfig(tokenizer.vocab_size, 16, 32, 2, 1, 64, 3)
    model = DecoderOnlyTransformer(config)
    method, _, dropout = method.partition("-")
    nf4 = None
    if method == "qlora":
        model.quantize_nf4(32, True, 32)
        nf4 = {"block_size": 32, "double_quantization": True, "scale_block_size": 32}
    if method in ("lora", "qlora"):
        model.attach_lora(LoraConfig(rank=2, targets=("attention.query", "feed_forward.expand"),
                                     dropout=0.25 if dropout else 0.0))
        trainable = model.adapter_parameters()
    else:
        trainable = model.parameters()
    optimizer = Adam(trainable, learning_rate=1e-2,
                     state_storage="paged" if method == "qlora" else "contiguous", page_size=100)
    source = RandomWindowBatchSource(tokens, 4, 16, 11)
    trainer = CausalLanguageModelTrainer(model, optimizer)
    trainer.run(source, TrainingLoopConfig(steps))
    return model, optimizer, source, trainer, nf4


RESUMER = textwrap.dedent(
    """
    import sys
    from array import array
    from riftco_transformer.batching import RandomWindowBatchSource
    from riftco_transformer.checkpoints import TrainingCheckpoint
    from riftco_transformer.training import CausalLanguageModelTrainer, TrainingLoopConfig
    checkpoint = TrainingCheckpoint.load(sys.argv[1])
    tokens = array("I"); tokens.frombytes(open(sys.argv[2], "rb").read())
    resumed = checkpoint.resume()
    source = RandomWindowBatchSource(tokens, 4, 16, 11)
    checkpoint.restore_source(source)
    trainer = CausalLanguageModelTrainer(resumed.model, resumed.optimizer)
    checkpoint.restore_trainer(trainer)
    trainer.run(source, TrainingLoopConfig(int(sys.argv[3])))
    state = resumed.optimizer.state()
    with open(sys.argv[4], "wb") as out:
        for part in (resumed.model.parameters().flat_values(), state.first_moments,
                     state.second_moments):
            out.write(part.tobytes())
    print(state.step_count, repr(state.beta1_power), repr(state.beta2_power),
          source.batches_emitted, source.next().inputs[0].tolist())
    """
)


@pytest.mark.parametrize("method", ["full", "lora", "qlora", "lora-dropout", "qlora-dropout"])
def test_resume_in_a_fresh_process_is_bit_identical(tmp_path, tokenizer, method):
    tokens = tokenizer.encode_to_array(TEXT)
    total, split = 9, 4
    model, optimizer, source, trainer, _ = _run(tokenizer, tokens, total, method)
    # With dropout, one key per training forward (one forward a step); none without.
    assert model.lora_dropout_key == (total if method.endswith("dropout") else 0)
    state = optimizer.state()
    expected = (model.parameters().flat_values().tobytes() + state.first_moments.tobytes()
                + state.second_moments.tobytes())
    expected_line = (f"{state.step_count} {state.beta1_power!r} {state.beta2_power!r} "
                     f"{source.batches_emitted} {source.next().inputs[0].tolist()}")
    optimizer.close()
    model.close()

    model, optimizer, source, trainer, nf4 = _run(tokenizer, tokens, split, method)
    save_training_checkpoint(tmp_path / "run.riftckpt", model, optimizer, tokenizer, source,
                             trainer, nf4=nf4)
    optimizer.close()
    model.close()
    (tmp_path / "tokens").write_bytes(tokens.tobytes())
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    completed = subprocess.run(
        [sys.executable, "-c", RESUMER, str(tmp_path / "run.riftckpt"), str(tmp_path / "tokens"),
         str(total - split), str(tmp_path / "out")],
        env=environment, capture_output=True, text=True, check=True,
    )
    assert completed.stdout.strip() == expected_line
    assert (tmp_path / "out").read_bytes() == expected


def test_checkpoint_corruption_is_detected_and_a_failed_restore_changes_nothing(tmp_path, tokenizer):
    tokens = tokenizer.encode_to_array(TEXT)
    model, optimizer, source, trainer, _ = _run(tokenizer, tokens, 3)
    checkpoint = capture_training_checkpoint(model, optimizer, tokenizer, source, trainer)
    data = checkpoint.to_bytes()
    assert TrainingCheckpoint.from_bytes(data).checkpoint_id == checkpoint.checkpoint_id
    for position in (5, 40, data.index(b'"global_step"') + 3, len(data) // 2, len(data) - 100):
        with pytest.raises(ValueError):
            TrainingCheckpoint.from_bytes(_flip(data, position))
    for length in (10, len(data) // 3, len(data) - 5):
        with pytest.raises(ValueError):
            TrainingCheckpoint.from_bytes(data[:length])

    # Two more steps, then restoring onto data with another fingerprint must fail and leave
    # the model, the optimizer and the source exactly as they were.
    trainer.run(source, TrainingLoopConfig(2))
    before_values = model.parameters().flat_values()
    before_state = optimizer.state()
    before_source = source.capture_state()
    other = RandomWindowBatchSource(tokens[: len(tokens) // 2], 4, 16, 11)
    other_state = other.capture_state()
    with pytest.raises(ValueError, match="fingerprint"):
        checkpoint.restore(model, optimizer, other, trainer)
    assert other.capture_state() == other_state
    with pytest.raises(ValueError, match="learning_rate"):
        with Adam(model.parameters(), learning_rate=0.5) as wrong:
            checkpoint.restore(model, wrong)
    assert model.parameters().flat_values() == before_values
    after = optimizer.state()
    assert (after.step_count, after.first_moments, after.second_moments) == (
        before_state.step_count, before_state.first_moments, before_state.second_moments)
    assert source.capture_state() == before_source
    # And the valid restore rewinds to the checkpoint.
    restored = checkpoint.restore(model, optimizer, source, trainer)
    assert restored.global_step == 3 and optimizer.step_count == 3
    optimizer.close()
    model.close()


def test_checkpoint_rules(tokenizer):
    tokens = tokenizer.encode_to_array(TEXT)
    model, optimizer, source, trainer, _ = _run(tokenizer, tokens, 1)
    # A pending gradient is not a step boundary.
    loss_model = model(source.next().inputs)
    from riftco_transformer import cross_entropy

    loss = cross_entropy(loss_model, source.next().targets)
    loss.backward()
    loss.close()
    loss_model.close()
    from riftco_transformer import RiftcoTransformerError

    with pytest.raises(RiftcoTransformerError, match="holds a gradient that no step consumed"):
        capture_training_checkpoint(model, optimizer)
    optimizer.zero_gradients()
    optimizer.close()
    # An optimizer over something else than the model's list.
    with DecoderOnlyTransformer(model.config) as other, Adam(other.parameters()) as foreign:
        with pytest.raises(ValueError, match="own exactly"):
            capture_training_checkpoint(model, foreign)
    model.close()


def test_a_contiguous_run_resumes_with_paged_moments_to_the_same_weights(tokenizer):
    tokens = tokenizer.encode_to_array(TEXT)
    model, optimizer, source, trainer, _ = _run(tokenizer, tokens, 6)
    expected = model.parameters().flat_values()
    optimizer.close()
    model.close()
    model, optimizer, source, trainer, _ = _run(tokenizer, tokens, 2)
    checkpoint = capture_training_checkpoint(model, optimizer, tokenizer, source, trainer)
    optimizer.close()
    model.close()
    resumed = checkpoint.resume(state_storage="paged")
    assert resumed.optimizer.state_storage == "paged"
    continued = RandomWindowBatchSource(tokens, 4, 16, 11)
    checkpoint.restore_source(continued)
    CausalLanguageModelTrainer(resumed.model, resumed.optimizer).run(continued, TrainingLoopConfig(4))
    assert resumed.model.parameters().flat_values() == expected
    resumed.close()


def test_restoring_an_adapter_checkpoint_needs_the_same_frozen_base(tokenizer):
    tokens = tokenizer.encode_to_array(TEXT)
    model, optimizer, source, trainer, _ = _run(tokenizer, tokens, 2, "lora")
    checkpoint = capture_training_checkpoint(model, optimizer, tokenizer, source, trainer)
    optimizer.close()
    model.close()
    config = TransformerConfig(tokenizer.vocab_size, 16, 32, 2, 1, 64, 99)  # another init seed
    with DecoderOnlyTransformer(config) as other:
        other.attach_lora(LoraConfig(rank=2, targets=("attention.query", "feed_forward.expand")))
        with Adam(other.adapter_parameters(), learning_rate=1e-2) as adam:
            before = adam.state()
            with pytest.raises(ValueError, match="frozen base differs"):
                checkpoint.restore(other, adam)
            assert adam.state().values == before.values
    resumed = checkpoint.resume()  # the way to continue it: rebuild the pair from the file
    assert resumed.optimizer.step_count == 2
    resumed.close()


# ---- the GPT-2 variant fields (tanh GELU, tied head) -----------------------------------------

BASE_CONFIG_KEYS = {"vocabulary_size", "maximum_context", "model_width", "head_count",
                    "block_count", "feed_forward_width", "random_seed", "layer_norm_epsilon"}


def variant_model(tokenizer):
    return DecoderOnlyTransformer(TransformerConfig(
        tokenizer.vocab_size, 16, 16, 2, 1, 32, 3, feed_forward_activation="gelu_tanh",
        tie_embeddings=True))


def test_variant_fields_are_recorded_only_when_not_default(tmp_path, tokenizer):
    # A default model's manifest is what it was before the fields existed (same artifact id).
    assert set(bundle_of(tokenizer).manifest["config"]) == BASE_CONFIG_KEYS
    with variant_model(tokenizer) as model:
        bundle = ModelBundle.capture(model, tokenizer, "pretraining")
        expected = model.parameters().flat_values()
    config = bundle.manifest["config"]
    assert set(config) == BASE_CONFIG_KEYS | {"feed_forward_activation", "tie_embeddings"}
    assert config["feed_forward_activation"] == "gelu_tanh" and config["tie_embeddings"] is True
    assert not any(entry["name"].startswith("language_model_head")
                   for entry in bundle.manifest["parameters"])
    loaded = ModelBundle.load(bundle.save(tmp_path / "variant.rift"))
    with loaded.instantiate() as runtime:
        assert runtime.model.config == bundle.config
        assert runtime.model.parameters().flat_values() == expected


def test_variant_field_rules(tokenizer):
    with variant_model(tokenizer) as model:
        bundle = ModelBundle.capture(model, tokenizer, "pretraining")
    cases = {
        "feed_forward_activation must be": lambda m: m["config"].update(
            feed_forward_activation="swish"),
        "tie_embeddings must be a bool": lambda m: m["config"].update(tie_embeddings=1),
        "config must be an object with exactly": lambda m: m["config"].update(bias=True),
        # Untied, the parameter table lacks the head the config now implies.
        "parameters": lambda m: m["config"].update(tie_embeddings=False),
    }
    for message, edit in cases.items():
        with pytest.raises(ValueError, match=message):
            ModelBundle.from_bytes(_repack(bundle, edit))


def test_a_variant_training_checkpoint_resumes_the_same_model(tokenizer):
    with variant_model(tokenizer) as model, Adam(model.parameters()) as optimizer:
        checkpoint = capture_training_checkpoint(model, optimizer)
        expected = model.parameters().flat_values()
    assert checkpoint.manifest["model"]["config"]["tie_embeddings"] is True
    resumed = checkpoint.resume()
    try:
        assert resumed.model.config.feed_forward_activation == "gelu_tanh"
        assert resumed.model.config.tie_embeddings is True
        assert resumed.model.parameters().flat_values() == expected
    finally:
        resumed.optimizer.close()
        resumed.model.close()
