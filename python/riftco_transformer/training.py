"""The causal-language-model training loop (docs/ARCHITECTURE.md, 'Training workflows').

One step: draw a batch, run a fresh forward (a new single-use graph), take the mean
cross-entropy, read its value (the loss of the pre-update parameters), backward, one Adam
step (global-norm clipping, then the update at the step's scheduled learning rate), then
publish a :class:`TrainingMetric` to the sink. With ``gradient_accumulation_steps`` k > 1 a
step draws k micro-batches and backwards each one's mean loss scaled by its share of the
step's counted targets, adding into the gradients, so the one update equals a step on the k
micro-batches together. With validation batches, the model is evaluated once before training
and then every ``evaluation_interval`` steps and at the final step (the mean loss over the
counted targets, no backward). With ``early_stopping_patience`` p, a validation that does not
beat the best one so far by more than ``early_stopping_min_delta`` counts against the run,
and p of them in a row end it; ``on_best`` hears every new best, so the caller can keep it.

The loop is resumable: :meth:`CausalLanguageModelTrainer.run` continues from the
optimizer's step count, and the rolling loss average is part of the trainer's state
(:meth:`capture_state`), so a run resumed from a checkpoint publishes the same metrics as an
uninterrupted one.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .batching import TrainingBatch, WindowBatchSource
from .native import Adam, cross_entropy
from .native._validation import require_int

MetricSink = Callable[["TrainingMetric"], None]


class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT (Ctrl-C) or SIGTERM at a step boundary after writing its
    checkpoint: ``step`` is the last step done, ``checkpoint`` the file that resumes it and
    ``signal_number`` the signal that asked for the stop."""

    def __init__(self, step: int, checkpoint, signal_number: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted after step {step}; {checkpoint} resumes the run")
        self.step = step
        self.checkpoint = checkpoint
        self.signal_number = int(signal_number)


class DeferredInterrupt:
    """While active (``with``), the first SIGINT or SIGTERM only sets :attr:`requested` (and
    :attr:`signal_number`), so a run that writes checkpoints can stop at the next step boundary
    and save one instead of dying at an arbitrary point; a second one raises KeyboardInterrupt
    at once, as SIGINT usually does. It changes nothing off the main thread or when disabled,
    and leaves alone a signal that already has another handler than Python's default one."""

    _SIGNALS = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self.signal_number: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> DeferredInterrupt:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for number, default in self._SIGNALS:
                if signal.getsignal(number) is default:
                    self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_number = signum

    def __exit__(self, *exception_info) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def stop_requested(self) -> bool:
        return self.requested


@dataclass(frozen=True)
class TrainingLoopConfig:
    """``steps`` to run (in this call), how often to evaluate, and the rolling-average window;
    all positive ints (TypeError/ValueError otherwise)."""

    steps: int
    evaluation_interval: int = 10
    loss_average_window: int = 10
    gradient_accumulation_steps: int = 1
    early_stopping_patience: int | None = None
    early_stopping_min_delta: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "evaluation_interval", "loss_average_window",
                     "gradient_accumulation_steps"):
            object.__setattr__(self, name, require_int(getattr(self, name), name, 1, 1 << 63))
        if self.early_stopping_patience is not None:
            object.__setattr__(self, "early_stopping_patience", require_int(
                self.early_stopping_patience, "early_stopping_patience", 1, 1 << 63))
        delta = self.early_stopping_min_delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or \
                not math.isfinite(delta) or delta < 0:
            raise ValueError(f"early_stopping_min_delta must be a finite number >= 0, got "
                             f"{delta!r}")


@dataclass(frozen=True)
class TrainingMetric:
    """One published measurement.

    ``phase`` is ``"train"`` or ``"validation"``; ``step`` the optimizer step it belongs to
    (1-based for training; validation before any update is step 0 or the resumed step);
    ``perplexity = exp(loss)`` (inf on overflow). Training metrics also carry the rolling
    ``loss_average``, the pre-clip global ``gradient_norm``, the ``clip_scale``, the
    throughput of that step and the ``learning_rate`` its update used.
    """

    phase: str
    step: int
    loss: float
    perplexity: float
    loss_average: float | None = None
    gradient_norm: float | None = None
    clip_scale: float | None = None
    tokens_per_second: float | None = None
    elapsed_seconds: float | None = None
    learning_rate: float | None = None


def perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def batch_loss(model, batch: TrainingBatch):
    """The mean cross-entropy variable of ``batch`` (response-only when it has a mask; packed
    rows when it has positions)."""
    logits = (model(batch.inputs) if batch.positions is None
              else model(batch.inputs, positions=batch.positions))
    if batch.target_mask is None:
        return cross_entropy(logits, batch.targets)
    from .native.autograd import cross_entropy_masked

    return cross_entropy_masked(logits, batch.targets, batch.target_mask)


def counted_targets(batch: TrainingBatch) -> int:
    """The targets that count toward ``batch``'s mean loss."""
    if batch.target_mask is None:
        return batch.token_count
    return sum(sum(row) for row in batch.target_mask)


def evaluate_batches(model, batches: Sequence[TrainingBatch]) -> float:
    """The mean loss over every counted target of ``batches`` (no backward): each batch's
    mean weighted by its counted targets (for batches of equal size without masks, the mean
    of the per-batch means)."""
    if not batches:
        raise ValueError("evaluate_batches needs at least one batch")
    weights = [counted_targets(batch) for batch in batches]
    equal = all(weight == weights[0] for weight in weights)
    total = 0.0
    # Evaluation: no LoRA dropout, and the training run's dropout key stays where it is.
    with model.lora_dropout_disabled():
        for batch, weight in zip(batches, weights, strict=True):
            loss = batch_loss(model, batch)
            total += loss.item() * (1 if equal else weight)
            loss.close()
    return total / (len(batches) if equal else sum(weights))


class CausalLanguageModelTrainer:
    """Trains ``model`` with ``optimizer``, which must own exactly the parameters being
    trained: the model's (full training) or its adapter's (LoRA/QLoRA)."""

    def __init__(self, model, optimizer: Adam, data_parallel=None) -> None:
        if not isinstance(optimizer, Adam):
            raise TypeError(f"optimizer must be an Adam, not {type(optimizer).__name__}")
        if optimizer.backend != model.backend:
            raise ValueError(
                f"optimizer is on {optimizer.backend!r} but the model is on {model.backend!r}"
            )
        if not optimizer.owns_parameters_of(model):
            raise ValueError("optimizer does not own this model's trainable parameters")
        self.model = model
        self.optimizer = optimizer
        # Training mode: the training forwards apply LoRA dropout (a PEFT import leaves the
        # model in evaluation mode); evaluate_batches turns it off for its own forwards.
        if model.lora_dropout_enabled is False:
            model.lora_dropout_enabled = True
        self._recent_losses: deque[float] = deque()
        # Early stopping's record: the best validation so far and the evaluations since.
        self.best_validation_loss: float | None = None
        self.best_validation_step: int | None = None
        self.evaluations_without_improvement = 0
        self.stopped_early = False  # whether early stopping ended the last run()
        # Data parallelism (riftco_transformer.distributed.DataParallel): every rank trains on
        # its shard of each global batch, gradients are averaged before the step, and the
        # replicas start from rank 0's values.
        self.data_parallel = data_parallel
        if data_parallel is not None:
            from .distributed import DataParallel

            if not isinstance(data_parallel, DataParallel):
                raise TypeError("data_parallel must be a DataParallel, not "
                                f"{type(data_parallel).__name__}")
            with model.parameters() as parameters:
                data_parallel.synchronize_parameters(parameters)
            if model.lora_attached:
                with model.adapter_parameters() as adapter:
                    data_parallel.synchronize_parameters(adapter)
            if data_parallel.shard_optimizer and not optimizer.sharded:
                # ZeRO-1: the same optimizer (options, step count, moments) sharded over the
                # ranks; the given one is closed, so callers go on with self.optimizer.
                trainable = model.adapter_parameters() if model.lora_attached \
                    else model.parameters()
                state = optimizer.state()
                with trainable:
                    sharded = Adam(trainable, optimizer.options, sharded_over=data_parallel)
                try:
                    sharded.load_state(state)
                except BaseException:
                    sharded.close()
                    raise
                optimizer.close()
                self.optimizer = sharded

    def capture_state(self) -> dict:
        """The loop's own state (the rolling window's losses, and early stopping's record
        once a validation ran), for checkpoints."""
        state: dict = {"recent_losses": list(self._recent_losses)}
        if self.best_validation_loss is not None:
            state["best_validation"] = {
                "loss": self.best_validation_loss, "step": self.best_validation_step,
                "evaluations_without_improvement": self.evaluations_without_improvement}
        return state

    def restore_state(self, state: dict) -> None:
        losses = state.get("recent_losses") if isinstance(state, dict) else None
        if not isinstance(losses, list) or not all(isinstance(v, float) for v in losses):
            raise ValueError("trainer state must have recent_losses, a list of floats")
        best = state.get("best_validation")
        if best is not None and not (
                isinstance(best, dict)
                and set(best) == {"loss", "step", "evaluations_without_improvement"}
                and isinstance(best["loss"], float) and math.isfinite(best["loss"])
                and isinstance(best["step"], int) and not isinstance(best["step"], bool)
                and best["step"] >= 0
                and isinstance(best["evaluations_without_improvement"], int)
                and best["evaluations_without_improvement"] >= 0):
            raise ValueError("trainer state's best_validation must have a finite loss, a step "
                             "and evaluations_without_improvement")
        self._recent_losses = deque(losses)
        if best is None:
            self.best_validation_loss = self.best_validation_step = None
            self.evaluations_without_improvement = 0
        else:
            self.best_validation_loss = best["loss"]
            self.best_validation_step = best["step"]
            self.evaluations_without_improvement = best["evaluations_without_improvement"]

    def train_step(self, batch: TrainingBatch | Sequence[TrainingBatch],
                   window: int = 10) -> TrainingMetric:
        """One step on ``batch`` (the global batch under data parallelism: this rank trains on
        its shard, and the loss reported is the global batch's); returns its metric.

        A sequence of batches is one step of gradient accumulation over them: each one's mean
        loss is backwarded with the scale (its counted targets) / (all their counted targets)
        into the same gradients, so the update and the reported loss are those of the mean
        over every counted target of the step. Under data parallelism each one is a global
        batch that every rank shards, and the step equals one process accumulating the same
        batches."""
        started = time.perf_counter()
        micro = (batch,) if isinstance(batch, TrainingBatch) else tuple(batch)
        if not micro or not all(isinstance(b, TrainingBatch) for b in micro):
            raise TypeError("batch must be a TrainingBatch or a nonempty sequence of them")
        if self.data_parallel is not None:
            value = self._data_parallel_backward(micro)
        elif len(micro) == 1:
            loss = batch_loss(self.model, micro[0])
            value = loss.item()
            loss.backward()
            loss.close()
        else:
            weights = [counted_targets(b) for b in micro]
            total = sum(weights)
            if total == 0:
                raise ValueError("no target counts in any of this step's batches")
            value = 0.0
            accumulate = False  # the first backward replaces, the others add
            for piece, weight in zip(micro, weights, strict=True):
                if weight == 0:
                    continue  # nothing counts: no contribution (and no empty mean)
                loss = batch_loss(self.model, piece)
                value += loss.item() * weight / total
                loss.backward_scaled(weight / total, accumulate=accumulate)
                loss.close()
                accumulate = True
        stats = self.optimizer.step()
        elapsed = time.perf_counter() - started
        self._recent_losses.append(value)
        while len(self._recent_losses) > window:
            self._recent_losses.popleft()
        return TrainingMetric(
            phase="train",
            step=stats.step,
            loss=value,
            perplexity=perplexity(value),
            loss_average=sum(self._recent_losses) / len(self._recent_losses),
            gradient_norm=stats.gradient_norm,
            clip_scale=stats.clip_scale,
            tokens_per_second=(sum(b.token_count for b in micro) / elapsed
                               if elapsed > 0 else None),
            elapsed_seconds=elapsed,
            learning_rate=stats.learning_rate,
        )

    def _data_parallel_backward(self, micro: Sequence[TrainingBatch]) -> float:
        """This rank's shard of every batch of the step, forward and backward, then one
        weighted gradient average over the ranks; returns the step's global mean loss.

        With W this rank's counted targets over all its shards, each shard's mean loss is
        backwarded with the scale (its counted targets) / W into the same gradients, locally,
        and the last shard that counts anything does so with the reduction overlapped,
        weighted by W: the average Σ_r W_r·(Σ_i c_ri/W_r·g_ri) / Σ_r W_r is the mean over
        every counted target of the step, as one process accumulating the same batches. A rank
        whose shards count nothing takes part with weight 0 (zero gradients): every rank
        makes the same collectives, in the same order, and reduces once per step."""
        parallel = self.data_parallel
        shards = []  # (this rank's rows of the batch, its counted targets)
        for batch in micro:  # every shard first: a batch that does not split fails here
            begin, end = parallel.shard(batch.batch_size)
            mask = batch.target_mask
            local = TrainingBatch(batch.inputs[begin:end], batch.targets[begin:end],
                                  None if mask is None else mask[begin:end],
                                  None if batch.positions is None
                                  else batch.positions[begin:end])
            if mask is None:
                weight = float(local.token_count)
            else:
                weight = float(sum(len(row) - row.count(0) for row in local.target_mask))
            shards.append((local, weight))
        local_weight = sum(weight for _, weight in shards)
        counted = [index for index, (_, weight) in enumerate(shards) if weight > 0]
        losses = []  # (the shard's mean loss, its counted targets)
        trainable = (self.model.adapter_parameters() if self.model.lora_attached
                     else self.model.parameters())
        with trainable:
            if not counted:  # nothing counts on this rank: no contribution (zero gradients)
                total = parallel.reduce_gradients(trainable, 0.0)
            for position, index in enumerate(counted):
                local, weight = shards[index]
                loss = batch_loss(self.model, local)
                try:
                    losses.append((loss.item(), weight))
                    accumulate = position > 0  # the first backward replaces, the others add
                    if index == counted[-1]:
                        # The reduction runs while backward computes (the buckets'
                        # collectives are the blocking path's, in the same order, so ranks
                        # may mix the two).
                        total = parallel.backward_and_reduce(
                            trainable, loss, local_weight, scale=weight / local_weight,
                            accumulate=accumulate)
                    else:
                        loss.backward_scaled(weight / local_weight, accumulate=accumulate)
                finally:
                    loss.close()
        # Each shard's mean loss weighted by its share of the step's counted targets, summed
        # over the ranks (in the single-process accumulation's order, so a world of one
        # reports its value bit for bit).
        value = 0.0
        for loss_value, weight in losses:
            value += loss_value * weight / total
        return parallel.group.allreduce_sum([value])[0]

    def run(
        self,
        source: WindowBatchSource,
        config: TrainingLoopConfig,
        validation_batches: Sequence[TrainingBatch] = (),
        metric_sink: MetricSink | None = None,
        on_step: Callable[[TrainingMetric], None] | None = None,
        evaluate_first: bool = True,
        stop_requested: Callable[[], bool] | None = None,
        on_best: Callable[[TrainingMetric], None] | None = None,
    ) -> tuple[TrainingMetric, ...]:
        """Run ``config.steps`` steps from ``source``; returns every metric published.

        ``on_step(metric)`` runs after each training step and its validation, if any
        (progress bars, periodic checkpoints). ``evaluate_first`` evaluates before the first
        step (skip it when resuming, where the uninterrupted run already published that
        evaluation).
        ``stop_requested()``, checked after each step and its evaluation, ends the run early
        when true (a :class:`DeferredInterrupt`); ``optimizer.step_count`` says where.
        ``on_best(metric)`` runs after each validation that is a new best (the first one
        included); :attr:`stopped_early` says whether early stopping ended the run.
        """
        if not isinstance(config, TrainingLoopConfig):
            raise TypeError(f"config must be a TrainingLoopConfig, not {type(config).__name__}")
        if source.context_size > self.model.config.maximum_context:
            raise ValueError(
                f"source context_size {source.context_size} exceeds the model's maximum_context "
                f"{self.model.config.maximum_context}"
            )
        metrics: list[TrainingMetric] = []

        def publish(metric: TrainingMetric) -> None:
            metrics.append(metric)
            if metric_sink is not None:
                metric_sink(metric)

        def validate(step: int) -> None:
            value = evaluate_batches(self.model, validation_batches)
            metric = TrainingMetric("validation", step, value, perplexity(value))
            publish(metric)
            best = self.best_validation_loss
            if best is None or value < best - config.early_stopping_min_delta:
                self.best_validation_loss, self.best_validation_step = value, step
                self.evaluations_without_improvement = 0
                if on_best is not None:
                    on_best(metric)
            else:
                self.evaluations_without_improvement += 1

        self.stopped_early = False
        patience = config.early_stopping_patience
        first_step = self.optimizer.step_count
        final_step = first_step + config.steps
        if validation_batches and evaluate_first:
            validate(first_step)
        for _ in range(config.steps):
            batch = (source.next() if config.gradient_accumulation_steps == 1 else
                     [source.next() for _ in range(config.gradient_accumulation_steps)])
            metric = self.train_step(batch, config.loss_average_window)
            publish(metric)
            if validation_batches and (
                metric.step % config.evaluation_interval == 0 or metric.step == final_step
            ):
                validate(metric.step)
            # After the step's validation: a checkpoint written here records it.
            if on_step is not None:
                on_step(metric)
            if validation_batches and patience is not None and \
                    self.evaluations_without_improvement >= patience:
                self.stopped_early = True
                break
            if stop_requested is not None and stop_requested():
                break
        return tuple(metrics)
