"""The post-training stage: a base bundle plus instruction data in, a child bundle out.

``post_train(base, examples, config)`` instantiates a live copy of the base (the input
bundle is never changed), formats every example with the plain chat format (the one serving
renders), and fine-tunes with Adam:

- ``"full"``: every base parameter trains;
- ``"lora"``: low-rank adapters on ``config.lora.targets``; only they train, then they are
  merged into the weights;
- ``"qlora"``: the projection weights are first packed to NF4 (``nf4_block_size``,
  ``double_quantization``, ``nf4_scale_block_size``), then LoRA as above; the merge
  dequantizes, so the child bundle is dense float32.

Data: every example is tokenized whole and is one row of a batch; a batch pads its rows to
its longest one with an ignore mask (:mod:`.example_batching`). With ``packing``, a row holds
as many examples as fit, each at its own positions and attending only to itself. An
example longer than the context (``context_size``, by default the model's maximum context) is
truncated or dropped (``overlong``), and the counts are reported; no example ever has to be
longer than the context.

The objective is ``response_only_causal_sft`` by default (``response_only_loss=True``: only the
assistant's tokens, its content and what ends its turn, are targets) or
``full_sequence_causal_sft`` (every token of the formatted text). The optimizer is Adam
(AdamW with ``weight_decay``) at a rate that follows ``lr_schedule`` (``"constant"``, or a
``warmup_steps`` linear warmup then a ``"cosine"`` or ``"linear"`` decay to
``minimum_learning_rate_fraction`` of the rate at the last step); a step may accumulate the
gradients of ``gradient_accumulation_steps`` batches.

With ``validation_examples``:
- the base and the tuned model are scored on them whole with the exhaustive evaluator
  (:mod:`.evaluation`), before and after, and the figures go into the result and the child's
  metadata;
- the validation loss (and perplexity) is published every ``evaluation_interval`` steps;
- with ``early_stopping_patience`` p, p validations in a row without a new best end the run,
  and the trainable values of the best validation are kept: the result is the best model,
  not the last (and ``<checkpoint>.best.riftckpt`` holds it when checkpointing).

With ``generation_checks`` (:mod:`.generation_checks`: held-out prompts, each with an exact
response or a regular expression to match), the model answers every prompt greedily in its chat
template (as ``riftco chat`` prompts it, KV-cached) before training (the base, step 0), at every
evaluation (each ``evaluation_interval`` steps and the last step) and at the end (the tuned
model, the best one under early stopping); each round is published to ``metric_sink`` as a
:class:`~.generation_checks.GenerationCheckMetric` (phase ``"generation"``: passed/total and
each check's outcome), and the result holds ``base_generation`` and ``tuned_generation``.
Nothing else depends on them: early stopping stays on the validation loss.

The child records its parent's ``artifact_id``. For LoRA and QLoRA the result also holds
``adapter``, the adapter alone as it was before the merge (a
:class:`~.interchange.peft.LoraAdapter` naming the base bundle by ``artifact_id`` and weights
SHA-256; ``fine_tune_pretrained`` names it by ``base_id``): ``result.adapter.save(directory)``
writes it as a PEFT adapter directory, the adapter-only save.

Data parallelism (``data_parallel=`` a :class:`~.distributed.DataParallel`, every rank of an
``mpirun`` calling with the same arguments): every rank trains on its shard of each global batch
of ``batch_size`` rows (a multiple of the world size) and the gradients are averaged, so the
run equals one process on the same global batches. Before anything trains, every rank checks
that the others run the same config on the same data, base and checkpoint (ValueError on every
rank otherwise). With ``gradient_accumulation_steps`` k a step accumulates k global batches,
each sharded over the ranks, and averages the gradients once: it equals one process
accumulating the same batches. Rank 0 writes the checkpoints while the others wait for them;
every rank resumes from the same file. Every rank scores the whole validation set on identical
replicas, and with early stopping the ranks also compare each validation loss, so they stop at
the same step and keep the same best values. Every rank runs the generation checks (the
same answers on identical replicas, no collective); only the sinks rank 0 is given write them.
Signals are left alone (as in pretraining):
SIGINT or SIGTERM ends the ranks, and the last periodic checkpoint resumes the run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .artifacts import ModelBundle
from .evaluation import CausalEvaluation, encode_examples, evaluate_sequences
from .example_batching import OVERLONG_POLICIES, ExampleBatchSource, example_batches
from .generation_checks import (
    GenerationCheckMetric,
    require_generation_checks,
    run_generation_checks,
)
from .instructions import PlainChatFormatter, read_instructions_jsonl
from .interchange.peft import LoraAdapter, capture_lora_adapter
from .native import Adam, AdamOptions, LoraConfig
from .native._validation import require_int, require_positive_float
from .pretraining import (
    _one_of,
    _positive,
    _require_same_run_on_every_rank,
    require_backend_name,
    resolve_backend,
)
from .training import (
    CausalLanguageModelTrainer,
    DeferredInterrupt,
    TrainingInterrupted,
    TrainingLoopConfig,
    TrainingMetric,
)

FINE_TUNING_METHODS = ("full", "lora", "qlora")
LEARNING_RATE_SCHEDULES = ("constant", "cosine", "linear")


# The defaults scaled to the data (riftco post-train without --steps / --learning-rate /
# --warmup-steps; README, "Post-training defaults"). Epochs as TRL's SFTConfig counts them; a
# floor so a handful of examples still trains, a cap so a large file does not silently run for
# hours (give --steps or --epochs for more).
DEFAULT_EPOCHS = 3
DEFAULT_MINIMUM_STEPS = 10
DEFAULT_MAXIMUM_STEPS = 1000
# Peak rates by method. Full fine-tuning moves every weight: TRL's SFT default. LoRA and QLoRA
# train only the adapters, whose update reaches the weights scaled by alpha/rank (2 with the
# defaults rank 4, alpha 8, where PEFT's r = 8, alpha = 8 gives 1): 1e-4 here is PEFT's usual
# 2e-4 at scale 1. Measured on SmolLM2-135M-Instruct (README, "Post-training defaults").
DEFAULT_LEARNING_RATES = {"full": 2e-5, "lora": 1e-4, "qlora": 1e-4}
# Warmup, with a cosine or linear schedule: this fraction of the steps (rounded up).
DEFAULT_WARMUP_FRACTION = 0.05


@dataclass(frozen=True)
class ScaledDefaults:
    """The steps, peak learning rate and warmup of a post-training run, each given or derived
    from the method and the data (:func:`scaled_defaults`), with why."""

    steps: int
    learning_rate: float
    warmup_steps: int
    epochs: float | None
    reasons: tuple[str, str, str]

    def describe(self) -> str:
        """One line: the values and where each came from."""
        steps, rate, warmup = self.reasons
        return (f"{self.steps} steps ({steps}), learning rate {self.learning_rate:g} ({rate}), "
                f"warmup {self.warmup_steps} steps ({warmup})")


def scaled_defaults(method: str, example_count: int, batch_size: int,
                    gradient_accumulation_steps: int = 1, *, steps: int | None = None,
                    epochs: float | None = None, learning_rate: float | None = None,
                    lr_schedule: str = "constant",
                    warmup_steps: int | None = None) -> ScaledDefaults:
    """The steps, learning rate and warmup of a run on ``example_count`` training examples;
    each value given wins over its default.

    - steps: ``steps``, else ceil(epochs * examples / (batch_size * accumulation)) with
      ``epochs`` (default :data:`DEFAULT_EPOCHS`), clamped to
      [:data:`DEFAULT_MINIMUM_STEPS`, :data:`DEFAULT_MAXIMUM_STEPS`] when ``epochs`` was not
      given (an explicit ``epochs`` is honoured exactly);
    - learning rate: ``learning_rate``, else :data:`DEFAULT_LEARNING_RATES` of the method;
    - warmup: ``warmup_steps``, else 0 with a constant rate and ceil(5% of the steps) (below
      the steps) with a cosine or linear schedule.

    ``steps`` and ``epochs`` together are a ValueError. With packing a row holds several
    examples, so the epochs are counted in examples, not rows (more passes over the data).
    """
    _one_of(method, "method", FINE_TUNING_METHODS)
    _one_of(lr_schedule, "lr_schedule", LEARNING_RATE_SCHEDULES)
    require_int(example_count, "example_count", 0, 1 << 63)
    _positive(batch_size, "batch_size")
    _positive(gradient_accumulation_steps, "gradient_accumulation_steps")
    if steps is not None and epochs is not None:
        raise ValueError("give steps or epochs, not both")
    per_step = batch_size * gradient_accumulation_steps
    if steps is not None:
        _positive(steps, "steps")
        chosen_steps, steps_reason = steps, "given"
    else:
        explicit = epochs is not None
        epochs = DEFAULT_EPOCHS if epochs is None else epochs
        if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or \
                not math.isfinite(epochs) or epochs <= 0:
            raise ValueError(f"epochs must be a finite number > 0, got {epochs!r}")
        exact = max(1, math.ceil(epochs * example_count / per_step - 1e-9))
        steps_reason = (f"{epochs:g} epochs of {example_count} examples at {batch_size} rows x "
                        f"{gradient_accumulation_steps} accumulation per step")
        if explicit:
            chosen_steps = exact
        else:
            chosen_steps = min(max(exact, DEFAULT_MINIMUM_STEPS), DEFAULT_MAXIMUM_STEPS)
            if chosen_steps > exact:
                steps_reason += f" = {exact}, raised to the floor {chosen_steps}"
            elif chosen_steps < exact:
                steps_reason += f" = {exact}, held to the cap {chosen_steps}"
    if learning_rate is not None:
        require_positive_float(learning_rate, "learning_rate")
        rate, rate_reason = learning_rate, "given"
    else:
        rate = DEFAULT_LEARNING_RATES[method]
        rate_reason = f"the {method} default"
    if warmup_steps is not None:
        require_int(warmup_steps, "warmup_steps", 0, 1 << 63)
        warmup, warmup_reason = warmup_steps, "given"
    elif lr_schedule == "constant":
        warmup, warmup_reason = 0, "a constant rate has none"
    else:
        warmup = min(math.ceil(DEFAULT_WARMUP_FRACTION * chosen_steps), chosen_steps - 1)
        warmup_reason = f"{DEFAULT_WARMUP_FRACTION:.0%} of the steps, then {lr_schedule} decay"
    return ScaledDefaults(chosen_steps, rate, warmup, None if steps is not None else epochs,
                          (steps_reason, rate_reason, warmup_reason))


def _power_of_two(value, name: str) -> int:
    require_int(value, name, 32, 4097)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two in 32..4096, got {value}")
    return value


@dataclass(frozen=True)
class PostTrainingConfig:
    """Every knob of the post-training stage, validated at construction
    (docs/ARCHITECTURE.md, 'Training workflows')."""

    steps: int = 20
    context_size: int | None = None
    batch_size: int = 2
    evaluation_interval: int = 10
    loss_average_window: int = 10
    learning_rate: float = 1e-3
    random_seed: int = 29
    backend: str = "auto"
    fine_tuning_method: str = "full"
    overlong: str = "truncate"
    packing: bool = False
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    attention: str = "materialized"
    activation_checkpointing: str = "disabled"
    nf4_block_size: int = 64
    nf4_scale_block_size: int = 256
    double_quantization: bool = True
    optimizer_state: str = "auto"
    optimizer_page_size: int = 4096
    response_only_loss: bool = True
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    minimum_learning_rate_fraction: float = 0.0
    weight_decay: float = 0.0
    gradient_accumulation_steps: int = 1
    early_stopping_patience: int | None = None
    early_stopping_min_delta: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "evaluation_interval",
                     "loss_average_window", "optimizer_page_size", "gradient_accumulation_steps"):
            _positive(getattr(self, name), name)
        if self.context_size is not None:
            _positive(self.context_size, "context_size")
        if self.early_stopping_patience is not None:
            _positive(self.early_stopping_patience, "early_stopping_patience")
        _one_of(self.overlong, "overlong", OVERLONG_POLICIES)
        _one_of(self.lr_schedule, "lr_schedule", LEARNING_RATE_SCHEDULES)
        require_int(self.warmup_steps, "warmup_steps", 0, 1 << 63)
        if self.lr_schedule == "constant" and self.warmup_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) needs lr_schedule 'cosine' or "
                             "'linear'")
        if self.lr_schedule != "constant" and self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps "
                             f"({self.steps})")
        for name in ("minimum_learning_rate_fraction", "weight_decay",
                     "early_stopping_min_delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.minimum_learning_rate_fraction > 1:
            raise ValueError("minimum_learning_rate_fraction must lie in [0, 1], got "
                             f"{self.minimum_learning_rate_fraction!r}")
        require_int(self.random_seed, "random_seed", 0, 1 << 63)
        require_positive_float(self.learning_rate, "learning_rate")
        require_backend_name(self.backend)
        _one_of(self.fine_tuning_method, "fine_tuning_method", FINE_TUNING_METHODS)
        if not isinstance(self.lora, LoraConfig):
            raise TypeError(f"lora must be a LoraConfig, not {type(self.lora).__name__}")
        _one_of(self.attention, "attention", ("materialized", "flash"))
        _one_of(self.activation_checkpointing, "activation_checkpointing", ("disabled", "block"))
        _power_of_two(self.nf4_block_size, "nf4_block_size")
        _power_of_two(self.nf4_scale_block_size, "nf4_scale_block_size")
        for name in ("double_quantization", "response_only_loss", "packing"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool")
        _one_of(self.optimizer_state, "optimizer_state", ("auto", "contiguous", "paged"))

    @property
    def resolved_optimizer_state(self) -> str:
        if self.optimizer_state != "auto":
            return self.optimizer_state
        return "paged" if self.fine_tuning_method == "qlora" else "contiguous"

    @property
    def objective(self) -> str:
        return "response_only_causal_sft" if self.response_only_loss else "full_sequence_causal_sft"

    def adam_options(self) -> AdamOptions:
        """The optimizer this configuration trains with (schedule and decay included)."""
        schedule = {}
        if self.lr_schedule != "constant":
            schedule = {"schedule": self.lr_schedule, "warmup_steps": self.warmup_steps,
                        "total_steps": self.steps,
                        "minimum_fraction": float(self.minimum_learning_rate_fraction)}
        return AdamOptions(learning_rate=self.learning_rate,
                           state_storage=self.resolved_optimizer_state,
                           page_size=self.optimizer_page_size,
                           weight_decay=float(self.weight_decay), **schedule)


@dataclass(frozen=True)
class PostTrainingResult:
    bundle: ModelBundle
    metrics: tuple[TrainingMetric, ...]
    example_count: int
    objective: str
    fine_tuning_method: str
    base_validation: CausalEvaluation | None = None
    tuned_validation: CausalEvaluation | None = None
    data: dict | None = None
    best_step: int | None = None
    stopped_early: bool = False
    base_generation: GenerationCheckMetric | None = None
    tuned_generation: GenerationCheckMetric | None = None
    generation_metrics: tuple[GenerationCheckMetric, ...] = ()
    adapter: LoraAdapter | None = None


def _example_source(sequences, masks, config: PostTrainingConfig,
                    context: int) -> ExampleBatchSource:
    return ExampleBatchSource(sequences, config.batch_size, context, config.random_seed, masks,
                              config.overlong, packing=config.packing)


def _data_report(source: ExampleBatchSource) -> dict:
    """What the data handling did, for results, metadata and the CLI."""
    return {"example_count": source.example_count, "used_example_count": source.sequence_count,
            "truncated_count": source.truncated_count, "dropped_count": source.dropped_count,
            "unusable_count": source.unusable_count, "context_size": source.context_size,
            "overlong": source.overlong, "packing": source.packing,
            "target_token_count": source.target_token_count}


def _require_packing_backend(config: PostTrainingConfig, backend: str) -> None:
    """Packed rows with flash attention need a flash kernel that bounds keys by document (the
    CPU's and PJRT's); materialized attention composes generic operations everywhere."""
    if config.packing and config.attention == "flash" and backend not in ("cpu", "tpu", "pjrt"):
        raise ValueError(f"packing with flash attention needs document bounds in the flash "
                         f"kernel, which the {backend} backend does not have yet; use "
                         f"attention='materialized' there, or train unpacked")


def _loaded_checkpoint(resume_from, config: PostTrainingConfig, identity_key: str,
                       identity, identity_text: str):
    """The checkpoint ``resume_from`` is or names, when it was taken by a run of this base
    (its metadata's ``identity_key`` is ``identity``), with this method and these optimizer
    options; ValueError naming the difference otherwise, before anything changes."""
    from .checkpoints import TrainingCheckpoint

    checkpoint = (resume_from if isinstance(resume_from, TrainingCheckpoint)
                  else TrainingCheckpoint.load(resume_from))
    if checkpoint.metadata.get(identity_key) != identity:
        raise ValueError(f"the checkpoint was not taken while {identity_text}")
    model = checkpoint.manifest["model"]
    method = ("full" if model["lora"] is None else "qlora" if model["quantized"] else "lora")
    if method != config.fine_tuning_method:
        raise ValueError(f"the checkpoint is of a {method} run; this run is "
                         f"{config.fine_tuning_method} (--method {method} resumes it)")
    # The optimizer is re-created from, or checked against, the checkpoint's options: they must
    # be this run's.
    checkpoint.check_adam_options(config.adam_options())
    return checkpoint


def best_checkpoint_path(checkpoint_path) -> Path:
    """Where early stopping keeps the best validation's checkpoint: ``x.riftckpt`` ->
    ``x.best.riftckpt``."""
    path = Path(checkpoint_path)
    return path.with_name(f"{path.stem}.best{path.suffix}")


def _check_data_parallel(data_parallel) -> None:
    """What data parallelism rules out, before anything loads: a ``data_parallel`` that is not
    a DataParallel (TypeError)."""
    if data_parallel is None:
        return
    from .distributed import DataParallel

    if not isinstance(data_parallel, DataParallel):
        raise TypeError(f"data_parallel must be a DataParallel, not "
                        f"{type(data_parallel).__name__}")


def _require_same_run(data_parallel, config: PostTrainingConfig, base_identity, checkpoint,
                      checkpoint_path, checkpoint_interval, backend: str, training,
                      validation) -> None:
    """Under data parallelism: every rank must post-train the same base with the same config,
    encoded examples (``training`` and ``validation``: (sequences, masks) or None), checkpoint
    to resume and checkpoint schedule (a rank-0 write every rank waits for), on the same
    backend; and the global batch must split evenly over the ranks. ValueError on every rank
    otherwise, before the first step."""
    if data_parallel is None:
        return
    data = []
    for split in (training, validation):
        if split is not None:
            data.extend(split[0])
            data.extend(split[1] or ())
    facts = {
        "base": base_identity,
        "backend": backend,
        "examples": [None if split is None else [len(split[0]), split[1] is not None]
                     for split in (training, validation)],
        "resume": None if checkpoint is None else checkpoint.checkpoint_id,
        # Whether and when rank 0 writes checkpoints (each write is a barrier).
        "checkpoints": [checkpoint_path is not None,
                        checkpoint_interval if checkpoint_path is not None else None],
    }
    _require_same_run_on_every_rank(data_parallel, config, *data, facts=facts)


def _trainable_with_optimizer(model, config: PostTrainingConfig) -> Adam:
    """Attach LoRA for the adapter methods, then Adam over what trains."""
    if config.fine_tuning_method in ("lora", "qlora"):
        model.attach_lora(config.lora)
        trainable = model.adapter_parameters()
    else:
        trainable = model.parameters()
    with trainable:
        return Adam(trainable, config.adam_options())


@dataclass
class _RunOutcome:
    metrics: tuple
    best_step: int | None
    best_values: object
    stopped_early: bool
    generation_metrics: tuple = ()


@dataclass
class _GenerationRounds:
    """The generation checks of a run and how to prompt the model (its chat template, end
    token); ``before`` is the base's round, published as the run's first one."""

    checks: tuple
    tokenizer: object
    template: object
    end_token_id: int | None = None
    before: GenerationCheckMetric | None = None

    def run(self, model, step: int) -> GenerationCheckMetric:
        return run_generation_checks(model, self.tokenizer, self.template, self.checks, step,
                                     self.end_token_id)


def _generation_rounds(checks, template, tokenizer, end_token_id=None):
    """The run's :class:`_GenerationRounds`, or None without checks; TypeError for checks
    that are not GenerationCheck values or a template that cannot prompt the model."""
    checks = require_generation_checks(checks)
    if not checks:
        return None
    if template is None or not callable(getattr(template, "render", None)):
        raise TypeError("generation checks need the formatter's chat template (a formatter "
                        "with .template, as PlainChatFormatter and ChatTemplateFormatter have)")
    return _GenerationRounds(checks, tokenizer, template, end_token_id)


def _tuned_generation(rounds, model, outcome: _RunOutcome, final_step: int, method: str):
    """The checks on the tuned model: the last round again when it was of exactly this model
    (full training, last step kept), else a new round."""
    if rounds is None:
        return None
    kept = outcome.best_step if outcome.best_values is not None else final_step
    last = outcome.generation_metrics[-1] if outcome.generation_metrics else None
    if method == "full" and last is not None and last.step == final_step == kept:
        return last
    return rounds.run(model, kept)


def _trainable(model):
    return model.adapter_parameters() if model.lora_attached else model.parameters()


def _train_to_the_end(trainer: CausalLanguageModelTrainer, source, config: PostTrainingConfig,
                      tokenizer, metric_sink, on_step, checkpoint_path, checkpoint_interval,
                      nf4: dict | None, metadata: dict, validation_batches=(),
                      resumed: bool = False, generation: _GenerationRounds | None = None
                      ) -> _RunOutcome:
    """Runs the steps left to ``config.steps`` (all of them, or what a restored checkpoint
    left), writing an exact-resume checkpoint to ``checkpoint_path`` every
    ``checkpoint_interval`` steps and at the end. Under early stopping it keeps the trainable
    values of the best validation (and its checkpoint); returns what happened. Under the
    trainer's data parallelism rank 0 writes the checkpoints while the others wait, and the
    ranks compare every validation loss that early stopping decides on. ``generation`` runs
    the generation checks at every evaluation step and the last step (its ``before`` round
    published first, after the first validation, when not resumed)."""
    model, optimizer = trainer.model, trainer.optimizer
    remaining = config.steps - optimizer.step_count
    if remaining < 0:
        raise ValueError(f"the checkpoint is at step {optimizer.step_count}, past steps = "
                         f"{config.steps}")
    keep_best = bool(validation_batches) and config.early_stopping_patience is not None
    best_values = None
    data_parallel = trainer.data_parallel

    def save_checkpoint(path) -> None:
        from .checkpoints import save_training_checkpoint

        # Under data parallelism rank 0 writes (the replicas and the global batch position are
        # the same everywhere) while the others wait for the file to be complete.
        def write() -> None:
            save_training_checkpoint(path, model, optimizer, tokenizer, source, trainer,
                                     nf4=nf4, metadata=metadata)
        if data_parallel is None:
            write()
        else:
            data_parallel.write_on_rank_zero(write, optimizer)

    if keep_best and data_parallel is not None:
        # Early stopping decides on the validation loss, and a new best writes a checkpoint
        # (a barrier): every rank must see the same value. Identical replicas scoring the same
        # batches give it; a rank whose kernels differ (another backend or build) is an error
        # on every rank here, instead of ranks that stop at different steps.
        metric_sink = _agreeing_validation(data_parallel, metric_sink)

    generation_metrics: list[GenerationCheckMetric] = []

    def publish_generation(record: GenerationCheckMetric) -> None:
        generation_metrics.append(record)
        if metric_sink is not None:
            metric_sink(record)

    run_sink = metric_sink
    if generation is not None and not resumed and generation.before is not None and remaining:
        if validation_batches:  # the base's round right after the first validation
            pending = [generation.before]

            def run_sink(metric) -> None:
                if metric_sink is not None:
                    metric_sink(metric)
                if pending and metric.phase == "validation":
                    publish_generation(pending.pop())
        else:
            publish_generation(generation.before)

    def step_hook(metric: TrainingMetric) -> None:
        if generation is not None and (metric.step % config.evaluation_interval == 0
                                       or metric.step == config.steps):
            publish_generation(generation.run(model, metric.step))
        if on_step is not None:
            on_step(metric)
        if checkpoint_path is not None and checkpoint_interval and \
                metric.step % checkpoint_interval == 0:
            save_checkpoint(checkpoint_path)

    def on_best(metric: TrainingMetric) -> None:
        nonlocal best_values
        if not keep_best:
            return
        with _trainable(model) as parameters:
            best_values = parameters.flat_values()
        if checkpoint_path is not None:
            save_checkpoint(best_checkpoint_path(checkpoint_path))

    if keep_best and resumed and trainer.best_validation_step is not None:
        # The best so far was kept before the interruption: its values are in its checkpoint.
        from .checkpoints import TrainingCheckpoint

        if checkpoint_path is None:
            raise ValueError("resuming a run with early stopping needs checkpoint_path (its best "
                             "checkpoint holds the best values so far)")
        best = TrainingCheckpoint.load(best_checkpoint_path(checkpoint_path))
        if best.global_step != trainer.best_validation_step:
            raise ValueError(f"{best_checkpoint_path(checkpoint_path)} is at step "
                             f"{best.global_step}, the run's best validation at step "
                             f"{trainer.best_validation_step}")
        best_values = best.trainable_values()

    already_stopped = keep_best and \
        trainer.evaluations_without_improvement >= config.early_stopping_patience
    if already_stopped:
        remaining = 0  # a resumed run that early stopping had ended: nothing left to train
    metrics = ()
    # With a checkpoint, Ctrl-C stops at the next step boundary and saves it there. Under
    # data parallelism the ranks must stop together, so the signal is left as it is.
    with DeferredInterrupt(enabled=checkpoint_path is not None
                           and data_parallel is None) as interrupt:
        if remaining:
            metrics = trainer.run(
                source,
                TrainingLoopConfig(remaining, config.evaluation_interval,
                                   config.loss_average_window, config.gradient_accumulation_steps,
                                   config.early_stopping_patience,
                                   float(config.early_stopping_min_delta)),
                validation_batches, run_sink, step_hook,
                evaluate_first=not resumed, stop_requested=interrupt.stop_requested,
                on_best=on_best,
            )
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path)
    if interrupt.requested:
        raise TrainingInterrupted(optimizer.step_count, checkpoint_path, interrupt.signal_number)
    stopped_early = already_stopped or trainer.stopped_early
    return _RunOutcome(tuple(metrics), trainer.best_validation_step if keep_best else None,
                       best_values, stopped_early, tuple(generation_metrics))


def _agreeing_validation(data_parallel, metric_sink):
    """``metric_sink`` after a check that every rank published the same validation loss
    (ValueError on every rank otherwise)."""
    import struct

    def sink(metric: TrainingMetric) -> None:
        if metric.phase == "validation":
            bits = data_parallel.group.allgather(
                int.from_bytes(struct.pack("<d", metric.loss), "little"))
            if any(value != bits[0] for value in bits):
                losses = [struct.unpack("<d", value.to_bytes(8, "little"))[0] for value in bits]
                raise ValueError(f"data parallel: the ranks' validation losses at step "
                                 f"{metric.step} differ ({losses}), so early stopping would "
                                 "decide differently on them; every rank needs the same backend "
                                 "and library")
        if metric_sink is not None:
            metric_sink(metric)

    return sink


def _keep_best(model, outcome: _RunOutcome, final_step: int) -> None:
    """After the optimizer closed: put the best validation's trainable values back when the
    last step is not the best one."""
    if outcome.best_values is not None and outcome.best_step != final_step:
        with _trainable(model) as parameters:
            parameters.load_flat_values(outcome.best_values)


def post_train_jsonl(base: ModelBundle, path, config: PostTrainingConfig | None = None,
                     **options) -> PostTrainingResult:
    """:func:`post_train` on the examples of a JSONL file (errors name ``file:line``)."""
    return post_train(base, read_instructions_jsonl(path), config, **options)


def post_train(
    base: ModelBundle,
    examples: Sequence,
    config: PostTrainingConfig | None = None,
    formatter=None,
    metric_sink: Callable | None = None,
    on_step: Callable | None = None,
    validation_examples: Sequence | None = None,
    checkpoint_path=None,
    checkpoint_interval: int | None = None,
    resume_from=None,
    data_parallel=None,
    generation_checks: Sequence | None = None,
) -> PostTrainingResult:
    """Fine-tune a live copy of ``base`` on ``examples``; see the module docstring.

    ``checkpoint_path`` (every ``checkpoint_interval`` steps, and at the end) writes an
    exact-resume ``.riftckpt``; ``resume_from`` (a path or a loaded checkpoint of this base,
    data and config) continues it, ending exactly where the uninterrupted run ends.
    ``data_parallel`` (a :class:`~.distributed.DataParallel`) makes this call one rank of a
    data-parallel run (see the module docstring); every rank returns the same result.
    ``generation_checks`` (:class:`~.generation_checks.GenerationCheck` values, e.g. from
    :func:`~.generation_checks.read_generation_checks_jsonl`) are answered in ``formatter``'s
    chat template before, during and after training (see the module docstring).
    """
    config = PostTrainingConfig() if config is None else config
    if not isinstance(config, PostTrainingConfig):
        raise TypeError(f"config must be a PostTrainingConfig, not {type(config).__name__}")
    if not isinstance(base, ModelBundle):
        raise TypeError(f"base must be a ModelBundle, not {type(base).__name__}")
    if not examples:
        raise ValueError("examples is empty")
    _check_data_parallel(data_parallel)
    maximum = base.config.maximum_context
    if config.context_size is not None and config.context_size > maximum:
        raise ValueError(
            f"context_size {config.context_size} exceeds the base model's maximum_context "
            f"{maximum}"
        )
    context = maximum if config.context_size is None else config.context_size
    formatter = PlainChatFormatter() if formatter is None else formatter
    rounds = _generation_rounds(generation_checks, getattr(formatter, "template", None), None)
    backend = resolve_backend(config.backend)
    _require_packing_backend(config, backend)
    runtime = base.instantiate(backend, config.attention, config.activation_checkpointing)
    model, tokenizer = runtime.model, runtime.tokenizer
    if rounds is not None:
        rounds.tokenizer = tokenizer
    optimizer = None
    try:
        sequences, masks = encode_examples(
            tokenizer, examples, formatter, config.response_only_loss
        )
        source = _example_source(sequences, masks, config, context)
        validation = validation_batches = None
        if validation_examples:
            validation = encode_examples(tokenizer, validation_examples, formatter,
                                         config.response_only_loss)
            validation_batches = example_batches(validation[0], config.batch_size, context,
                                                 validation[1], config.overlong)
        checkpoint = None if resume_from is None else _loaded_checkpoint(
            resume_from, config, "base_artifact_id", base.artifact_id,
            f"post-training this base bundle ({base.artifact_id[:16]})")
        _require_same_run(data_parallel, config, base.artifact_id, checkpoint, checkpoint_path,
                          checkpoint_interval, backend, (sequences, masks), validation)
        # Scored whole (up to the model's context), not in windows of the training context.
        base_validation = (
            evaluate_sequences(model, validation[0], None, 8, validation[1])
            if validation else None
        )
        if rounds is not None:  # the base, before a checkpoint or NF4 packing replaces it
            rounds.before = rounds.run(model, 0)
        method = config.fine_tuning_method
        quantization = None
        nf4 = None
        if method == "qlora":
            nf4 = {"block_size": config.nf4_block_size,
                   "double_quantization": config.double_quantization,
                   "scale_block_size": config.nf4_scale_block_size}
        if checkpoint is not None:
            resumed = checkpoint.resume(backend, config.attention,
                                        config.activation_checkpointing,
                                        config.resolved_optimizer_state)
            if resumed.tokenizer is not None:
                resumed.tokenizer.close()
            model, optimizer = resumed.model, resumed.optimizer
        elif method == "qlora":
            model.quantize_nf4(config.nf4_block_size, config.double_quantization,
                               config.nf4_scale_block_size)
        if method == "qlora":
            quantization = {
                "format": "nf4",
                "block_size": config.nf4_block_size,
                "double_quantization": config.double_quantization,
                "scale_block_size": config.nf4_scale_block_size,
                "packed_memory": dataclasses.asdict(model.quantized_memory),
                "export": "materialized_fp32",
            }
        if checkpoint is None:
            optimizer = _trainable_with_optimizer(model, config)
        trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=data_parallel)
        optimizer = trainer.optimizer  # sharded over the ranks under ZeRO-1
        if checkpoint is not None:
            checkpoint.restore_source(source)
            checkpoint.restore_trainer(trainer)
        outcome = _train_to_the_end(
            trainer, source, config, tokenizer, metric_sink, on_step, checkpoint_path,
            checkpoint_interval, nf4, {"stage": "post_training",
                                      "base_artifact_id": base.artifact_id},
            validation_batches or (), resumed=checkpoint is not None, generation=rounds)
        metrics = outcome.metrics
        final_step = optimizer.step_count
        optimizer_report = {
            "state_storage": optimizer.state_storage,
            "page_size": optimizer.state_page_size,
            "page_count": optimizer.state_page_count,
            "payload_bytes": optimizer.state_payload_bytes,
        }
        optimizer.close()
        _keep_best(model, outcome, final_step)
        adapter = None
        if method in ("lora", "qlora"):
            # The adapter alone, before the merge folds it in (adapter-only saves).
            adapter = capture_lora_adapter(model, {
                "weights_sha256": base.manifest["weights"]["sha256"],
                "artifact_id": base.artifact_id})
            model.merge_lora()
        tuned_validation = (
            evaluate_sequences(model, validation[0], None, 8, validation[1])
            if validation else None
        )
        tuned_generation = _tuned_generation(rounds, model, outcome, final_step, method)
        data = _data_report(source)
        metadata = {
            "objective": config.objective,
            "response_only_loss": config.response_only_loss,
            "example_count": len(sequences),
            "data": data,
            "steps_run": final_step,
            "stopped_early": outcome.stopped_early,
            "best_step": outcome.best_step,
            "formatter": type(formatter).__name__,
            "config": {**dataclasses.asdict(config), "lora": dataclasses.asdict(config.lora)},
            "backend": backend,
            "fine_tuning_method": method,
            "parameter_scope": "adapter" if method != "full" else "model",
            "lora_merged": method != "full",
            "quantization": quantization,
            "optimizer": optimizer_report,
            "optimizer_state_included": False,
            "adapter_state_included": False,
            "final_training_loss": metrics[-1].loss if metrics else None,
        }
        if base_validation is not None:
            metadata["validation"] = {
                "base_loss": base_validation.loss,
                "tuned_loss": tuned_validation.loss,
                "delta_loss": tuned_validation.loss - base_validation.loss,
                "target_token_count": tuned_validation.target_token_count,
            }
        if rounds is not None:
            metadata["generation_checks"] = _generation_report(rounds, tuned_generation)
        if model.backend != "cpu":
            model.to("cpu")
        bundle = ModelBundle.capture(model, tokenizer, "post_training", base.artifact_id, metadata)
    finally:
        if optimizer is not None and not optimizer.closed:
            optimizer.close()
        if model is not runtime.model:
            model.close()
        runtime.close()
    return PostTrainingResult(
        bundle, metrics, len(sequences), config.objective, config.fine_tuning_method,
        base_validation, tuned_validation, data, outcome.best_step, outcome.stopped_early,
        None if rounds is None else rounds.before, tuned_generation, outcome.generation_metrics,
        adapter,
    )


def _generation_report(rounds: _GenerationRounds, tuned: GenerationCheckMetric) -> dict:
    """The generation checks' before/after pass counts, for metadata."""
    return {"total": tuned.total, "base_passed": rounds.before.passed,
            "tuned_passed": tuned.passed}


@dataclass(frozen=True)
class PretrainedFineTuningResult:
    """What :func:`fine_tune_pretrained` did: the per-step metrics, the validation before
    and after (when validation examples were given), and the wall time of the steps."""

    metrics: tuple[TrainingMetric, ...]
    example_count: int
    objective: str
    fine_tuning_method: str
    base_validation: CausalEvaluation | None
    tuned_validation: CausalEvaluation | None
    step_seconds: tuple[float, ...]
    data: dict | None = None
    best_step: int | None = None
    stopped_early: bool = False
    base_generation: GenerationCheckMetric | None = None
    tuned_generation: GenerationCheckMetric | None = None
    generation_metrics: tuple[GenerationCheckMetric, ...] = ()
    adapter: LoraAdapter | None = None


def fine_tune_pretrained(
    pretrained,
    examples: Sequence,
    config: PostTrainingConfig | None = None,
    metric_sink: Callable | None = None,
    on_step: Callable | None = None,
    validation_examples: Sequence | None = None,
    checkpoint_path=None,
    checkpoint_interval: int | None = None,
    resume_from=None,
    base_id: str | None = None,
    data_parallel=None,
    generation_checks: Sequence | None = None,
) -> PretrainedFineTuningResult:
    """Fine-tune a loaded pretrained model (:func:`~.pretrained.load_pretrained`) IN PLACE on
    instruction ``examples`` rendered with the model's own chat template.

    ``config.fine_tuning_method`` ``"full"``, ``"lora"`` or ``"qlora"`` as for
    :func:`post_train` (QLoRA packs every projection to NF4, trains the adapters, and the merge
    dequantizes, so the model is dense float32 again afterwards). A model whose projections
    are already packed in GGUF block formats (``load_pretrained(weights="file")``, or
    ``"q8_0"`` and the other conversions) trains with ``"qlora"`` only: the adapters learn over
    those blocks as they are (the base bytes never change, and no float32 copy of them is
    made), and stay attached, unmerged, afterwards (``result.adapter`` holds them alone).
    Checkpoints (``checkpoint_path``, ``resume_from``) do not hold such a base yet.
    ``config.backend`` must be the model's; ``attention`` and ``activation_checkpointing``
    apply to the model. Save the result with :meth:`~.pretrained.PretrainedModel.save`.
    ``data_parallel`` as for :func:`post_train` (every rank loads the same model; ``base_id``
    identifies it). ``generation_checks`` as for :func:`post_train`, in the model's chat template.
    """
    import time as _time

    from .instructions import ChatTemplateFormatter

    config = PostTrainingConfig() if config is None else config
    if not isinstance(config, PostTrainingConfig):
        raise TypeError(f"config must be a PostTrainingConfig, not {type(config).__name__}")
    if not examples:
        raise ValueError("examples is empty")
    _check_data_parallel(data_parallel)
    model, tokenizer = pretrained.model, pretrained.tokenizer
    rounds = _generation_rounds(generation_checks, pretrained.chat_template, tokenizer,
                                pretrained.end_token_id)
    pretrained.reset_generator()  # its KV-cache pool pins the parameters
    # Projections packed in GGUF block formats (a file's own blocks): QLoRA trains over them.
    block_base = (model.quantized_linear_weights and not model.lora_attached
                  and model.linear_weight_format != "nf4")
    if model.lora_attached or (model.quantized_linear_weights and not block_base):
        raise ValueError("the model already has adapters or packed weights")
    if block_base:
        packed = model.linear_weight_format
        if config.fine_tuning_method != "qlora":
            raise ValueError(f"the model's projections are packed ({packed}: a GGUF file's blocks "
                             f"or a conversion), which only fine_tuning_method 'qlora' trains "
                             f"over; load the model with weights='f32' for "
                             f"{config.fine_tuning_method!r}")
        if checkpoint_path is not None or resume_from is not None:
            raise ValueError(f"checkpoints do not hold a model packed in {packed} blocks yet: "
                             "train without checkpoint_path/resume_from, or load the model with "
                             "weights='f32'")
    if config.context_size is not None and config.context_size > model.maximum_context:
        raise ValueError(f"context_size {config.context_size} exceeds the model's maximum_context "
                         f"{model.maximum_context}")
    context = model.maximum_context if config.context_size is None else config.context_size
    _require_packing_backend(config, model.backend)
    formatter = ChatTemplateFormatter(pretrained.chat_template)
    sequences, masks = encode_examples(tokenizer, examples, formatter, config.response_only_loss)
    source = _example_source(sequences, masks, config, context)
    validation = (encode_examples(tokenizer, validation_examples, formatter,
                                  config.response_only_loss) if validation_examples else None)
    validation_batches = (example_batches(validation[0], config.batch_size, context,
                                          validation[1], config.overlong) if validation else ())
    # A checkpoint to resume is checked before the model changes (packing, adapters).
    checkpoint = None if resume_from is None else _loaded_checkpoint(
        resume_from, config, "base_id", base_id,
        f"fine-tuning this model (base_id {base_id!r})")
    _require_same_run(data_parallel, config, [base_id, repr(model.config)], checkpoint,
                      checkpoint_path, checkpoint_interval, model.backend,
                      (sequences, masks), validation)
    model.set_full_sequence_attention(config.attention)
    model.set_activation_checkpointing(config.activation_checkpointing)
    base_validation = (evaluate_sequences(model, validation[0], None, 8,
                                          validation[1]) if validation else None)
    if rounds is not None:
        rounds.before = rounds.run(model, 0)
    method = config.fine_tuning_method
    if method == "qlora" and not block_base:
        model.quantize_nf4(config.nf4_block_size, config.double_quantization,
                           config.nf4_scale_block_size)
    optimizer = _trainable_with_optimizer(model, config)
    nf4 = ({"block_size": config.nf4_block_size, "double_quantization": config.double_quantization,
            "scale_block_size": config.nf4_scale_block_size}
           if method == "qlora" and not block_base else None)
    step_seconds: list[float] = []
    last = [_time.perf_counter()]

    def step_hook(metric: TrainingMetric) -> None:
        now = _time.perf_counter()
        step_seconds.append(now - last[0])
        last[0] = now
        if on_step is not None:
            on_step(metric)

    try:
        trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=data_parallel)
        optimizer = trainer.optimizer  # sharded over the ranks under ZeRO-1
        if checkpoint is not None:
            checkpoint.restore(model, optimizer, source, trainer)
        last[0] = _time.perf_counter()
        outcome = _train_to_the_end(trainer, source, config, tokenizer, metric_sink, step_hook,
                                    checkpoint_path, checkpoint_interval, nf4,
                                    {"stage": "post_training", "base_id": base_id},
                                    validation_batches, resumed=resume_from is not None,
                                    generation=rounds)
        final_step = optimizer.step_count
    finally:
        optimizer.close()
    _keep_best(model, outcome, final_step)
    adapter = None
    if method in ("lora", "qlora"):
        # The adapter alone, before the merge folds it in (adapter-only saves); the base is
        # named by base_id (riftco post-train --model: the SHA-256 of the source).
        adapter = capture_lora_adapter(model, {"base_id": base_id} if base_id else {})
        if not block_base:  # a block-packed base keeps its adapters attached, unmerged
            model.merge_lora()
    pretrained.reset_generator()
    tuned_validation = (evaluate_sequences(model, validation[0], None, 8,
                                           validation[1]) if validation else None)
    tuned_generation = _tuned_generation(rounds, model, outcome, final_step, method)
    return PretrainedFineTuningResult(outcome.metrics, len(sequences), config.objective, method,
                                      base_validation, tuned_validation, tuple(step_seconds),
                                      _data_report(source), outcome.best_step,
                                      outcome.stopped_early,
                                      None if rounds is None else rounds.before,
                                      tuned_generation, outcome.generation_metrics, adapter)
