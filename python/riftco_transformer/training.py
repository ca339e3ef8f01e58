"""The causal-language-model training loop (docs/ARCHITECTURE.md, 'Training workflows').

One step: draw a batch, run a fresh forward (a new single-use graph), take the mean
cross-entropy, read its value (the loss of the pre-update parameters), backward, one Adam
step (global-norm clipping, then the update), then publish a :class:`TrainingMetric` to the
sink. With validation batches, the model is evaluated once before training and then every
``evaluation_interval`` steps and at the final step (mean of the per-batch mean losses, no
backward).

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
    """A run stopped by SIGINT (Ctrl-C) at a step boundary after writing its checkpoint:
    ``step`` is the last step done and ``checkpoint`` the file that resumes it."""

    def __init__(self, step: int, checkpoint) -> None:
        super().__init__(f"interrupted after step {step}; {checkpoint} resumes the run")
        self.step = step
        self.checkpoint = checkpoint


class DeferredInterrupt:
    """While active (``with``), the first SIGINT only sets :attr:`requested`, so a run that
    writes checkpoints can stop at the next step boundary and save one instead of dying at an
    arbitrary point; a second SIGINT raises KeyboardInterrupt at once, as usual. It changes
    nothing off the main thread, when disabled, or when SIGINT already has another handler
    than Python's default one."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self._previous = None

    def __enter__(self) -> DeferredInterrupt:
        if (self.enabled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exception_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def stop_requested(self) -> bool:
        return self.requested


@dataclass(frozen=True)
class TrainingLoopConfig:
    """``steps`` to run (in this call), how often to evaluate, and the rolling-average window;
    all positive ints (TypeError/ValueError otherwise)."""

    steps: int
    evaluation_interval: int = 10
    loss_average_window: int = 10

    def __post_init__(self) -> None:
        for name in ("steps", "evaluation_interval", "loss_average_window"):
            object.__setattr__(self, name, require_int(getattr(self, name), name, 1, 1 << 63))


@dataclass(frozen=True)
class TrainingMetric:
    """One published measurement.

    ``phase`` is ``"train"`` or ``"validation"``; ``step`` the optimizer step it belongs to
    (1-based for training; validation before any update is step 0 or the resumed step);
    ``perplexity = exp(loss)`` (inf on overflow). Training metrics also carry the rolling
    ``loss_average``, the pre-clip global ``gradient_norm``, the ``clip_scale``, and the
    throughput of that step.
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


def perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def batch_loss(model, batch: TrainingBatch):
    """The mean cross-entropy variable of ``batch`` (response-only when it has a mask)."""
    logits = model(batch.inputs)
    if batch.target_mask is None:
        return cross_entropy(logits, batch.targets)
    from .native.autograd import cross_entropy_masked

    return cross_entropy_masked(logits, batch.targets, batch.target_mask)


def evaluate_batches(model, batches: Sequence[TrainingBatch]) -> float:
    """The mean of the per-batch mean losses (no backward)."""
    if not batches:
        raise ValueError("evaluate_batches needs at least one batch")
    total = 0.0
    for batch in batches:
        loss = batch_loss(model, batch)
        total += loss.item()
        loss.close()
    return total / len(batches)


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
        self._recent_losses: deque[float] = deque()
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

    def capture_state(self) -> dict:
        """The loop's own state (the rolling window's losses), for checkpoints."""
        return {"recent_losses": list(self._recent_losses)}

    def restore_state(self, state: dict) -> None:
        losses = state.get("recent_losses") if isinstance(state, dict) else None
        if not isinstance(losses, list) or not all(isinstance(v, float) for v in losses):
            raise ValueError("trainer state must have recent_losses, a list of floats")
        self._recent_losses = deque(losses)

    def train_step(self, batch: TrainingBatch, window: int = 10) -> TrainingMetric:
        """One step on ``batch`` (the global batch under data parallelism: this rank trains on
        its shard, and the loss reported is the global batch's); returns its metric."""
        started = time.perf_counter()
        if self.data_parallel is None:
            loss = batch_loss(self.model, batch)
            value = loss.item()
            loss.backward()
            loss.close()
        else:
            value = self._data_parallel_backward(batch)
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
            tokens_per_second=batch.token_count / elapsed if elapsed > 0 else None,
            elapsed_seconds=elapsed,
        )

    def _data_parallel_backward(self, batch: TrainingBatch) -> float:
        """This rank's shard forward and backward, then the weighted gradient average; returns
        the global batch's mean loss (each shard's mean weighted by its counted targets)."""
        begin, end = self.data_parallel.shard(batch.batch_size)
        mask = batch.target_mask
        local = TrainingBatch(batch.inputs[begin:end], batch.targets[begin:end],
                              None if mask is None else mask[begin:end])
        if mask is None:
            weight = float(local.token_count)
        else:
            weight = float(sum(len(row) - row.count(0) for row in local.target_mask))
        if weight > 0:
            loss = batch_loss(self.model, local)
            local_loss = loss.item()
            loss.backward()
            loss.close()
        else:  # a shard with no counted target contributes nothing (zero gradients)
            local_loss = 0.0
        if self.model.lora_attached:
            with self.model.adapter_parameters() as trainable:
                total = self.data_parallel.reduce_gradients(trainable, weight)
        else:
            with self.model.parameters() as trainable:
                total = self.data_parallel.reduce_gradients(trainable, weight)
        return self.data_parallel.group.allreduce_sum([local_loss * weight])[0] / total

    def run(
        self,
        source: WindowBatchSource,
        config: TrainingLoopConfig,
        validation_batches: Sequence[TrainingBatch] = (),
        metric_sink: MetricSink | None = None,
        on_step: Callable[[TrainingMetric], None] | None = None,
        evaluate_first: bool = True,
        stop_requested: Callable[[], bool] | None = None,
    ) -> tuple[TrainingMetric, ...]:
        """Run ``config.steps`` steps from ``source``; returns every metric published.

        ``on_step(metric)`` runs after each training step (progress bars, periodic
        checkpoints). ``evaluate_first`` evaluates before the first step (skip it when
        resuming, where the uninterrupted run already published that evaluation).
        ``stop_requested()``, checked after each step and its evaluation, ends the run early
        when true (a :class:`DeferredInterrupt`); ``optimizer.step_count`` says where.
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
            publish(TrainingMetric("validation", step, value, perplexity(value)))

        first_step = self.optimizer.step_count
        final_step = first_step + config.steps
        if validation_batches and evaluate_first:
            validate(first_step)
        for _ in range(config.steps):
            metric = self.train_step(source.next(), config.loss_average_window)
            publish(metric)
            if on_step is not None:
                on_step(metric)
            if validation_batches and (
                metric.step % config.evaluation_interval == 0 or metric.step == final_step
            ):
                validate(metric.step)
            if stop_requested is not None and stop_requested():
                break
        return tuple(metrics)
