"""riftco_transformer.distributed: data parallelism over MPI.

Everywhere: the single-process group, the API's rules, and a trainer with a world of one equal
to the plain trainer bit for bit (with gradient accumulation too). With an MPI-enabled library
(the `mpi` preset's CTest entry ``distributed.python`` sets RIFTCO_TRANSFORMER_REQUIRE_MPI=1, so
nothing skips there) the CLI runs under ``mpirun``: 2 and 4 ranks against one process on the
same global batches, a checkpoint written by 2 ranks resumed by 1 (and the reverse), ranks
started with different flags, a rank killed mid-run and a rank that stops answering: every rank
ends, with a clear error, well within the time limit. ``riftco post-train --data-parallel``
likewise: full, LoRA and QLoRA from a bundle (--base) and a pretrained model (--model) against
one process, early stopping and a checkpoint written by 2 ranks resumed by 4, ranks with
different flags, a global batch that does not split, and gradient accumulation (against one
process accumulating the same micro-batches, and one process with them in one batch); and the
trainer's accumulation under 2 and 4 ranks whose micro-batch shards count nothing in turn.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from array import array
from pathlib import Path

import pytest

from riftco_transformer import Adam, DecoderOnlyTransformer, RiftcoTransformerError, TransformerConfig
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.batching import RandomWindowBatchSource
from riftco_transformer.distributed import DataParallel, ProcessGroup, compiled_in
from riftco_transformer.training import CausalLanguageModelTrainer, TrainingLoopConfig
from conftest import PYTHON_SOURCE, REPOSITORY

CORPUS = REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt"
INSTRUCTIONS = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"


# ---- everywhere ---------------------------------------------------------------------------


def test_a_library_without_mpi_says_so():
    if compiled_in():
        pytest.skip("this library links MPI")
    with pytest.raises(RiftcoTransformerError, match="not compiled in"):
        ProcessGroup()


def test_single_process_group_and_argument_rules():
    with pytest.raises(ValueError, match="positive number of seconds"):
        ProcessGroup(timeout=0)
    with pytest.raises(TypeError, match="seconds"):
        ProcessGroup(timeout="1")
    with ProcessGroup.single() as group:
        assert (group.rank, group.world_size) == (0, 1)
        assert group.allreduce_sum([1.5, -2.0]) == [1.5, -2.0]
        assert group.allgather(42) == [42]
        assert group.broadcast_object_bytes(b"abc") == b"abc"
        group.barrier()
        parallel = DataParallel(group)
        assert parallel.shard(6) == (0, 6)
        with pytest.raises(ValueError, match="multiple of the world size"):
            parallel.shard(0)
        with pytest.raises(ValueError, match="bucket_bytes"):
            DataParallel(group, bucket_bytes=2)
        with pytest.raises(TypeError, match="ProcessGroup"):
            DataParallel("group")
        config = TransformerConfig(40, 8, 16, 2, 1, 32, 3)
        with DecoderOnlyTransformer(config) as model:
            with pytest.raises(RiftcoTransformerError, match="local_weight"):
                parallel.reduce_gradients(model, -1.0)
            assert parallel.parameter_hash(model) == parallel.parameter_hash(model)
            assert parallel.replicas_identical(model)


def _train(data_parallel, steps=4, bucket=None):
    tokens = array("I", [(7 * i + i // 3) % 40 for i in range(2000)])
    config = TransformerConfig(40, 8, 16, 2, 1, 32, 3)
    model = DecoderOnlyTransformer(config)
    with model.parameters() as parameters:
        optimizer = Adam(parameters, learning_rate=3e-3, maximum_gradient_norm=0.5)
    trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=data_parallel)
    metrics = trainer.run(RandomWindowBatchSource(tokens, 4, 8, 5), TrainingLoopConfig(steps))
    values = model.parameters().flat_values()
    trainer.optimizer.close()
    model.close()
    return [m.loss for m in metrics], values


@pytest.mark.parametrize("shard_optimizer", [False, True])
def test_a_world_of_one_trains_exactly_like_the_plain_trainer(shard_optimizer):
    """The trainer's overlapped reduction, and ZeRO-1's sharded optimizer (the trainer swaps
    it in), change nothing over a world of one: the same losses and values, bit for bit."""
    plain_losses, plain_values = _train(None)
    with ProcessGroup.single() as group:
        losses, values = _train(DataParallel(group, bucket_bytes=64,
                                             shard_optimizer=shard_optimizer))
        assert group.communication[0] > 0
    assert losses == plain_losses
    assert values.tobytes() == plain_values.tobytes()


def test_backward_and_reduce_equals_backward_then_reduce_and_checks_its_arguments():
    from riftco_transformer.native import cross_entropy

    tokens = [[(5 * i + row) % 40 for i in range(8)] for row in range(2)]
    config = TransformerConfig(40, 8, 16, 2, 1, 32, 3)
    hashes = []
    with ProcessGroup.single() as group:
        parallel = DataParallel(group, bucket_bytes=256)
        for overlapped in (False, True):
            with DecoderOnlyTransformer(config) as model, model.parameters() as parameters:
                loss = cross_entropy(model(tokens), tokens)
                if overlapped:
                    with pytest.raises(ValueError, match="scale must be a finite number"):
                        parallel.backward_and_reduce(parameters, loss, 16, scale=math.inf)
                    with pytest.raises(TypeError, match="loss must be a Variable"):
                        parallel.backward_and_reduce(parameters, "loss", 16)
                    with pytest.raises(RiftcoTransformerError, match="local_weight"):
                        parallel.backward_and_reduce(parameters, loss, -1.0)
                    assert parallel.backward_and_reduce(parameters, loss, 16, 0.5) == 16.0
                    with pytest.raises(RiftcoTransformerError, match="consumed"):
                        parallel.backward_and_reduce(parameters, loss, 16)
                else:
                    loss.backward_scaled(0.5)
                    assert parallel.reduce_gradients(parameters, 16) == 16.0
                loss.close()
                with Adam(parameters, learning_rate=1e-2) as optimizer:
                    optimizer.step()
                hashes.append(parallel.parameter_hash(parameters))
        assert hashes[0] == hashes[1]
        with pytest.raises(TypeError, match="shard_optimizer must be a bool"):
            DataParallel(group, shard_optimizer=1)
        with DecoderOnlyTransformer(config) as model, model.parameters() as parameters:
            with pytest.raises(TypeError, match="sharded_over must be a DataParallel"):
                Adam(parameters, sharded_over=group)
            with Adam(parameters, sharded_over=parallel) as sharded, \
                    Adam(parameters) as plain:
                assert sharded.sharded and not plain.sharded
                held, unsharded = sharded.state_bytes_held
                assert held == unsharded == plain.state_payload_bytes


# ---- under mpirun -------------------------------------------------------------------------


def _mpirun() -> str:
    required = os.environ.get("RIFTCO_TRANSFORMER_REQUIRE_MPI") == "1"
    problem = None
    if not compiled_in():
        problem = "the loaded library is built without MPI (the `mpi` preset builds one)"
    launcher = os.environ.get("MPIEXEC") or shutil.which("mpirun")
    if problem is None and not launcher:
        problem = "no mpirun (Debian: openmpi-bin)"
    if problem is not None:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)
    return launcher


def _environment() -> dict:
    environment = dict(os.environ)
    environment.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PYTHON_SOURCE),
        # Loopback only, and no probing of other interfaces.
        "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
        "OMPI_MCA_oob_tcp_if_include": "lo",
    })
    return environment


def _run(arguments: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(arguments, capture_output=True, text=True, timeout=timeout,
                          env=_environment())


def _pretrain_arguments(output: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "riftco_transformer", "pretrain", "--file", str(CORPUS),
            "--output", str(output), "--steps", str(steps), "--batch-size", "8",
            "--context", "16", "--learning-rate", "0.003",
            "--model-width", "32", "--heads", "4", "--blocks", "2",
            "--feed-forward-width", "64", "--eval-every", "1000", "--no-progress", *extra]


def _train_losses(output: Path) -> list[float]:
    path = output.with_name(output.name + ".metrics.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [record["loss"] for record in records if record["phase"] == "train"]


def _weights(output: Path) -> dict[str, array]:
    bundle = ModelBundle.load(output)
    weights = array("f", bundle.weights)
    return {spec.name: weights[spec.offset:spec.offset + spec.count]
            for spec in bundle._parameters}


def _norm_relative(a: array, b: array) -> float:
    difference = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    norm = math.sqrt(sum(y * y for y in b))
    return difference / norm if norm else difference


def _expect_same_run(output: Path, reference: Path, loss_tolerance=1e-6,
                     weight_tolerance=1e-6) -> None:
    losses, expected = _train_losses(output), _train_losses(reference)
    assert len(losses) == len(expected)
    for loss, want in zip(losses, expected):
        assert abs(loss - want) <= loss_tolerance * abs(want), (losses, expected)
    ours, theirs = _weights(output), _weights(reference)
    assert list(ours) == list(theirs)
    for name in ours:
        if name.endswith("attention.key.bias"):
            continue  # zero true gradient: Adam turns rounding noise into ±lr steps (see
            # tests/distributed/mpi_ranks.cpp, which shows the gradient is noise)
        assert _norm_relative(ours[name], theirs[name]) <= weight_tolerance, name


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    _mpirun()
    output = tmp_path_factory.mktemp("single") / "single.rift"
    completed = _run(_pretrain_arguments(output, 8))
    assert completed.returncode == 0, completed.stderr
    return output


@pytest.mark.parametrize("ranks, zero", [(2, False), (4, False), (2, True), (4, True)])
def test_ranks_match_one_process_on_the_same_global_batches(tmp_path, one_process_run, ranks,
                                                           zero):
    """The overlapped reduction (the trainer's), and ZeRO-1 (--zero-1) on top of it."""
    launcher = _mpirun()
    output = tmp_path / f"ranks{ranks}.rift"
    completed = _run([launcher, "-n", str(ranks), "--oversubscribe",
                      *_pretrain_arguments(output, 8, "--data-parallel",
                                           *(["--zero-1"] if zero else []))])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert f"data parallel over {ranks} ranks" in completed.stdout
    _expect_same_run(output, one_process_run)


@pytest.mark.parametrize("zero", [False, True])
def test_a_checkpoint_resumes_with_another_world_size(tmp_path, one_process_run, zero):
    """With --zero-1 the checkpoints hold the whole optimizer state: 2 sharded ranks' one
    resumes in one unsharded process, and one process's in 4 sharded ranks."""
    launcher = _mpirun()
    sharding = ["--zero-1"] if zero else []
    # 2 ranks write a checkpoint at step 4; 1 process resumes it to step 8 ...
    first = tmp_path / "two_then_one.rift"
    checkpoint = tmp_path / "two.riftckpt"
    completed = _run([launcher, "-n", "2", "--oversubscribe",
                      *_pretrain_arguments(first, 4, "--data-parallel", *sharding,
                                           "--checkpoint", str(checkpoint))])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    completed = _run(_pretrain_arguments(first, 8, "--resume", str(checkpoint),
                                         "--checkpoint", str(tmp_path / "one.riftckpt")))
    assert completed.returncode == 0, completed.stderr
    _expect_same_run(first, one_process_run)
    # ... and 1 process's checkpoint at step 4 resumed by 4 ranks.
    second = tmp_path / "one_then_four.rift"
    single_checkpoint = tmp_path / "single.riftckpt"
    completed = _run(_pretrain_arguments(second, 4, "--checkpoint", str(single_checkpoint)))
    assert completed.returncode == 0, completed.stderr
    completed = _run([launcher, "-n", "4", "--oversubscribe",
                      *_pretrain_arguments(second, 8, "--data-parallel", *sharding, "--resume",
                                           str(single_checkpoint))])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    _expect_same_run(second, one_process_run)


def test_ranks_started_with_different_flags_all_stop_with_a_clear_error(tmp_path):
    launcher = _mpirun()
    output = tmp_path / "mismatch.rift"
    base = _pretrain_arguments(output, 4, "--data-parallel")
    other = [*base]
    other[other.index("--model-width") + 1] = "48"
    started = time.monotonic()
    completed = _run([launcher, "-n", "1", *base, ":", "-n", "1", *other], timeout=120)
    assert completed.returncode != 0
    assert completed.stderr.count("runs a different configuration or data than rank 0") == 2, \
        completed.stderr
    assert time.monotonic() - started < 60
    assert not output.exists()


FAULT_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from array import array
    from riftco_transformer import Adam, DecoderOnlyTransformer, TransformerConfig
    from riftco_transformer.batching import RandomWindowBatchSource
    from riftco_transformer.distributed import DataParallel, ProcessGroup
    from riftco_transformer.training import CausalLanguageModelTrainer, TrainingLoopConfig

    mode = sys.argv[1]
    group = ProcessGroup(timeout=3.0)
    parallel = DataParallel(group)
    model = DecoderOnlyTransformer(TransformerConfig(40, 8, 16, 2, 1, 32, 3))
    optimizer = Adam(model.parameters())
    trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=parallel)
    tokens = array("I", [i % 40 for i in range(500)])
    source = RandomWindowBatchSource(tokens, 4, 8, 5)

    def on_step(metric):
        print(f"rank {group.rank} step {metric.step}", flush=True)
        if group.rank == 1 and metric.step == 3:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # "stop": alive but never answering again

    try:
        trainer.run(source, TrainingLoopConfig(1000), on_step=on_step)
    except Exception as error:
        print(f"rank {group.rank}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
""")


@pytest.mark.parametrize("mode", ["kill", "stop"])
def test_a_rank_that_dies_or_stops_ends_every_rank_quickly(tmp_path, mode):
    launcher = _mpirun()
    script = tmp_path / "fault.py"
    script.write_text(FAULT_SCRIPT)
    started = time.monotonic()
    completed = _run([launcher, "-n", "2", "--oversubscribe", sys.executable, str(script), mode],
                     timeout=120)
    elapsed = time.monotonic() - started
    assert completed.returncode != 0
    assert "rank 0 step 3" in completed.stdout
    assert elapsed < 60, elapsed
    output = completed.stdout + completed.stderr
    if mode == "kill":  # mpirun reports the dead rank and ends the others
        assert "signal 9" in output or "Killed" in output, output
    else:  # rank 0's collective deadline fires; its exit ends the job
        assert "timed out after 3000 ms" in output, output


def test_a_masked_batch_on_a_world_of_one_equals_the_plain_trainer():
    """Response-only batches weight each shard by its counted targets (here one shard)."""
    from riftco_transformer.batching import TrainingBatch

    rows = [array("I", [(3 * r + t) % 40 for t in range(8)]) for r in range(4)]
    targets = [array("I", [(3 * r + t + 1) % 40 for t in range(8)]) for r in range(4)]
    mask = tuple(bytes([0, 0, 1, 1, 0, 1, 1, 1]) for _ in range(4))
    batch = TrainingBatch(tuple(rows), tuple(targets), mask)
    results = []
    with ProcessGroup.single() as group:
        for parallel in (None, DataParallel(group)):
            with DecoderOnlyTransformer(TransformerConfig(40, 8, 16, 2, 1, 32, 3)) as model:
                with model.parameters() as parameters, Adam(parameters) as optimizer:
                    trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=parallel)
                    loss = trainer.train_step(batch).loss
                    results.append((loss, parameters.flat_values().tobytes()))
    assert results[0] == results[1]


def _accumulation_steps():
    """Steps of micro-batches of 2 to 4 rows (contexts 8 and 6) with response masks, some of
    which count nothing: the last counted one first, last or in the middle, and a step whose
    only counted micro-batch is both its first and its last."""
    from riftco_transformer.batching import TrainingBatch

    def batch(rows: int, context: int, seed: int, mask=None) -> TrainingBatch:
        ids = [[(seed * 7 + 3 * r + t) % 40 for t in range(context + 1)] for r in range(rows)]
        return TrainingBatch(tuple(array("I", row[:-1]) for row in ids),
                             tuple(array("I", row[1:]) for row in ids),
                             None if mask is None else tuple(mask(r) for r in range(rows)))

    def response(r: int) -> bytes:
        return bytes([0] * (2 + r % 3) + [1] * (6 - r % 3))

    def empty(_: int) -> bytes:
        return bytes(8)

    return [
        [batch(4, 8, 1, response), batch(2, 8, 2), batch(4, 8, 3, response)],
        [batch(2, 8, 4, response), batch(4, 8, 5, empty), batch(2, 8, 6, response)],
        [batch(4, 8, 7, empty), batch(2, 8, 8, response), batch(2, 8, 9, empty)],
        [batch(2, 6, 10), batch(4, 8, 11, response), batch(2, 8, 12, empty)],
        [batch(2, 8, 13, empty), batch(4, 6, 14)],
    ]


@pytest.mark.parametrize("bucket, shard_optimizer", [(None, False), (64, False), (64, True)])
def test_accumulation_on_a_world_of_one_equals_the_plain_trainer(bucket, shard_optimizer):
    """Gradient accumulation under data parallelism (local scaled backwards, the last counted
    micro-batch's overlapped reduction, a rank weight of all its counted targets) changes
    nothing over a world of one: the same losses and values as the plain trainer's
    accumulation, bit for bit, micro-batches that count nothing included."""
    steps = _accumulation_steps()
    results = []
    with ProcessGroup.single() as group:
        for parallel in (None, DataParallel(group, bucket_bytes=bucket,
                                            shard_optimizer=shard_optimizer)):
            with DecoderOnlyTransformer(TransformerConfig(40, 8, 16, 2, 1, 32, 3)) as model:
                with model.parameters() as parameters:
                    optimizer = Adam(parameters, learning_rate=3e-3, maximum_gradient_norm=0.5)
                trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=parallel)
                losses = [trainer.train_step(step).loss for step in steps]
                assert trainer.optimizer.step_count == len(steps)
                trainer.optimizer.close()
                with model.parameters() as parameters:
                    results.append((losses, parameters.flat_values().tobytes()))
    assert results[0] == results[1]


def test_accumulation_on_a_world_of_one_refuses_a_step_that_counts_nothing():
    """As without data parallelism, a step none of whose micro-batches counts a target fails
    (here in the reduction, which every rank reaches) before the optimizer steps."""
    empty = [step[0] for step in _accumulation_steps()[2:3]] * 2
    with ProcessGroup.single() as group:
        with DecoderOnlyTransformer(TransformerConfig(40, 8, 16, 2, 1, 32, 3)) as model:
            with model.parameters() as parameters, Adam(parameters) as optimizer:
                trainer = CausalLanguageModelTrainer(model, optimizer,
                                                     data_parallel=DataParallel(group))
                with pytest.raises(RiftcoTransformerError, match="no target counted"):
                    trainer.train_step(empty)
                assert optimizer.step_count == 0


# ---- riftco post-train --data-parallel ------------------------------------------------------


@pytest.fixture(scope="module")
def post_train_bases(tmp_path_factory):
    """Random-weight bases with byte tokens: a GPT bundle (for --base) of context 64 (quick;
    most tiny instruction examples are truncated to it, 34 of 38 keep targets) and a Llama
    bundle (for --model) whose context holds every example whole in its chat template."""
    from riftco_transformer import Tokenizer
    from test_decoder_families import family_bundle

    directory = tmp_path_factory.mktemp("post_train_bases")
    tokenizer = Tokenizer(bytes(range(256)), method="byte")
    config = TransformerConfig(vocabulary_size=tokenizer.vocab_size, maximum_context=64,
                               model_width=16, head_count=4, block_count=2,
                               feed_forward_width=32, random_seed=3)
    with DecoderOnlyTransformer(config) as model:
        gpt = ModelBundle.capture(model, tokenizer, "pretraining").save(directory / "gpt.rift")
    llama = family_bundle("llama", maximum_context=256).save(directory / "llama.rift")
    return {"base": gpt, "model": llama}


def _post_train_arguments(source: str, base: Path, output: Path, method: str, steps: int,
                          *extra: str) -> list[str]:
    """`riftco post-train` from a bundle (source "base") or a pretrained model ("model") with
    20% of the instructions held out and validated every 2 steps; a flag repeated in ``extra``
    overrides these (argparse keeps the last)."""
    return [sys.executable, "-m", "riftco_transformer", "post-train", f"--{source}", str(base),
            "--instructions", str(INSTRUCTIONS), "--output", str(output), "--method", method,
            "--steps", str(steps), "--batch-size", "4", "--learning-rate", "0.01",
            "--validation-fraction", "0.2", "--eval-every", "2", "--backend", "cpu",
            "--no-progress", *extra]


def _metric_records(output: Path) -> list[tuple[str, int, float]]:
    path = output.with_name(output.name + ".metrics.jsonl")
    return [(record["phase"], record["step"], record["loss"])
            for record in map(json.loads, path.read_text().splitlines())]


def _expect_same_post_training(output: Path, reference: Path, weight_tolerance=1e-6) -> None:
    """The training losses and the bundle as :func:`_expect_same_run` compares them, and the
    same validations (steps, and losses within 1e-6 relative)."""
    _expect_same_run(output, reference, weight_tolerance=weight_tolerance)
    ours, theirs = _metric_records(output), _metric_records(reference)
    assert [record[:2] for record in ours] == [record[:2] for record in theirs]
    for (phase, step, loss), (_, _, want) in zip(ours, theirs):
        assert abs(loss - want) <= 1e-6 * abs(want), (phase, step, loss, want)


@pytest.fixture(scope="module")
def post_train_references(tmp_path_factory, post_train_bases):
    """One process's run for (source, method) and extra flags, made once."""
    directory = tmp_path_factory.mktemp("post_train_single")
    made = {}

    def reference(source: str, method: str, *extra: str) -> Path:
        key = (source, method, *extra)
        if key not in made:
            output = directory / f"{'-'.join(key).replace('--', '')}.rift"
            completed = _run(_post_train_arguments(source, post_train_bases[source], output,
                                                   method, 6, *extra))
            assert completed.returncode == 0, completed.stdout + completed.stderr
            made[key] = output
        return made[key]

    return reference


@pytest.mark.parametrize("source, method, ranks, zero", [
    ("base", "full", 2, False), ("base", "lora", 2, False), ("base", "lora", 4, False),
    ("base", "qlora", 2, False), ("model", "full", 2, False), ("model", "qlora", 2, False),
    ("base", "full", 2, True), ("base", "lora", 4, True), ("model", "qlora", 2, True),
])
def test_post_train_ranks_match_one_process_on_the_same_global_batches(
        tmp_path, post_train_bases, post_train_references, source, method, ranks, zero):
    launcher = _mpirun()
    output = tmp_path / f"ranks{ranks}.rift"
    completed = _run([launcher, "-n", str(ranks), "--oversubscribe",
                      *_post_train_arguments(source, post_train_bases[source], output, method,
                                             6, "--data-parallel",
                                             *(["--zero-1"] if zero else []))])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # Rank 0 alone speaks and writes.
    assert completed.stdout.count(f"data parallel over {ranks} ranks") == 1, completed.stdout
    assert completed.stdout.count("held-out examples (validation fraction 0.2)") == 1
    assert completed.stdout.count(f"post-train: wrote {output}") == 1
    _expect_same_post_training(output, post_train_references(source, method))


def test_post_train_early_stopping_and_a_checkpoint_of_two_ranks_resumed_by_four(
        tmp_path, post_train_bases):
    """LoRA validated every step with a patience of 1 (one process stops at step 4 and keeps
    step 3's values): 2 ranks train 3 steps with checkpoints (rank 0 writes them, the best one
    too), 4 ranks resume (--auto-resume), stop at the same step and keep the best values, read
    from the best checkpoint; the metrics and bundle are those of the uninterrupted process."""
    launcher = _mpirun()
    base = post_train_bases["base"]
    stopping = ("--learning-rate", "0.15", "--eval-every", "1", "--early-stopping-patience", "1")
    reference = tmp_path / "single.rift"
    completed = _run(_post_train_arguments("base", base, reference, "lora", 16, *stopping))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "stopped early" in completed.stdout and "from step 3" in completed.stdout, \
        completed.stdout
    output = tmp_path / "ranks.rift"
    checkpoint = tmp_path / "run.riftckpt"
    resumable = (*stopping, "--data-parallel", "--checkpoint", str(checkpoint),
                 "--checkpoint-every", "2", "--auto-resume")
    completed = _run([launcher, "-n", "2", "--oversubscribe",
                      *_post_train_arguments("base", base, output, "lora", 3, *resumable)])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert checkpoint.is_file() and checkpoint.with_name("run.best.riftckpt").is_file()
    completed = _run([launcher, "-n", "4", "--oversubscribe",
                      *_post_train_arguments("base", base, output, "lora", 16, *resumable)])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.count(f"resuming from {checkpoint}") == 1, completed.stdout
    assert "stopped early" in completed.stdout and "from step 3" in completed.stdout, \
        completed.stdout
    _expect_same_post_training(output, reference)


def test_post_train_ranks_with_different_flags_all_stop_with_a_clear_error(
        tmp_path, post_train_bases):
    launcher = _mpirun()
    output = tmp_path / "mismatch.rift"
    ours = _post_train_arguments("base", post_train_bases["base"], output, "lora", 4,
                                 "--data-parallel")
    theirs = [*ours]
    theirs[theirs.index("--learning-rate") + 1] = "0.02"
    completed = _run([launcher, "-n", "1", *ours, ":", "-n", "1", *theirs], timeout=120)
    assert completed.returncode != 0
    assert completed.stderr.count("riftco post-train: error: data parallel: rank 1 runs a "
                                  "different configuration or data than rank 0") == 2, \
        completed.stderr
    assert not output.exists()
    assert not output.with_name(output.name + ".metrics.jsonl").exists()


def test_post_train_refuses_a_global_batch_that_does_not_split_over_the_ranks(
        tmp_path, post_train_bases):
    launcher = _mpirun()
    output = tmp_path / "odd.rift"
    arguments = _post_train_arguments("base", post_train_bases["base"], output, "lora", 4,
                                      "--data-parallel")
    arguments[arguments.index("--batch-size") + 1] = "3"
    completed = _run([launcher, "-n", "2", "--oversubscribe", *arguments], timeout=120)
    assert completed.returncode != 0
    assert completed.stderr.count("the global batch of 3 rows (batch_size, --batch-size) does "
                                  "not split evenly over 2 ranks; use a multiple of 2") == 2, \
        completed.stderr
    assert not output.exists()


def test_zero_1_needs_data_parallel(tmp_path, post_train_bases):
    """Up front, on both commands, before anything trains or is written."""
    output = tmp_path / "refused.rift"
    for arguments in (_pretrain_arguments(output, 2, "--zero-1"),
                      _post_train_arguments("base", post_train_bases["base"], output, "lora", 2,
                                            "--zero-1")):
        completed = _run(arguments)
        assert completed.returncode == 2, completed.stdout + completed.stderr
        assert "--zero-1 needs --data-parallel" in completed.stderr
        assert not output.exists()


@pytest.mark.parametrize("method, ranks, zero", [
    ("lora", 2, False), ("full", 2, False), ("lora", 4, False), ("full", 4, True),
])
def test_post_train_ranks_with_gradient_accumulation_match_one_process(
        tmp_path, post_train_bases, post_train_references, method, ranks, zero):
    """--gradient-accumulation 2 with --data-parallel: every rank shards both global
    micro-batches of a step, backwards them locally and reduces once. The run is one process
    accumulating the same micro-batches (as every data-parallel run is compared), and, up to
    rounding, one process with each step's two micro-batches in one batch of twice the rows.

    The losses agree within 1e-6 (measured: 1e-8 to 1e-7). Full fine-tuning's bundle differs
    by up to ~7e-6 (blocks.1.feed_forward.project.bias, 4 ranks), where Adam turns float
    noise in near-zero gradient entries into ±lr steps: one process accumulating against one
    process with the whole batch already differs by 1.6e-6 there, and 2 ranks against one
    process on global batches of 8 rows without accumulation by 3e-6. LoRA's differs by 1e-7."""
    launcher = _mpirun()
    base = post_train_bases["base"]
    accumulation = ("--gradient-accumulation", "2")
    output = tmp_path / f"ranks{ranks}.rift"
    completed = _run([launcher, "-n", str(ranks), "--oversubscribe",
                      *_post_train_arguments("base", base, output, method, 6, "--data-parallel",
                                             *accumulation, *(["--zero-1"] if zero else []))])
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.count(f"data parallel over {ranks} ranks") == 1, completed.stdout
    assert completed.stdout.count(f"post-train: wrote {output}") == 1
    weights = 1e-6 if method == "lora" else 3e-5
    _expect_same_post_training(output, post_train_references("base", method, *accumulation),
                               weight_tolerance=weights)
    doubled = post_train_references("base", method, "--batch-size", "8")
    assert _train_losses(doubled) != _train_losses(post_train_references("base", method))
    _expect_same_run(output, doubled, loss_tolerance=1e-5, weight_tolerance=max(weights, 1e-5))


ACCUMULATION_SCRIPT = textwrap.dedent("""
    import json, sys
    from array import array
    from riftco_transformer import Adam, DecoderOnlyTransformer, TransformerConfig
    from riftco_transformer.batching import TrainingBatch
    from riftco_transformer.distributed import DataParallel, ProcessGroup
    from riftco_transformer.training import CausalLanguageModelTrainer

    output, zero = sys.argv[1], sys.argv[2] == "zero"
    MASKS = {  # row r of n: 1 where the target counts
        "all": None,
        "response": lambda r, n: bytes([0] * (1 + r % 3) + [1] * (7 - r % 3)),
        "front": lambda r, n: bytes([int(r < n // 2)] * 8),  # the low ranks' rows
        "back": lambda r, n: bytes([int(r >= n // 2)] * 8),  # the high ranks' rows
        "first": lambda r, n: bytes([0, 0, 0, 1, 1, 1, 0, 0]) if r == 0 else bytes(8),
        "none": lambda r, n: bytes(8),
    }
    STEPS = [  # (rows, mask) per micro-batch: the last counted one differs between ranks, and
        # some ranks count nothing in a step (front and first with 2 ranks: rank 1; with 4
        # ranks the higher ones), or in its first or last micro-batch
        [(4, "all"), (8, "response"), (4, "response")],
        [(4, "front"), (8, "back")],
        [(8, "front"), (4, "first"), (4, "front")],
        [(4, "none"), (4, "response"), (4, "back")],
        [(4, "back"), (8, "none")],
        [(8, "first")],
        [(4, "response"), (4, "all")],
    ]

    def batch(rows, mask, seed):
        ids = [[(seed * 11 + 5 * r + 3 * t + t * t) % 40 for t in range(9)] for r in range(rows)]
        rule = MASKS[mask]
        return TrainingBatch(tuple(array("I", row[:-1]) for row in ids),
                             tuple(array("I", row[1:]) for row in ids),
                             None if rule is None else tuple(rule(r, rows) for r in range(rows)))

    def train(parallel):
        model = DecoderOnlyTransformer(TransformerConfig(40, 8, 16, 2, 1, 32, 3))
        parameters = model.parameters()
        initial = parameters.flat_values()
        # Each update is lr·m/(sqrt(v) + eps): with eps = 1 it stays close to linear in the
        # gradients, so the values compare the reduced gradients instead of Adam's sign of
        # float noise where a gradient is near zero.
        optimizer = Adam(parameters, learning_rate=0.3, epsilon=1.0,
                         maximum_gradient_norm=float("inf"))
        trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=parallel)
        metrics = [trainer.train_step([batch(rows, mask, 10 * step + index)
                                       for index, (rows, mask) in enumerate(micro)])
                   for step, micro in enumerate(STEPS)]
        values, offset, moved = parameters.flat_values(), 0, {}
        for name, shape in zip(parameters.names, parameters.shapes):
            count = 1
            for size in shape:
                count *= size
            moved[name] = [values[i] - initial[i] for i in range(offset, offset + count)]
            offset += count
        identical = parallel is None or parallel.replicas_identical(parameters)
        return {"losses": [metric.loss for metric in metrics],
                "norms": [metric.gradient_norm for metric in metrics], "moved": moved,
                "identical": identical, "steps": trainer.optimizer.step_count}

    parallel = DataParallel(ProcessGroup(), bucket_bytes=256, shard_optimizer=zero)
    ranks = train(parallel)
    if parallel.rank == 0:  # one process accumulating the same micro-batches
        with open(output, "w") as stream:
            json.dump({"ranks": ranks, "single": train(None)}, stream)
""")


@pytest.mark.parametrize("ranks, zero", [(2, False), (4, False), (2, True)])
def test_trainer_accumulation_over_ranks_whose_shards_count_nothing_matches_one_process(
        tmp_path, ranks, zero):
    """CausalLanguageModelTrainer.train_step with micro-batches under data parallelism, where
    a rank's last counted shard is its first, a rank counts nothing in a whole step, and the
    ranks' last counted shards are in different micro-batches: every rank makes the same
    collectives, the replicas stay identical, and the losses and values are one process's
    accumulation on the same micro-batches."""
    launcher = _mpirun()
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATION_SCRIPT)
    output = tmp_path / "result.json"
    completed = _run([launcher, "-n", str(ranks), "--oversubscribe", sys.executable, str(script),
                      str(output), "zero" if zero else "plain"], timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(output.read_text())
    ours, theirs = result["ranks"], result["single"]
    assert ours["identical"] and ours["steps"] == theirs["steps"] == 7
    for key in ("losses", "norms"):  # the global gradient's norm: the reduction's result
        for value, want in zip(ours[key], theirs[key], strict=True):
            assert abs(value - want) <= 1e-6 * abs(want), (key, ours[key], theirs[key])
    assert list(ours["moved"]) == list(theirs["moved"])
    for name, moved in ours["moved"].items():
        if name.endswith("attention.key.bias"):
            continue  # zero true gradient: its update is float noise (see _expect_same_run)
        # 1e-5: a norm's scale near 1 holds its movement of ~1e-2 to a few 1e-6 (float32).
        assert _norm_relative(moved, theirs["moved"][name]) <= 1e-5, name


def test_post_train_with_gradient_accumulation_on_a_world_of_one_equals_the_plain_run(
        post_train_bases):
    """Everywhere (no MPI needed): post_train and fine_tune_pretrained accumulate under data
    parallelism (a world of one gives the plain run, bit for bit); what is not a DataParallel
    is still refused."""
    from riftco_transformer import load_pretrained
    from riftco_transformer.instructions import read_instructions_jsonl, split_examples
    from riftco_transformer.post_training import (
        PostTrainingConfig,
        fine_tune_pretrained,
        post_train,
    )

    base = ModelBundle.load(post_train_bases["base"])
    splits = split_examples(read_instructions_jsonl(INSTRUCTIONS), 0.2, seed=29)
    results = []
    with ProcessGroup.single() as group:
        for method in ("lora", "full"):
            config = PostTrainingConfig(steps=3, batch_size=4, backend="cpu",
                                        fine_tuning_method=method, learning_rate=0.05,
                                        evaluation_interval=2, gradient_accumulation_steps=2)
            for parallel in (None, DataParallel(group)):
                result = post_train(base, splits.train, config,
                                    validation_examples=splits.validation,
                                    data_parallel=parallel)
                results.append(([(m.phase, m.step, m.loss) for m in result.metrics],
                                result.bundle.weights))
            with pytest.raises(TypeError, match="data_parallel must be a DataParallel"):
                post_train(base, splits.train, config, data_parallel=group)
        config = PostTrainingConfig(steps=3, batch_size=2, backend="cpu",
                                    fine_tuning_method="qlora", learning_rate=0.05,
                                    gradient_accumulation_steps=3)
        for parallel in (None, DataParallel(group)):
            with load_pretrained(post_train_bases["model"]) as loaded:
                result = fine_tune_pretrained(loaded, splits.train[:12], config,
                                              data_parallel=parallel)
                with loaded.model.parameters() as parameters:
                    results.append(([(m.phase, m.step, m.loss) for m in result.metrics],
                                    parameters.flat_values().tobytes()))
    assert results[0] == results[1] and results[2] == results[3] and results[4] == results[5]
    assert results[0] != results[2]


def test_post_train_on_a_world_of_one_equals_the_plain_run(tmp_path, post_train_bases):
    """Everywhere (no MPI needed): the data-parallel path of post_train with a world of one,
    early stopping and checkpoints included, is the plain run bit for bit."""
    from riftco_transformer.instructions import read_instructions_jsonl, split_examples
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    base = ModelBundle.load(post_train_bases["base"])
    splits = split_examples(read_instructions_jsonl(INSTRUCTIONS), 0.2, seed=29)
    config = PostTrainingConfig(steps=6, batch_size=4, backend="cpu", fine_tuning_method="lora",
                                learning_rate=0.15, evaluation_interval=1,
                                early_stopping_patience=2)
    results = []
    with ProcessGroup.single() as group:
        for name, parallel in (("plain", None), ("world_of_one", DataParallel(group))):
            result = post_train(base, splits.train, config, validation_examples=splits.validation,
                                checkpoint_path=tmp_path / f"{name}.riftckpt",
                                checkpoint_interval=2, data_parallel=parallel)
            results.append(([(m.phase, m.step, m.loss) for m in result.metrics],
                            result.bundle.weights, result.best_step))
            assert (tmp_path / f"{name}.best.riftckpt").is_file()
    assert results[0] == results[1]


def test_ranks_whose_validation_losses_differ_stop_instead_of_deciding_differently():
    """Early stopping under data parallelism compares each validation loss across the ranks
    (here a stand-in group whose other rank's loss differs in the last bit)."""
    import types

    from riftco_transformer.post_training import _agreeing_validation
    from riftco_transformer.training import TrainingMetric

    published = []
    group = types.SimpleNamespace(allgather=lambda value: [value, value ^ 1])
    sink = _agreeing_validation(types.SimpleNamespace(group=group), published.append)
    sink(TrainingMetric("train", 2, 2.5, math.exp(2.5)))  # (already reduced over the ranks)
    with pytest.raises(ValueError, match="validation losses at step 2 differ"):
        sink(TrainingMetric("validation", 2, 2.5, math.exp(2.5)))
    assert [metric.phase for metric in published] == ["train"]


# ---- riftco launch ----------------------------------------------------------------------------


def test_launch_reads_why_an_attempt_failed_from_mpiruns_report():
    from riftco_transformer.launch import failure_reason

    killed = ("mpirun noticed that process rank 1 with PID 4242 on node host exited on signal "
              "9 (Killed).")
    assert failure_reason(137, killed) == \
        "rank 1 (PID 4242 on host) was killed by SIGKILL (signal 9)"
    nonzero = ("mpirun detected that one or more processes exited with non-zero status, thus "
               "causing\nthe job to be terminated. The first process to do so was:\n\n"
               "  Process name: [[5123,1],0]\n  Exit code:    3\n")
    assert failure_reason(3, nonzero) == "rank 0 exited with status 3"
    assert failure_reason(2, "something else") == "mpirun exited with status 2"


def test_launch_argument_rules():
    from riftco_transformer.launch import launch

    for keywords, error in (({"ranks": 0}, ValueError), ({"ranks": True}, TypeError),
                            ({"ranks": 2, "max_restarts": -1}, ValueError)):
        with pytest.raises(error):
            launch(["true"], **keywords)
    with pytest.raises(ValueError, match="nonempty"):
        launch([], 2)
    completed = subprocess.run([sys.executable, "-m", "riftco_transformer", "launch", "-n", "2"],
                               capture_output=True, text=True, env=_environment())
    assert completed.returncode == 2 and "give the command to run after --" in completed.stderr


def _find_rank(rank: int, marker: str, deadline: float) -> int:
    """The PID of the rank `rank` whose command line holds `marker` (Open MPI gives each rank
    OMPI_COMM_WORLD_RANK)."""
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in command and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"no rank {rank} running {marker}")


def _launch_arguments(output: Path, checkpoint: Path, restarts: int) -> list[str]:
    return [sys.executable, "-m", "riftco_transformer", "launch", "-n", "2",
            "--max-restarts", str(restarts), "--mpirun-arg=--oversubscribe", "--",
            *_pretrain_arguments(output, 12, "--data-parallel", "--checkpoint", str(checkpoint),
                                 "--checkpoint-every", "2", "--auto-resume",
                                 "--collective-timeout", "20")]


def test_launch_restarts_every_rank_after_a_sigkill_and_ends_with_the_uninterrupted_artifact(
        tmp_path):
    """The torchrun behaviour over Open MPI: SIGKILL one rank mid-run; mpirun ends the other,
    the launcher says why in one line, restarts both ranks, which resume from the last
    checkpoint (--auto-resume), and the run ends with the bundle of an uninterrupted run."""
    import signal

    _mpirun()
    whole = tmp_path / "whole.rift"
    completed = _run(_launch_arguments(whole, tmp_path / "whole.riftckpt", 0))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    output = tmp_path / "killed.rift"
    metrics = output.with_name(output.name + ".metrics.jsonl")
    checkpoint = tmp_path / "killed.riftckpt"
    process = subprocess.Popen(_launch_arguments(output, checkpoint, 2), env=_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (checkpoint.is_file() and metrics.is_file()
               and len(metrics.read_text().splitlines()) >= 5):
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint yet"
        time.sleep(0.01)
    os.kill(_find_rank(1, str(output), deadline), signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stdout + stderr
    assert "riftco launch: attempt 1 failed: rank 1" in stderr and "SIGKILL" in stderr, stderr
    assert "restarting all 2 ranks (restart 1 of 2)" in stderr
    assert f"resuming from {checkpoint}" in stdout
    assert ModelBundle.load(output).weights == ModelBundle.load(whole).weights


def test_launch_without_restarts_ends_every_rank_within_seconds_naming_the_dead_one(tmp_path):
    import signal

    _mpirun()
    output = tmp_path / "killed.rift"
    checkpoint = tmp_path / "killed.riftckpt"
    metrics = output.with_name(output.name + ".metrics.jsonl")
    process = subprocess.Popen(_launch_arguments(output, checkpoint, 0), env=_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert process.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.01)
    os.kill(_find_rank(0, str(output), deadline), signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = process.communicate(timeout=120)
    assert time.monotonic() - killed < 30
    assert process.returncode != 0
    assert "riftco launch: attempt 1 failed: rank 0" in stderr and "SIGKILL" in stderr, stderr
    assert "no restarts allowed (--max-restarts 0)" in stderr
    assert not output.exists()
