"""Batching, the training loop, exhaustive evaluation, the response-only loss, and the
pretraining and post-training stages (docs/ARCHITECTURE.md, 'Training windows'
and 'Training workflows')."""

from __future__ import annotations

import math
from array import array

import pytest

from riftco_transformer import (
    DecoderOnlyTransformer,
    RiftcoTransformerError,
    TransformerConfig,
    cross_entropy,
    cross_entropy_masked,
    cross_entropy_time_range,
)
from riftco_transformer.batching import (
    ExampleWindowBatchSource,
    RandomWindowBatchSource,
    SequenceWindowBatchSource,
    TokenFile,
)
from riftco_transformer.evaluation import HeldOutProtocol, evaluate_sequences
from riftco_transformer.instructions import InstructionExample, read_instructions_jsonl
from riftco_transformer.interchange import export_bundle_safetensors, import_bundle_safetensors
from riftco_transformer.post_training import PostTrainingConfig, post_train, post_train_jsonl
from riftco_transformer.pretraining import (
    PretrainingConfig,
    pretrain_file,
    pretrain_splits,
    pretrain_text,
)

from conftest import REPOSITORY

CORPUS = (REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt").read_text()
INSTRUCTIONS = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"
SMALL = PretrainingConfig(steps=12, context_size=16, evaluation_interval=5, backend="cpu")


# ---- batching ------------------------------------------------------------------------------


def test_windows_are_inputs_and_targets_shifted_by_one_and_deterministic():
    tokens = list(range(100, 140))
    first = RandomWindowBatchSource(tokens, 5, 6, 9)
    second = RandomWindowBatchSource(tokens, 5, 6, 9)
    for _ in range(4):
        a, b = first.next(), second.next()
        assert a.inputs == b.inputs and a.targets == b.targets
        for inputs, targets in zip(a.inputs, a.targets):
            start = inputs[0] - 100
            assert list(inputs) == tokens[start : start + 6]
            assert list(targets) == tokens[start + 1 : start + 7]
    assert first.window_count == len(tokens) - 6
    with pytest.raises(ValueError, match="context_size \\+ 1"):
        RandomWindowBatchSource(tokens[:6], 1, 6, 0)
    exact = RandomWindowBatchSource(tokens[:7], 3, 6, 0)  # exactly T + 1 tokens: one window
    assert all(list(row) == tokens[:6] for row in exact.next().inputs)


def test_sequence_sources_never_cross_boundaries_and_drop_short_sequences():
    sequences = [list(range(1000 * k, 1000 * k + n)) for k, n in ((1, 9), (2, 3), (3, 20))]
    for source_type in (SequenceWindowBatchSource, ExampleWindowBatchSource):
        source = source_type(sequences, 8, 4, 1)
        assert source.sequence_count == 2 and source.dropped_sequence_count == 1
        for _ in range(20):
            for inputs, targets in zip(*(lambda b: (b.inputs, b.targets))(source.next())):
                assert inputs[0] // 1000 == targets[-1] // 1000  # one sequence per window
                assert list(targets) == [value + 1 for value in inputs]
    with pytest.raises(ValueError, match="no sequence"):
        SequenceWindowBatchSource([[1, 2]], 1, 4, 0)


def test_example_uniform_weights_sequences_equally():
    sequences = [list(range(1000)), list(range(5000, 5010))]
    source = ExampleWindowBatchSource(sequences, 100, 4, 3)
    short = sum(row[0] >= 5000 for _ in range(20) for row in source.next().inputs)
    assert 800 < short < 1200  # about half of 2000 rows, although it has 6 of 1002 windows
    window = SequenceWindowBatchSource(sequences, 100, 4, 3)
    assert sum(row[0] >= 5000 for _ in range(20) for row in window.next().inputs) < 60


def test_masked_sources_only_draw_windows_with_a_marked_target():
    tokens = list(range(50))
    mask = bytes(40) + b"\x01" * 10
    source = ExampleWindowBatchSource([tokens], 16, 8, 2, masks=[mask])
    for _ in range(10):
        batch = source.next()
        for targets, flags in zip(batch.targets, batch.target_mask):
            assert any(flags) and list(flags) == [1 if t >= 40 else 0 for t in targets]


def test_source_state_round_trip_and_validation():
    source = RandomWindowBatchSource(list(range(200)), 3, 5, 4)
    for _ in range(3):
        source.next()
    state = source.capture_state()
    expected = [source.next().inputs for _ in range(3)]
    fresh = RandomWindowBatchSource(list(range(200)), 3, 5, 4)
    fresh.restore_state(state)
    assert [fresh.next().inputs for _ in range(3)] == expected
    other = RandomWindowBatchSource(list(range(201)), 3, 5, 4)
    before = other.capture_state()
    with pytest.raises(ValueError, match="fingerprint"):
        other.restore_state(state)
    for broken in ({**state, "type": "example_window"}, {**state, "batches_emitted": -1},
                   {**state, "rng": {**state["rng"], "state": [1, 2]}}):
        with pytest.raises(ValueError):
            fresh.restore_state(broken)
    assert other.capture_state() == before


def test_token_file_maps_the_tokens_and_keeps_the_fingerprint(tmp_path):
    tokens = array("I", range(3, 3000, 3))
    TokenFile.write(tmp_path / "t.tokens", [tokens[:100], tokens[100:]])
    with TokenFile.open(tmp_path / "t.tokens") as mapped:
        assert len(mapped) == len(tokens) and mapped.tokens[500] == tokens[500]
        from_file = RandomWindowBatchSource(mapped, 2, 7, 1)
        in_memory = RandomWindowBatchSource(tokens, 2, 7, 1)
        assert from_file.fingerprint == in_memory.fingerprint
        assert from_file.next().inputs == in_memory.next().inputs
    (tmp_path / "bad.tokens").write_bytes(b"RIFTTOK1" + bytes(40) + b"xx")
    with pytest.raises(ValueError, match="header says"):
        TokenFile.open(tmp_path / "bad.tokens")


# ---- losses and evaluation -------------------------------------------------------------------


def test_masked_cross_entropy_matches_the_time_range_and_plain_losses():
    model = DecoderOnlyTransformer(TransformerConfig(11, 6, 8, 2, 1, 16, 5))
    inputs = [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]]
    targets = [[2, 3, 4, 5, 6, 7], [5, 4, 3, 2, 1, 0]]
    logits = model(inputs)
    sliced = cross_entropy_time_range(logits, targets, 2, 3).item()
    masked = cross_entropy_masked(logits, targets, [bytes([0, 0, 1, 1, 1, 0])] * 2).item()
    assert masked == pytest.approx(sliced, rel=1e-6, abs=1e-7)
    assert cross_entropy_masked(logits, targets, b"\x01" * 12).item() == cross_entropy(logits, targets).item()
    # The mean over the marked rows only: rows 0 and 7 alone.
    row_zero = cross_entropy(model([1]), [2]).item()
    assert cross_entropy_masked(logits, targets, [bytes([1, 0, 0, 0, 0, 0]), bytes(6)]).item() == \
        pytest.approx(row_zero, rel=1e-6)
    for bad, message in ((b"\x00" * 12, "selects no position"), (b"\x01" * 11, "mask flags"),
                         (b"\x02" + b"\x01" * 11, "must be 0 or 1")):
        with pytest.raises(RiftcoTransformerError, match=message):
            cross_entropy_masked(logits, targets, bad)
    loss = cross_entropy_masked(logits, targets, [bytes([0, 0, 0, 0, 0, 1])] * 2)
    loss.backward()


def test_evaluation_scores_every_target_exactly_once():
    model = DecoderOnlyTransformer(TransformerConfig(13, 4, 8, 2, 1, 16, 5))
    sequence = [1, 5, 2, 7, 3, 9, 4, 11, 6, 12]  # 9 targets: chunks of 4, 4 and 1
    result = evaluate_sequences(model, [sequence, [3], [2, 8]], context_size=4, batch_size=2)
    assert result.target_token_count == 9 + 1 and result.chunk_count == 4
    assert result.skipped_example_count == 1 and result.usable_example_count == 2
    oracle = 0.0
    for start, width in ((0, 4), (4, 4), (8, 1)):
        logits = model(sequence[start : start + width])
        oracle += cross_entropy(logits, sequence[start + 1 : start + width + 1]).item() * width
    oracle += cross_entropy(model([2]), [8]).item()
    assert result.loss == pytest.approx(oracle / 10, rel=1e-6)
    assert result.perplexity == pytest.approx(math.exp(result.loss))
    with pytest.raises(ValueError, match="maximum_context"):
        evaluate_sequences(model, [sequence], context_size=5)
    with pytest.raises(ValueError, match="no sequence"):
        evaluate_sequences(model, [[1]])


def test_held_out_protocol_consumes_the_test_split_once_and_rejects_overlap():
    model = DecoderOnlyTransformer(TransformerConfig(13, 4, 8, 2, 1, 16, 5))
    protocol = HeldOutProtocol([[1, 2, 3]], [[4, 5, 6]], [[7, 8, 9]])
    report = protocol.report(model, include_test=True)
    assert report.validation_gap == report.validation_loss - report.train_loss
    assert report.test_gap == report.test_loss - report.train_loss
    with pytest.raises(RuntimeError, match="consumed"):
        protocol.score_test(model)
    with pytest.raises(ValueError, match="share"):
        HeldOutProtocol([[1, 2, 3]], [[1, 2, 3]])


# ---- pretraining ----------------------------------------------------------------------------


def test_pretrain_text_holds_out_the_tail_before_fitting_the_tokenizer():
    text = CORPUS[:20000]
    result = pretrain_text(text, SMALL)
    metadata = result.bundle.metadata
    import hashlib

    held_out = math.ceil(len(text) * 0.1)
    assert metadata["validation_text_sha256"] == hashlib.sha256(text[-held_out:].encode()).hexdigest()
    assert metadata["training_text_sha256"] == hashlib.sha256(text[:-held_out].encode()).hexdigest()
    assert metadata["tokenizer_fit_scope"] == "training_text"
    assert metadata["objective"] == "next_token_prediction"
    assert metadata["optimizer_state_included"] is False
    assert result.bundle.stage == "pretraining" and result.bundle.parent_artifact_id is None
    phases = [(m.phase, m.step) for m in result.metrics if m.phase == "validation"]
    assert phases == [("validation", 0), ("validation", 5), ("validation", 10), ("validation", 12)]
    train = [m for m in result.metrics if m.phase == "train"]
    assert [m.step for m in train] == list(range(1, 13))
    assert train[-1].loss < train[0].loss


def test_pretrain_file_streams_to_the_same_result_as_pretrain_text(tmp_path):
    text = CORPUS[:20000]
    (tmp_path / "corpus.txt").write_text(text)
    assert pretrain_file(tmp_path / "corpus.txt", SMALL).bundle.artifact_id == \
        pretrain_text(text, SMALL).bundle.artifact_id


def test_pretraining_rules():
    with pytest.raises(ValueError, match="identical"):
        pretrain_splits("abc" * 100, "abc" * 100, SMALL)
    with pytest.raises(ValueError, match="byte tokenizer"):
        pretrain_splits("a" * 200, "b" * 200, PretrainingConfig(steps=1, context_size=4,
                                                              tokenizer_method="byte"))
    with pytest.raises(ValueError, match="context_size \\+ 1"):
        pretrain_text("short text", SMALL)
    for field, value, error in (("steps", 0, ValueError), ("steps", True, TypeError),
                                ("validation_fraction", 1.0, ValueError),
                                ("vocabulary_size", 100, ValueError),
                                ("head_count", 3, ValueError), ("backend", "gpu", ValueError),
                                ("attention", "fast", ValueError)):
        with pytest.raises(error):
            PretrainingConfig(**{field: value})


def test_pretrain_file_rejects_non_utf8_and_the_same_file_twice(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"hello \xff world" * 10)
    with pytest.raises(ValueError, match="not UTF-8 at byte 6"):
        pretrain_file(tmp_path / "bad.txt", SMALL)
    (tmp_path / "good.txt").write_text(CORPUS[:5000])
    with pytest.raises(ValueError, match="same file"):
        pretrain_file(tmp_path / "good.txt", SMALL, tmp_path / "good.txt")


# ---- post-training ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_bundle():
    # A context that holds every tiny instruction example whole (the longest is 157 chars).
    return pretrain_text(CORPUS[:40000], PretrainingConfig(steps=20, context_size=128,
                                                            model_width=32, feed_forward_width=64,
                                                            backend="cpu")).bundle


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_post_training_lowers_the_held_out_loss_and_records_lineage(base_bundle, method):
    examples = read_instructions_jsonl(INSTRUCTIONS)
    config = PostTrainingConfig(steps=40, batch_size=4, backend="cpu",
                                fine_tuning_method=method,
                                learning_rate=3e-3 if method == "full" else 2e-2)
    result = post_train(base_bundle, examples[:30], config, validation_examples=examples[30:])
    assert result.bundle.parent_artifact_id == base_bundle.artifact_id
    assert result.bundle.stage == "post_training"
    assert result.tuned_validation.loss < result.base_validation.loss
    metadata = result.bundle.metadata
    assert metadata["fine_tuning_method"] == method
    assert metadata["lora_merged"] is (method != "full")
    assert (metadata["quantization"] is not None) is (method == "qlora")
    if method == "qlora":
        assert metadata["optimizer"]["state_storage"] == "paged"
    # The base bundle is untouched and the child reopens.
    with result.bundle.instantiate() as runtime:
        assert runtime.model.config == base_bundle.config


def test_an_interrupted_qlora_post_training_resumes_to_the_same_bundle(base_bundle, tmp_path):
    examples = read_instructions_jsonl(INSTRUCTIONS)[:30]
    config = PostTrainingConfig(steps=10, batch_size=4, backend="cpu",
                                fine_tuning_method="qlora", learning_rate=2e-2,
                                response_only_loss=True)
    expected = post_train(base_bundle, examples, config).bundle

    class Interrupted(Exception):
        pass

    def interrupt(metric):
        if metric.step == 6:
            raise Interrupted

    path = tmp_path / "post.riftckpt"
    with pytest.raises(Interrupted):
        post_train(base_bundle, examples, config, on_step=interrupt, checkpoint_path=path,
                   checkpoint_interval=4)
    resumed = post_train(base_bundle, examples, config, resume_from=path)
    assert resumed.bundle.weights == expected.weights
    other_base = pretrain_text(CORPUS[:30000], PretrainingConfig(
        steps=2, context_size=128, model_width=32, feed_forward_width=64, backend="cpu")).bundle
    with pytest.raises(ValueError, match="not taken while post-training this base"):
        post_train(other_base, examples, config, resume_from=path)


def test_ctrl_c_stops_at_a_step_boundary_with_a_checkpoint_that_resumes_exactly(base_bundle,
                                                                               tmp_path):
    """A real SIGINT during a step (sent from on_step, the first one deferred): the run ends
    after that step with TrainingInterrupted naming the step and the checkpoint, which resumes
    to the uninterrupted bundle; pretraining and post-training alike. The default SIGINT
    handler is back afterwards."""
    import os
    import signal

    from riftco_transformer.training import TrainingInterrupted

    def ctrl_c_at(step):
        def hook(metric):
            if metric.step == step:
                os.kill(os.getpid(), signal.SIGINT)
        return hook

    examples = read_instructions_jsonl(INSTRUCTIONS)[:30]
    config = PostTrainingConfig(steps=10, batch_size=4, backend="cpu",
                                fine_tuning_method="qlora", learning_rate=2e-2)
    expected = post_train(base_bundle, examples, config).bundle
    path = tmp_path / "post.riftckpt"
    with pytest.raises(TrainingInterrupted) as caught:
        post_train(base_bundle, examples, config, on_step=ctrl_c_at(3), checkpoint_path=path,
                   checkpoint_interval=100)
    assert caught.value.step == 3 and caught.value.checkpoint == path
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert post_train(base_bundle, examples, config,
                      resume_from=path).bundle.weights == expected.weights

    pretraining = PretrainingConfig(steps=8, context_size=32, model_width=32,
                                    feed_forward_width=64, backend="cpu")
    whole = pretrain_text(CORPUS[:20000], pretraining).bundle
    path = tmp_path / "pre.riftckpt"
    with pytest.raises(TrainingInterrupted) as caught:
        pretrain_text(CORPUS[:20000], pretraining, on_step=ctrl_c_at(5), checkpoint_path=path,
                      checkpoint_interval=100)
    assert caught.value.step == 5
    assert pretrain_text(CORPUS[:20000], pretraining,
                         resume_from=path).bundle.weights == whole.weights
    # Without a checkpoint to write, Ctrl-C interrupts as it always did.
    with pytest.raises(KeyboardInterrupt) as caught:
        post_train(base_bundle, examples, config, on_step=ctrl_c_at(2))
    assert not isinstance(caught.value, TrainingInterrupted)


def test_response_only_loss_trains_on_assistant_tokens(base_bundle):
    examples = read_instructions_jsonl(INSTRUCTIONS)
    config = PostTrainingConfig(steps=30, batch_size=4, backend="cpu",
                                learning_rate=3e-3, response_only_loss=True)
    result = post_train(base_bundle, examples[:30], config, validation_examples=examples[30:])
    assert result.objective == "response_only_causal_sft"
    assert result.bundle.metadata["response_only_loss"] is True
    assert result.tuned_validation.loss < result.base_validation.loss


def test_post_training_errors(base_bundle, tmp_path):
    with pytest.raises(ValueError, match="exceeds the base model's maximum_context"):
        post_train(base_bundle, [InstructionExample("a", "b")],
                   PostTrainingConfig(context_size=256))
    # Truncated to 3 tokens, the example keeps none of its response: nothing to learn.
    with pytest.raises(ValueError, match="none of the 1 examples has a target to learn"):
        post_train(base_bundle, [InstructionExample("a", "b")], PostTrainingConfig(context_size=2))
    with pytest.raises(ValueError, match="1 dropped as longer than context_size"):
        post_train(base_bundle, [InstructionExample("a", "b")],
                   PostTrainingConfig(context_size=2, overlong="drop"))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:3"):
        post_train_jsonl(base_bundle, tmp_path / "bad.jsonl")
    for field, value, message in (
            ("fine_tuning_method", "dpo", "fine_tuning_method"),
            ("nf4_block_size", 48, "nf4_block_size"),
            ("overlong", "x", "overlong"), ("optimizer_state", "y", "optimizer_state"),
            ("lr_schedule", "step", "lr_schedule"),
            ("warmup_steps", 5, "needs lr_schedule"),
            ("gradient_accumulation_steps", 0, "gradient_accumulation_steps"),
            ("early_stopping_patience", 0, "early_stopping_patience"),
            ("minimum_learning_rate_fraction", 1.5, "minimum_learning_rate_fraction"),
            ("weight_decay", -0.1, "weight_decay"),
            ("context_size", 0, "context_size")):
        with pytest.raises(ValueError, match=message):
            PostTrainingConfig(**{field: value})
    with pytest.raises(ValueError, match="warmup_steps .* must be below steps"):
        PostTrainingConfig(steps=5, lr_schedule="cosine", warmup_steps=5)


# ---- safetensors interchange -------------------------------------------------------------------


def test_bundle_safetensors_round_trip_keeps_the_artifact_id(tmp_path, base_bundle):
    path = export_bundle_safetensors(base_bundle, tmp_path / "model.safetensors")
    restored = import_bundle_safetensors(path)
    assert restored.artifact_id == base_bundle.artifact_id
    assert restored.to_bytes() == base_bundle.to_bytes()
    from riftco_transformer.interchange import read_safetensors, write_safetensors

    tensors, metadata = read_safetensors(path)
    del metadata["riftco.config"]
    write_safetensors(tmp_path / "foreign.safetensors", tensors, metadata)
    with pytest.raises(ValueError, match="riftco.config"):
        import_bundle_safetensors(tmp_path / "foreign.safetensors")


def test_the_safetensors_package_reads_our_bundle_export(tmp_path, base_bundle):
    import subprocess

    from support import oracle_python

    python = oracle_python("safetensors")
    path = export_bundle_safetensors(base_bundle, tmp_path / "model.safetensors")
    script = (
        "import sys, json, numpy\n"
        "from safetensors.numpy import load_file\n"
        "from safetensors import safe_open\n"
        "tensors = load_file(sys.argv[1])\n"
        "meta = safe_open(sys.argv[1], framework='numpy').metadata()\n"
        "print(json.dumps({'names': list(tensors), 'sum': float(sum(float(t.astype(numpy.float64).sum()) for t in tensors.values())),"
        " 'shape': list(tensors['token_embedding.weight'].shape), 'id': meta['riftco.artifact_id']}))\n"
    )
    import json

    output = json.loads(subprocess.run([python, "-c", script, str(path)], check=True,
                                       capture_output=True, text=True).stdout)
    assert sorted(output["names"]) == sorted(spec.name for spec in base_bundle.parameters)
    assert output["id"] == base_bundle.artifact_id
    assert output["shape"] == list(base_bundle.parameters[0].shape)
    assert output["sum"] == pytest.approx(sum(float(v) for v in base_bundle.weights), rel=1e-9)


def test_the_file_split_counts_characters_not_bytes_across_chunks(tmp_path, monkeypatch):
    import hashlib

    import riftco_transformer.pretraining as pretraining

    text = "".join(f"línea {i} — naïve café 😀 日本語\n" for i in range(400))
    (tmp_path / "multi.txt").write_text(text)
    held_out = math.ceil(len(text) * 0.1)
    config = PretrainingConfig(steps=2, context_size=8, backend="cpu")
    whole = pretrain_file(tmp_path / "multi.txt", config).bundle.metadata
    monkeypatch.setattr(pretraining, "CHUNK_BYTES", 61)  # many chunks, cut inside characters
    chunked = pretrain_file(tmp_path / "multi.txt", config).bundle.metadata
    for metadata in (whole, chunked):
        assert metadata["validation_text_sha256"] == hashlib.sha256(
            text[-held_out:].encode()).hexdigest()
        assert metadata["training_text_sha256"] == hashlib.sha256(
            text[:-held_out].encode()).hexdigest()
    assert whole == {**chunked, "training_token_count": whole["training_token_count"],
                     "validation_token_count": whole["validation_token_count"],
                     "final_validation_loss": whole["final_validation_loss"]}
