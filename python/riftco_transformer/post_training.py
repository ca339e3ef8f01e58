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

The objective is ``full_sequence_causal_sft`` (every token of the formatted text) or, with
``response_only_loss=True``, ``response_only_causal_sft``: only the assistant's tokens
(response text and the newline that ends it) are targets. The child records its parent's
``artifact_id``. With ``validation_examples``, the base and the tuned model are scored on
them with the exhaustive evaluator (:mod:`.evaluation`), before and after, and the figures
go into the result and the child's metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .artifacts import ModelBundle
from .batching import SAMPLING_STRATEGIES, WindowBatchSource
from .evaluation import CausalEvaluation, encode_examples, evaluate_sequences
from .instructions import PlainChatFormatter, read_instructions_jsonl
from .native import Adam, AdamOptions, LoraConfig
from .native._validation import require_int, require_positive_float
from .pretraining import _one_of, _positive, require_backend_name, resolve_backend
from .training import (
    CausalLanguageModelTrainer,
    DeferredInterrupt,
    TrainingInterrupted,
    TrainingLoopConfig,
    TrainingMetric,
)

FINE_TUNING_METHODS = ("full", "lora", "qlora")


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
    context_size: int = 16
    batch_size: int = 2
    evaluation_interval: int = 10
    loss_average_window: int = 10
    learning_rate: float = 1e-3
    random_seed: int = 29
    backend: str = "auto"
    fine_tuning_method: str = "full"
    sampling_strategy: str = "example_uniform"
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    attention: str = "materialized"
    activation_checkpointing: str = "disabled"
    nf4_block_size: int = 64
    nf4_scale_block_size: int = 256
    double_quantization: bool = True
    optimizer_state: str = "auto"
    optimizer_page_size: int = 4096
    response_only_loss: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "context_size", "batch_size", "evaluation_interval",
                     "loss_average_window", "optimizer_page_size"):
            _positive(getattr(self, name), name)
        require_int(self.random_seed, "random_seed", 0, 1 << 63)
        require_positive_float(self.learning_rate, "learning_rate")
        require_backend_name(self.backend)
        _one_of(self.fine_tuning_method, "fine_tuning_method", FINE_TUNING_METHODS)
        _one_of(self.sampling_strategy, "sampling_strategy", SAMPLING_STRATEGIES)
        if not isinstance(self.lora, LoraConfig):
            raise TypeError(f"lora must be a LoraConfig, not {type(self.lora).__name__}")
        _one_of(self.attention, "attention", ("materialized", "flash"))
        _one_of(self.activation_checkpointing, "activation_checkpointing", ("disabled", "block"))
        _power_of_two(self.nf4_block_size, "nf4_block_size")
        _power_of_two(self.nf4_scale_block_size, "nf4_scale_block_size")
        for name in ("double_quantization", "response_only_loss"):
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


@dataclass(frozen=True)
class PostTrainingResult:
    bundle: ModelBundle
    metrics: tuple[TrainingMetric, ...]
    example_count: int
    objective: str
    fine_tuning_method: str
    base_validation: CausalEvaluation | None = None
    tuned_validation: CausalEvaluation | None = None


def _require_long_enough(sequences, context_size: int) -> None:
    """Every example must give at least one window of context_size + 1 tokens."""
    short = [index for index, row in enumerate(sequences) if len(row) <= context_size]
    if short:
        raise ValueError(
            f"{len(short)} examples encode to <= context_size = {context_size} tokens "
            f"(indices {short[:8]}{'...' if len(short) > 8 else ''}); lower context_size"
        )


def _trainable_with_optimizer(model, config: PostTrainingConfig) -> Adam:
    """Attach LoRA for the adapter methods, then Adam over what trains."""
    if config.fine_tuning_method in ("lora", "qlora"):
        model.attach_lora(config.lora)
        trainable = model.adapter_parameters()
    else:
        trainable = model.parameters()
    with trainable:
        return Adam(trainable, AdamOptions(
            learning_rate=config.learning_rate,
            state_storage=config.resolved_optimizer_state,
            page_size=config.optimizer_page_size,
        ))


def _train_to_the_end(trainer: CausalLanguageModelTrainer, source, config: PostTrainingConfig,
                      tokenizer, metric_sink, on_step, checkpoint_path, checkpoint_interval,
                      nf4: dict | None, metadata: dict) -> tuple:
    """Runs the steps left to ``config.steps`` (all of them, or what a restored checkpoint
    left), writing an exact-resume checkpoint to ``checkpoint_path`` every
    ``checkpoint_interval`` steps and at the end; returns the metrics."""
    model, optimizer = trainer.model, trainer.optimizer
    remaining = config.steps - optimizer.step_count
    if remaining < 0:
        raise ValueError(f"the checkpoint is at step {optimizer.step_count}, past steps = "
                         f"{config.steps}")

    def save_checkpoint() -> None:
        from .checkpoints import save_training_checkpoint

        save_training_checkpoint(checkpoint_path, model, optimizer, tokenizer, source, trainer,
                                 nf4=nf4, metadata=metadata)

    def step_hook(metric: TrainingMetric) -> None:
        if on_step is not None:
            on_step(metric)
        if checkpoint_path is not None and checkpoint_interval and \
                metric.step % checkpoint_interval == 0:
            save_checkpoint()

    metrics = ()
    # With a checkpoint, Ctrl-C stops at the next step boundary and saves it there.
    with DeferredInterrupt(enabled=checkpoint_path is not None) as interrupt:
        if remaining:
            metrics = trainer.run(
                source,
                TrainingLoopConfig(remaining, config.evaluation_interval,
                                   config.loss_average_window),
                (), metric_sink, step_hook, stop_requested=interrupt.stop_requested,
            )
        if checkpoint_path is not None:
            save_checkpoint()
    if interrupt.requested:
        raise TrainingInterrupted(optimizer.step_count, checkpoint_path)
    return metrics


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
) -> PostTrainingResult:
    """Fine-tune a live copy of ``base`` on ``examples``; see the module docstring.

    ``checkpoint_path`` (every ``checkpoint_interval`` steps, and at the end) writes an
    exact-resume ``.riftckpt``; ``resume_from`` (a path or a loaded checkpoint of this base,
    data and config) continues it, ending exactly where the uninterrupted run ends.
    """
    config = PostTrainingConfig() if config is None else config
    if not isinstance(config, PostTrainingConfig):
        raise TypeError(f"config must be a PostTrainingConfig, not {type(config).__name__}")
    if not isinstance(base, ModelBundle):
        raise TypeError(f"base must be a ModelBundle, not {type(base).__name__}")
    if not examples:
        raise ValueError("examples is empty")
    if config.context_size > base.config.maximum_context:
        raise ValueError(
            f"context_size {config.context_size} exceeds the base model's maximum_context "
            f"{base.config.maximum_context}"
        )
    formatter = PlainChatFormatter() if formatter is None else formatter
    backend = resolve_backend(config.backend)
    runtime = base.instantiate(backend, config.attention, config.activation_checkpointing)
    model, tokenizer = runtime.model, runtime.tokenizer
    optimizer = None
    try:
        sequences, masks = encode_examples(
            tokenizer, examples, formatter, config.response_only_loss
        )
        _require_long_enough(sequences, config.context_size)
        validation = None
        if validation_examples:
            validation = encode_examples(tokenizer, validation_examples, formatter,
                                         config.response_only_loss)
        base_validation = (
            evaluate_sequences(model, validation[0], config.context_size, 8, validation[1])
            if validation else None
        )
        method = config.fine_tuning_method
        quantization = None
        nf4 = None
        if method == "qlora":
            nf4 = {"block_size": config.nf4_block_size,
                   "double_quantization": config.double_quantization,
                   "scale_block_size": config.nf4_scale_block_size}
        checkpoint = None
        if resume_from is not None:
            from .checkpoints import TrainingCheckpoint

            checkpoint = (resume_from if isinstance(resume_from, TrainingCheckpoint)
                          else TrainingCheckpoint.load(resume_from))
            if checkpoint.metadata.get("base_artifact_id") != base.artifact_id:
                raise ValueError("the checkpoint was not taken while post-training this base "
                                 f"bundle ({base.artifact_id[:16]})")
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
        source = WindowBatchSource(sequences, config.batch_size, config.context_size,
                                   config.random_seed, config.sampling_strategy, masks)
        trainer = CausalLanguageModelTrainer(model, optimizer)
        if checkpoint is not None:
            checkpoint.restore_source(source)
            checkpoint.restore_trainer(trainer)
        metrics = _train_to_the_end(
            trainer, source, config, tokenizer, metric_sink, on_step, checkpoint_path,
            checkpoint_interval, nf4, {"stage": "post_training",
                                      "base_artifact_id": base.artifact_id})
        optimizer_report = {
            "state_storage": optimizer.state_storage,
            "page_size": optimizer.state_page_size,
            "page_count": optimizer.state_page_count,
            "payload_bytes": optimizer.state_payload_bytes,
        }
        optimizer.close()
        if method in ("lora", "qlora"):
            model.merge_lora()
        tuned_validation = (
            evaluate_sequences(model, validation[0], config.context_size, 8, validation[1])
            if validation else None
        )
        metadata = {
            "objective": config.objective,
            "response_only_loss": config.response_only_loss,
            "example_count": len(sequences),
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
        base_validation, tuned_validation,
    )


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
) -> PretrainedFineTuningResult:
    """Fine-tune a loaded pretrained model (:func:`~.pretrained.load_pretrained`) IN PLACE on
    instruction ``examples`` rendered with the model's own chat template.

    ``config.fine_tuning_method`` ``"full"``, ``"lora"`` or ``"qlora"`` as for
    :func:`post_train` (QLoRA packs every projection to NF4, trains the adapters, and the merge
    dequantizes, so the model is dense float32 again afterwards). ``config.backend`` must be the
    model's; ``attention`` and ``activation_checkpointing`` apply to the model. Save the
    result with :meth:`~.pretrained.PretrainedModel.save`.
    """
    import time as _time

    from .instructions import ChatTemplateFormatter

    config = PostTrainingConfig() if config is None else config
    if not isinstance(config, PostTrainingConfig):
        raise TypeError(f"config must be a PostTrainingConfig, not {type(config).__name__}")
    if not examples:
        raise ValueError("examples is empty")
    model, tokenizer = pretrained.model, pretrained.tokenizer
    pretrained.reset_generator()  # its KV-cache pool pins the parameters
    if model.lora_attached or model.quantized_linear_weights:
        raise ValueError("the model already has adapters or packed weights")
    if config.context_size > model.maximum_context:
        raise ValueError(f"context_size {config.context_size} exceeds the model's maximum_context "
                         f"{model.maximum_context}")
    formatter = ChatTemplateFormatter(pretrained.chat_template)
    sequences, masks = encode_examples(tokenizer, examples, formatter, config.response_only_loss)
    _require_long_enough(sequences, config.context_size)
    validation = (encode_examples(tokenizer, validation_examples, formatter,
                                  config.response_only_loss) if validation_examples else None)
    model.set_full_sequence_attention(config.attention)
    model.set_activation_checkpointing(config.activation_checkpointing)
    base_validation = (evaluate_sequences(model, validation[0], config.context_size, 8,
                                          validation[1]) if validation else None)
    method = config.fine_tuning_method
    if method == "qlora":
        model.quantize_nf4(config.nf4_block_size, config.double_quantization,
                           config.nf4_scale_block_size)
    optimizer = _trainable_with_optimizer(model, config)
    nf4 = ({"block_size": config.nf4_block_size, "double_quantization": config.double_quantization,
            "scale_block_size": config.nf4_scale_block_size} if method == "qlora" else None)
    step_seconds: list[float] = []
    last = [_time.perf_counter()]

    def step_hook(metric: TrainingMetric) -> None:
        now = _time.perf_counter()
        step_seconds.append(now - last[0])
        last[0] = now
        if on_step is not None:
            on_step(metric)

    try:
        source = WindowBatchSource(sequences, config.batch_size, config.context_size,
                                   config.random_seed, config.sampling_strategy, masks)
        trainer = CausalLanguageModelTrainer(model, optimizer)
        if resume_from is not None:
            from .checkpoints import TrainingCheckpoint

            checkpoint = (resume_from if isinstance(resume_from, TrainingCheckpoint)
                          else TrainingCheckpoint.load(resume_from))
            if checkpoint.metadata.get("base_id") != base_id:
                raise ValueError("the checkpoint was not taken while fine-tuning this model "
                                 f"(base_id {checkpoint.metadata.get('base_id')!r}, this one "
                                 f"{base_id!r})")
            checkpoint.restore(model, optimizer, source, trainer)
        last[0] = _time.perf_counter()
        metrics = _train_to_the_end(trainer, source, config, tokenizer, metric_sink, step_hook,
                                    checkpoint_path, checkpoint_interval, nf4,
                                    {"stage": "post_training", "base_id": base_id})
    finally:
        optimizer.close()
    if method in ("lora", "qlora"):
        model.merge_lora()
    pretrained.reset_generator()
    tuned_validation = (evaluate_sequences(model, validation[0], config.context_size, 8,
                                           validation[1]) if validation else None)
    return PretrainedFineTuningResult(tuple(metrics), len(sequences), config.objective, method,
                                      base_validation, tuned_validation, tuple(step_seconds))
