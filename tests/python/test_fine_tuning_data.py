"""Fine-tuning data and optimisation (the fine-tuning issue): whole-example rows padded with an
ignore mask, the over-long policy, epochs and exact resume of the example source; padded
batches against an unpadded oracle; gradient accumulation against one large step; the
learning-rate schedule through the C ABI; early stopping that keeps the best model."""

from __future__ import annotations

import math
import random
from array import array

import pytest
from conftest import TINY_CONFIG

from riftco_transformer import DecoderOnlyTransformer
from riftco_transformer.batching import TrainingBatch
from riftco_transformer.example_batching import ExampleBatchSource, example_batches
from riftco_transformer.native import Adam, AdamOptions, cross_entropy
from riftco_transformer.training import CausalLanguageModelTrainer, evaluate_batches

ROWS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [16, 17]]


# ---- the example source ------------------------------------------------------------------


def test_rows_are_padded_to_the_longest_with_an_ignore_mask():
    (batch,) = example_batches(ROWS[:2], 2, 8)
    assert [list(row) for row in batch.inputs] == [[1, 2, 3, 4], [6, 7, 0, 0]]
    assert [list(row) for row in batch.targets] == [[2, 3, 4, 5], [7, 8, 0, 0]]
    assert batch.target_mask == (b"\x01\x01\x01\x01", b"\x01\x01\x00\x00")
    # A response-only mask flags tokens; a row's targets are tokens 1.., so mask[1:] counts.
    (masked,) = example_batches(ROWS[:2], 2, 8, masks=[b"\x00\x00\x00\x01\x01", b"\x00\x01\x01"],
                                pad_id=5)
    assert masked.target_mask == (b"\x00\x00\x01\x01", b"\x01\x01\x00\x00")
    assert list(masked.inputs[1]) == [6, 7, 5, 5]


def test_over_long_examples_are_truncated_or_dropped_and_counted():
    truncated = ExampleBatchSource(ROWS, 4, 4, 0)
    assert (truncated.truncated_count, truncated.dropped_count, truncated.unusable_count) == \
        (1, 0, 0)
    assert truncated.sequence_count == 4
    batch = truncated.next()
    assert max(len(row) for row in batch.inputs) == 4  # context 4: at most 5 tokens per row
    assert sorted(list(row)[:4] for row in batch.inputs)[2] == [9, 10, 11, 12]
    dropped = ExampleBatchSource(ROWS, 2, 4, 0, overlong="drop")
    assert (dropped.truncated_count, dropped.dropped_count, dropped.sequence_count) == (0, 1, 3)
    # Truncation that cuts the whole response off leaves nothing to learn: counted, left out.
    masks = [bytes(5), b"\x00\x00\x01", b"\x00" * 6 + b"\x01", b"\x00\x01"]
    source = ExampleBatchSource(ROWS, 1, 4, 0, masks=masks)
    assert (source.unusable_count, source.truncated_count, source.sequence_count) == (2, 1, 2)
    with pytest.raises(ValueError, match="none of the 1 examples has a target to learn"):
        ExampleBatchSource([[1, 2, 3]], 1, 4, 0, masks=[bytes(3)])
    with pytest.raises(ValueError, match="2 dropped as longer than context_size"):
        ExampleBatchSource(ROWS[2:3] + ROWS[:1], 1, 3, 0, overlong="drop")
    for keywords, message in (({"overlong": "wrap"}, "overlong"), ({"pad_id": -1}, "pad_id"),
                              ({"masks": [b"\x01"]}, "masks has 1 rows"),
                              ({"masks": [bytes([2]) * len(row) for row in ROWS]}, "other than 0 or 1")):
        with pytest.raises(ValueError, match=message):
            ExampleBatchSource(ROWS, 1, 4, 0, **keywords)


def test_every_epoch_visits_every_example_once_in_a_seeded_order():
    rows = [[index, index + 1, index + 2] for index in range(0, 70, 7)]
    source = ExampleBatchSource(rows, 4, 8, 11)
    seen = [row[0] for _ in range(5) for row in source.next().inputs]  # 20 rows: 2 epochs
    firsts = [row[0] for row in rows]
    assert sorted(seen[:10]) == firsts and sorted(seen[10:]) == firsts
    assert seen[:10] != firsts  # shuffled
    again = ExampleBatchSource(rows, 4, 8, 11)
    assert [row[0] for _ in range(5) for row in again.next().inputs] == seen
    other = ExampleBatchSource(rows, 4, 8, 12)
    assert [row[0] for _ in range(5) for row in other.next().inputs] != seen
    in_order = ExampleBatchSource(rows, 5, 8, 11, shuffle=False)
    assert [row[0] for row in in_order.next().inputs] == firsts[:5]


@pytest.mark.parametrize("taken", [0, 1, 3, 5, 6])
def test_the_source_resumes_exactly_from_its_state(taken):
    rows = [[index] * (2 + index % 4) for index in range(1, 8)]
    source = ExampleBatchSource(rows, 3, 8, 5)
    for _ in range(taken):
        source.next()
    state = source.capture_state()
    expected = [source.next() for _ in range(4)]
    resumed = ExampleBatchSource(rows, 3, 8, 5)
    resumed.restore_state(state)
    assert resumed.batches_emitted == taken
    assert [resumed.next() for _ in range(4)] == expected


def test_a_state_of_other_data_or_another_seed_is_refused_and_changes_nothing():
    rows = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    source = ExampleBatchSource(rows, 2, 8, 5)
    source.next()
    state = source.capture_state()
    fresh = ExampleBatchSource(rows, 2, 8, 5)
    before = fresh.capture_state()
    for other, message in ((ExampleBatchSource(rows, 2, 8, 6).capture_state(), None),
                           ({**state, "batches_emitted": 2}, "not this source's"),
                           ({**state, "type": "sequence_window"}, "'sequence_window' source"),
                           ({**state, "fingerprint": "0" * 64}, "fingerprint differs"),
                           ({**state, "batches_emitted": -1}, "batches_emitted"),
                           ({"type": "example_rows"}, "must have type")):
        if message is None:  # another seed, same position: the generator differs
            other = {**other, "batches_emitted": 0, "rng": {**state["rng"]}}
            other["rng"]["state"] = list(other["rng"]["state"])
            other["rng"]["state"][3] ^= 1
            message = "not this source's"
        with pytest.raises(ValueError, match=message):
            fresh.restore_state(other)
        assert fresh.capture_state() == before
    with pytest.raises(ValueError, match="fingerprint differs"):
        ExampleBatchSource(rows[:2], 2, 8, 5).restore_state(state)


# ---- padded batches against the unpadded oracle ------------------------------------------


def _row_loss_sum(model, row: list[int], mask: bytes | None) -> tuple[float, int]:
    """An example's summed target loss and count, computed alone (no padding)."""
    inputs, targets = array("I", row[:-1]), array("I", row[1:])
    flags = [1] * len(targets) if mask is None else list(mask[1:])
    logits = model([inputs])
    total = 0.0
    values = logits.to_array()
    vocabulary = TINY_CONFIG.vocabulary_size
    for position, (target, flag) in enumerate(zip(targets, flags, strict=True)):
        if not flag:
            continue
        scores = values[position * vocabulary:(position + 1) * vocabulary]
        top = max(scores)
        total += math.log(sum(math.exp(s - top) for s in scores)) + top - scores[target]
    logits.close()
    return total, sum(flags)


def test_a_padded_batch_scores_like_each_example_alone():
    generator = random.Random(3)
    rows = [[generator.randrange(32) for _ in range(length)] for length in (9, 4, 7, 2)]
    masks = [bytes(generator.randrange(2) | (i == len(row) - 1) for i in range(len(row)))
             for row in rows]
    with DecoderOnlyTransformer(TINY_CONFIG) as model:
        for use_masks in (False, True):
            given = masks if use_masks else None
            (batch,) = example_batches(rows, 4, 8, given)
            assert batch.context_size == 8  # the 9-token row: 8 positions, the others padded
            padded = evaluate_batches(model, [batch])
            sums = [_row_loss_sum(model, row, None if given is None else given[i])
                    for i, row in enumerate(rows)]
            oracle = sum(total for total, _ in sums) / sum(count for _, count in sums)
            assert padded == pytest.approx(oracle, rel=1e-6)
            # and the real positions' logits are the unpadded ones
            logits = model(list(batch.inputs)).to_array()
            alone = model([array("I", rows[1][:-1])]).to_array()
            vocabulary = TINY_CONFIG.vocabulary_size
            start = 1 * 8 * vocabulary
            assert list(logits[start:start + 3 * vocabulary]) == pytest.approx(list(alone),
                                                                               rel=1e-6, abs=1e-6)


def test_gradient_accumulation_equals_one_step_on_all_the_rows():
    generator = random.Random(8)
    rows = [[generator.randrange(32) for _ in range(length)] for length in (9, 3, 6, 5)]
    masks = [b"\x00" + b"\x01" * (len(row) - 1) for row in rows]
    masks[2] = b"\x00\x00\x00\x01\x01\x01"
    whole = example_batches(rows, 4, 8, masks)
    halves = example_batches(rows, 2, 8, masks)  # padded to 8 and 5 positions
    results = []
    for batches in (whole, halves):
        with DecoderOnlyTransformer(TINY_CONFIG) as model:
            with model.parameters() as parameters:
                # A first Adam step moves each value by lr·g/(|g| + eps): with eps = 1 it is
                # close to linear in g, so float noise in a near-zero g cannot flip its sign.
                optimizer = Adam(parameters, learning_rate=1.0, epsilon=1.0,
                                 maximum_gradient_norm=math.inf)
            trainer = CausalLanguageModelTrainer(model, optimizer)
            metric = trainer.train_step(list(batches))
            optimizer.close()
            with model.parameters() as parameters:
                results.append((metric, parameters.flat_values()))
    (one, one_values), (accumulated, accumulated_values) = results
    assert accumulated.loss == pytest.approx(one.loss, rel=1e-6)
    assert accumulated.gradient_norm == pytest.approx(one.gradient_norm, rel=1e-5)
    assert list(accumulated_values) == pytest.approx(list(one_values), rel=1e-5, abs=1e-6)


def test_the_step_uses_and_reports_the_scheduled_learning_rate():
    # W = 2, T = 6, f = 0.1, cosine (hand-computed in tests/test_adam.cpp).
    rates = [0.005, 0.01, 0.00868198, 0.0055, 0.00231802, 0.001, 0.001]
    options = AdamOptions(learning_rate=0.01, schedule="cosine", warmup_steps=2, total_steps=6,
                          minimum_fraction=0.1)
    with DecoderOnlyTransformer(TINY_CONFIG) as model:
        with model.parameters() as parameters, Adam(parameters, options) as optimizer:
            for rate in rates:
                loss = cross_entropy(model([[1, 2, 3]]), [[2, 3, 4]])
                loss.backward()
                loss.close()
                stats = optimizer.step()
                assert stats.learning_rate == pytest.approx(rate * (0.01 / 0.01), rel=1e-6)
    for keywords, message in (({"schedule": "step"}, "schedule"),
                              ({"warmup_steps": 2}, "must be 0 with schedule 'constant'"),
                              ({"schedule": "linear", "total_steps": 0}, "must exceed"),
                              ({"schedule": "linear", "total_steps": 3,
                                "minimum_fraction": 2.0}, r"\[0, 1\]"),
                              ({"weight_decay": -1.0}, "weight_decay")):
        with pytest.raises(ValueError, match=message):
            AdamOptions(**keywords)


# ---- post-training: validation, early stopping, resume ------------------------------------


@pytest.fixture(scope="module")
def base_bundle():
    from conftest import REPOSITORY

    from riftco_transformer.pretraining import PretrainingConfig, pretrain_text

    corpus = (REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt").read_text()[:40000]
    return pretrain_text(corpus, PretrainingConfig(steps=20, context_size=128, model_width=32,
                                                   feed_forward_width=64, backend="cpu")).bundle


@pytest.fixture(scope="module")
def instructions():
    from conftest import REPOSITORY

    from riftco_transformer.instructions import read_instructions_jsonl

    return read_instructions_jsonl(REPOSITORY / "data" / "instructions" /
                                   "tiny_instructions.jsonl")


def test_early_stopping_keeps_exactly_the_best_validation_model(base_bundle, instructions):
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    train, held_out = instructions[:36], instructions[36:]
    config = PostTrainingConfig(steps=30, batch_size=4, backend="cpu", learning_rate=2e-2,
                                fine_tuning_method="lora", evaluation_interval=2,
                                early_stopping_patience=2)
    stopped = post_train(base_bundle, train, config, validation_examples=held_out)
    validations = [m for m in stopped.metrics if m.phase == "validation"]
    trained = [m for m in stopped.metrics if m.phase == "train"]
    best = min(validations, key=lambda m: m.loss)
    assert stopped.best_step == best.step == stopped.bundle.metadata["best_step"]
    if stopped.stopped_early:  # two validations past the best, then the run ended
        assert trained[-1].step == best.step + 2 * config.evaluation_interval
    assert stopped.data["used_example_count"] == 36
    # The kept model is exactly the one a run of best.step steps ends with (constant rate).
    import dataclasses

    if best.step == 0:
        assert stopped.bundle.weights == base_bundle.weights
    else:
        plain = post_train(base_bundle, train, dataclasses.replace(
            config, steps=best.step, early_stopping_patience=None)).bundle
        assert stopped.bundle.weights == plain.weights


def test_an_interrupted_run_with_early_stopping_resumes_to_the_same_bundle(base_bundle,
                                                                          instructions, tmp_path):
    from riftco_transformer.post_training import (
        PostTrainingConfig,
        best_checkpoint_path,
        post_train,
    )

    train, held_out = instructions[:36], instructions[36:]
    config = PostTrainingConfig(steps=12, batch_size=2, backend="cpu", learning_rate=5e-3,
                                fine_tuning_method="lora", evaluation_interval=2,
                                early_stopping_patience=3, lr_schedule="cosine", warmup_steps=3,
                                gradient_accumulation_steps=2, minimum_learning_rate_fraction=0.1)
    whole = post_train(base_bundle, train, config, validation_examples=held_out)

    class Interrupted(Exception):
        pass

    def interrupt(metric):
        if metric.step == 7:
            raise Interrupted

    path = tmp_path / "run.riftckpt"
    with pytest.raises(Interrupted):
        post_train(base_bundle, train, config, validation_examples=held_out, on_step=interrupt,
                   checkpoint_path=path, checkpoint_interval=3)
    assert best_checkpoint_path(path).is_file()
    resumed = post_train(base_bundle, train, config, validation_examples=held_out,
                         resume_from=path, checkpoint_path=path, checkpoint_interval=3)
    assert resumed.bundle.weights == whole.bundle.weights
    assert resumed.best_step == whole.best_step
    # Resuming with another schedule is refused before any step.
    import dataclasses

    with pytest.raises(ValueError, match="schedule"):
        post_train(base_bundle, train, dataclasses.replace(config, lr_schedule="linear"),
                   validation_examples=held_out, resume_from=path, checkpoint_path=path)


def test_the_whole_example_run_no_longer_needs_examples_longer_than_the_context(base_bundle):
    """The issue's report: context 64 and short examples used to fail ("N examples encode to
    <= context_size"); now every example trains whole, in one row."""
    from riftco_transformer.instructions import InstructionExample
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    short = [InstructionExample(f"Say {word}.", word) for word in ("yes", "no", "maybe", "ok")]
    result = post_train(base_bundle, short, PostTrainingConfig(steps=2, context_size=64,
                                                                backend="cpu"))
    assert result.data["used_example_count"] == 4 and result.data["truncated_count"] == 0


# ---- packing -------------------------------------------------------------------------------


def test_packing_fills_rows_with_whole_examples_at_their_own_positions():
    rows = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [16, 17]]
    source = ExampleBatchSource(rows, 2, 8, 0, shuffle=False, packing=True)
    batch = source.next()
    # 4 + 2 positions fit in 8; the 6 of the next example do not: it starts row 2 with the
    # last (6 + 1). Rows pad to the longest (7); the padding is a document of its own.
    assert [list(r) for r in batch.inputs] == [[1, 2, 3, 4, 6, 7, 0],
                                               [9, 10, 11, 12, 13, 14, 16]]
    assert [list(r) for r in batch.targets] == [[2, 3, 4, 5, 7, 8, 0],
                                                [10, 11, 12, 13, 14, 15, 17]]
    assert [list(p) for p in batch.positions] == [[0, 1, 2, 3, 0, 1, 0],
                                                  [0, 1, 2, 3, 4, 5, 0]]
    assert batch.target_mask == (b"\x01" * 6 + b"\x00", b"\x01" * 7)
    assert source.next().inputs[0][:4] == array("I", [1, 2, 3, 4])  # the next epoch


@pytest.mark.parametrize("taken", [0, 1, 2, 5])
def test_a_packed_source_resumes_exactly_and_visits_every_example_once_per_epoch(taken):
    generator = random.Random(2)
    rows = [[index] * generator.randrange(2, 7) for index in range(1, 12)]
    source = ExampleBatchSource(rows, 2, 10, 5, packing=True)
    seen = []
    for _ in range(taken):
        batch = source.next()
        for inputs, positions in zip(batch.inputs, batch.positions, strict=True):
            seen += [token for token, position in zip(inputs, positions, strict=True)
                     if position == 0 and token != 0]
    state = source.capture_state()
    expected = [source.next() for _ in range(3)]
    resumed = ExampleBatchSource(rows, 2, 10, 5, packing=True)
    resumed.restore_state(state)
    assert [resumed.next() for _ in range(3)] == expected
    if len(seen) >= len(rows):
        assert sorted(seen[:len(rows)]) == list(range(1, 12))
    # The packed source is another source: an unpacked one refuses its state.
    with pytest.raises(ValueError, match="fingerprint differs"):
        ExampleBatchSource(rows, 2, 10, 5).restore_state(state)


@pytest.mark.parametrize("attention", ["materialized", "flash"])
def test_packing_equals_the_unpadded_run_in_loss_and_gradients(attention):
    """The issue's acceptance: packed rows against the same examples one per row, on a batch of
    varied lengths: the loss within 1e-6 and the gradients (through a near-linear Adam step)
    within 1e-6."""
    generator = random.Random(5)
    lengths = (7, 3, 5, 2, 4, 8)  # 6+2 | 4+1+3 | 7 positions: every example in three rows
    rows = [[generator.randrange(1, 32) for _ in range(length)] for length in lengths]
    masks = [bytes(generator.randrange(2) | (i == len(row) - 1) for i in range(len(row)))
             for row in rows]
    packed = ExampleBatchSource(rows, 3, 8, 0, masks=masks, shuffle=False, packing=True).next()
    assert len(packed.inputs) == 3 and packed.positions is not None
    (unpacked,) = example_batches(rows, 6, 8, masks)
    results = []
    for batch in (packed, unpacked):
        with DecoderOnlyTransformer(TINY_CONFIG) as model:
            model.set_full_sequence_attention(attention)
            with model.parameters() as parameters:
                optimizer = Adam(parameters, learning_rate=1.0, epsilon=1.0,
                                 maximum_gradient_norm=math.inf)
            metric = CausalLanguageModelTrainer(model, optimizer).train_step(batch)
            optimizer.close()
            with model.parameters() as parameters:
                results.append((metric.loss, list(parameters.flat_values())))
    (packed_loss, packed_values), (unpacked_loss, unpacked_values) = results
    assert packed_loss == pytest.approx(unpacked_loss, rel=1e-6)
    assert packed_values == pytest.approx(unpacked_values, rel=0, abs=1e-6)


def test_packed_post_training_runs_and_reports_it(base_bundle, instructions):
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    config = PostTrainingConfig(steps=3, batch_size=2, backend="cpu", packing=True,
                                fine_tuning_method="lora", learning_rate=1e-2)
    result = post_train(base_bundle, instructions[:20], config)
    assert result.data["packing"] is True and result.data["used_example_count"] == 20
    assert all(m.loss > 0 for m in result.metrics)


def test_sigterm_checkpoints_at_a_step_boundary_and_the_run_resumes_exactly(base_bundle,
                                                                           tmp_path):
    """SIGTERM (what a scheduler or `kill` sends) is handled as Ctrl-C is: the run stops after
    the step in progress, writes its checkpoint and exits 143; --resume ends with the bundle of
    the uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPOSITORY

    from riftco_transformer.artifacts import ModelBundle

    base = base_bundle.save(tmp_path / "base.rift")
    instructions = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}

    def command(output, *extra):
        return [sys.executable, "-m", "riftco_transformer", "post-train", "--base", str(base),
                "--instructions", str(instructions), "--steps", "200", "--method", "lora",
                "--learning-rate", "0.01", "--lr-schedule", "cosine", "--warmup-steps", "5",
                "--no-progress", "--backend", "cpu", "--output", str(output), *extra]

    subprocess.run(command(tmp_path / "whole.rift"), env=environment, check=True,
                   capture_output=True, timeout=300)
    checkpoint = tmp_path / "run.riftckpt"
    metrics = tmp_path / "run.rift.metrics.jsonl"
    # The signal goes once a few steps are done. On a loaded machine this process may not run
    # again before the whole run is over; such an attempt proves nothing and is made again.
    for _attempt in range(3):
        for leftover in (checkpoint, metrics, tmp_path / "run.rift"):
            leftover.unlink(missing_ok=True)
        process = subprocess.Popen(command(tmp_path / "run.rift", "--checkpoint", checkpoint,
                                           "--checkpoint-every", "1000"),
                                   env=environment, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while (not metrics.exists() or len(metrics.read_text().splitlines()) < 5) and \
                process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if process.poll() is None:
            break
        process.communicate(timeout=120)
    assert process.poll() is None, "the run ended before it was interrupted, three times"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    assert "interrupted after step" in stderr and checkpoint.is_file()
    assert not (tmp_path / "run.rift").exists()
    subprocess.run(command(tmp_path / "run.rift", "--resume", checkpoint), env=environment,
                   check=True, capture_output=True, timeout=300)
    assert ModelBundle.load(tmp_path / "run.rift").weights == \
        ModelBundle.load(tmp_path / "whole.rift").weights


def test_resuming_a_run_that_early_stopping_ended_trains_no_further(base_bundle, instructions,
                                                                    tmp_path):
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    train, held_out = instructions[:36], instructions[36:]
    # A rate this large makes every validation after step 0 worse: the run stops at step 2.
    config = PostTrainingConfig(steps=20, batch_size=4, backend="cpu", learning_rate=5.0,
                                fine_tuning_method="lora", evaluation_interval=1,
                                early_stopping_patience=2)
    path = tmp_path / "run.riftckpt"
    stopped = post_train(base_bundle, train, config, validation_examples=held_out,
                         checkpoint_path=path)
    assert stopped.stopped_early and stopped.best_step == 0
    again = post_train(base_bundle, train, config, validation_examples=held_out,
                       resume_from=path, checkpoint_path=path)
    assert again.stopped_early and again.metrics == ()
    assert again.bundle.weights == stopped.bundle.weights == base_bundle.weights


def test_a_checkpoint_of_another_method_is_refused_before_anything_changes(base_bundle,
                                                                           instructions,
                                                                           tmp_path):
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    config = PostTrainingConfig(steps=2, batch_size=2, backend="cpu", learning_rate=1e-2,
                                fine_tuning_method="lora")
    path = tmp_path / "lora.riftckpt"
    post_train(base_bundle, instructions[:8], config, checkpoint_path=path)
    for method in ("full", "qlora"):
        with pytest.raises(ValueError, match=f"a lora run; this run is {method} "
                                             r"\(--method lora resumes it\)"):
            post_train(base_bundle, instructions[:8],
                       PostTrainingConfig(steps=4, batch_size=2, backend="cpu",
                                          learning_rate=1e-2, fine_tuning_method=method),
                       resume_from=path)


def test_accumulation_skips_a_batch_that_counts_nothing_and_refuses_an_empty_step():
    counted = TrainingBatch((array("I", [1, 2, 3]),), (array("I", [2, 3, 4]),), (b"\x01\x01\x01",))
    empty = TrainingBatch((array("I", [5, 6]),), (array("I", [6, 7]),), (b"\x00\x00",))
    results = []
    for batches in ([counted], [counted, empty], [empty, counted]):
        with DecoderOnlyTransformer(TINY_CONFIG) as model:
            with model.parameters() as parameters:
                optimizer = Adam(parameters, learning_rate=1e-2)
            metric = CausalLanguageModelTrainer(model, optimizer).train_step(batches)
            optimizer.close()
            with model.parameters() as parameters:
                results.append((metric.loss, list(parameters.flat_values())))
    assert results[0] == results[1] == results[2]
    with DecoderOnlyTransformer(TINY_CONFIG) as model:
        with model.parameters() as parameters, Adam(parameters) as optimizer:
            with pytest.raises(ValueError, match="no target counts"):
                CausalLanguageModelTrainer(model, optimizer).train_step([empty, empty])
            assert optimizer.step_count == 0
