"""The pretraining stage: raw text in, a ``.rift`` bundle of stage ``"pretraining"`` out.

The held-out split is made on the raw text *before* the tokenizer is fitted, so the
tokenizer never sees validation text (docs/ARCHITECTURE.md, 'Training workflows'): with
``pretrain_text``/``pretrain_file`` the last ``ceil(characters · validation_fraction)``
characters are held out; with ``pretrain_splits``/``pretrain_files`` the caller gives both texts
(they must differ).

Large corpora stream: :func:`pretrain_file` reads the file in chunks, fits the tokenizer on
(at most ``tokenizer_training_bytes`` of) the training text, tokenizes each split once into
a memory-mapped :class:`~.batching.TokenFile` and trains from it, so memory stays bounded
whatever the corpus size. Chunks are cut after a newline; for a file smaller than one chunk
the tokens equal those of encoding the whole split at once.

Checkpoints: pass ``checkpoint_path`` (and ``checkpoint_interval``) to write an exact-resume
``.riftckpt`` during training, and ``resume_from`` to continue one: the run then ends
exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import math
import os
import tempfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .artifacts import ModelBundle
from .batching import RandomWindowBatchSource, TokenFile, fixed_batches
from .native import (
    Adam,
    AdamOptions,
    DecoderOnlyTransformer,
    LlamaMistralConfig,
    LlamaMistralTransformer,
    Tokenizer,
    TransformerConfig,
)
from .native._validation import (
    UINT32_LIMIT,
    require_choice,
    require_int,
    require_positive_float,
)
from .native.backends import BACKEND_NAMES, BACKEND_VALUES, backend_value
from .native.llama import ARCHITECTURE_VALUES
from .training import (
    CausalLanguageModelTrainer,
    DeferredInterrupt,
    TrainingInterrupted,
    TrainingLoopConfig,
    TrainingMetric,
)

# The architectures a model can be pretrained as: the GPT decoder, or a rotary family's preset.
# "gpt2" is the GPT decoder (DecoderOnlyTransformer), not the general decoder's gpt2 preset.
ARCHITECTURES = ("gpt2", *(name for name in ARCHITECTURE_VALUES if name != "gpt2"))
# Families whose structure includes a sliding window: pretrained with half the context.
_WINDOWED_FAMILIES = ("mistral", "gemma2", "gemma3", "phi3")
# Families whose checkpoints tie the head to the token embedding.
_TIED_FAMILIES = ("gemma2", "gemma3")

CHUNK_BYTES = 4 << 20


def _positive(value, name: str) -> int:
    return require_int(value, name, 1, 1 << 63)


def _one_of(value, name: str, choices: tuple[str, ...]) -> str:
    require_choice(value, name, dict.fromkeys(choices))
    return value


@dataclass(frozen=True)
class PretrainingConfig:
    """Every knob of the pretraining stage; validated at construction (TypeError for a wrong
    type, bools included; ValueError for a bad value). The defaults keep the earlier Python
    API's values (docs/ARCHITECTURE.md, 'Training workflows')."""

    steps: int = 100
    context_size: int = 32
    batch_size: int = 4
    validation_fraction: float = 0.1
    validation_batch_count: int = 4
    evaluation_interval: int = 10
    loss_average_window: int = 10
    tokenizer_method: str = "bpe"
    vocabulary_size: int = 272
    minimum_pair_frequency: int = 2
    model_width: int = 16
    head_count: int = 4
    block_count: int = 1
    feed_forward_width: int = 32
    learning_rate: float = 1e-2
    random_seed: int = 7
    validation_random_seed: int = 17
    backend: str = "auto"
    attention: str = "materialized"
    activation_checkpointing: str = "disabled"
    optimizer_state: str = "contiguous"
    optimizer_page_size: int = 4096
    tokenizer_training_bytes: int = 16 << 20
    # "gpt2" (docs/ARCHITECTURE.md, 'The decoder'), or a rotary family preset ("llama",
    # "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3") with the same width, heads,
    # blocks and feed-forward width (Mistral, Gemma 2, Gemma 3 and Phi-3 with a window of half
    # the context).
    architecture: str = "gpt2"

    def __post_init__(self) -> None:
        for name in ("steps", "context_size", "batch_size", "validation_batch_count",
                     "evaluation_interval", "loss_average_window", "minimum_pair_frequency",
                     "model_width", "head_count", "block_count", "feed_forward_width",
                     "optimizer_page_size", "tokenizer_training_bytes"):
            _positive(getattr(self, name), name)
        require_int(self.vocabulary_size, "vocabulary_size", 256, UINT32_LIMIT)
        require_int(self.random_seed, "random_seed", 0, UINT32_LIMIT)
        require_int(self.validation_random_seed, "validation_random_seed", 0, 1 << 63)
        fraction = self.validation_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise TypeError("validation_fraction must be a number")
        if not (math.isfinite(fraction) and 0 < fraction < 1):
            raise ValueError(f"validation_fraction must be in (0, 1), got {fraction!r}")
        require_positive_float(self.learning_rate, "learning_rate")
        _one_of(self.tokenizer_method, "tokenizer_method", ("byte", "bpe"))
        require_backend_name(self.backend)
        _one_of(self.attention, "attention", ("materialized", "flash"))
        _one_of(self.activation_checkpointing, "activation_checkpointing", ("disabled", "block"))
        _one_of(self.optimizer_state, "optimizer_state", ("contiguous", "paged"))
        _one_of(self.architecture, "architecture", ARCHITECTURES)
        if self.model_width % self.head_count:
            raise ValueError(
                f"head_count {self.head_count} must divide model_width {self.model_width}"
            )


@dataclass(frozen=True)
class PretrainingResult:
    bundle: ModelBundle
    metrics: tuple[TrainingMetric, ...]
    training_token_count: int
    validation_token_count: int


def require_backend_name(name: object) -> str:
    """``name`` if it names a backend or is ``"auto"`` (TypeError/ValueError otherwise);
    availability is checked when the stage runs."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str, not {type(name).__name__}")
    if name.strip().lower() not in (*BACKEND_VALUES, "auto"):
        raise ValueError(f"backend must be one of {(*BACKEND_VALUES, 'auto')}, got {name!r}")
    return name


def resolve_backend(name: str) -> str:
    """``"auto"`` as the first available backend (tpu, cuda, metal, cpu; never pjrt); others
    unchanged."""
    return BACKEND_NAMES[backend_value(name, allow_auto=True)]


# ---- text handling --------------------------------------------------------------------------


def _split_text(text: str, fraction: float) -> tuple[str, str]:
    if len(text) < 2:
        raise ValueError("the text must have at least 2 characters to hold out validation text")
    held_out = max(1, math.ceil(len(text) * fraction))
    if held_out >= len(text):
        raise ValueError("validation_fraction leaves no training text")
    return text[:-held_out], text[-held_out:]


def _fit_tokenizer(sample: bytes, config: PretrainingConfig) -> Tokenizer:
    if config.tokenizer_method == "byte":
        return Tokenizer(sample, method="byte")
    return Tokenizer(
        sample,
        method="bpe",
        vocabulary_size=config.vocabulary_size,
        minimum_pair_frequency=config.minimum_pair_frequency,
    )


def _encode(tokenizer: Tokenizer, data: bytes, split: str) -> array:
    try:
        return tokenizer.encode_to_array(data)
    except Exception as error:
        if tokenizer.method == "byte":
            raise ValueError(
                f"the {split} text has a byte the byte tokenizer never saw in the training "
                "text; use tokenizer_method='bpe' (it encodes every byte)"
            ) from error
        raise


# ---- entry points ---------------------------------------------------------------------------


def pretrain_text(
    text: str, config: PretrainingConfig | None = None, **options
) -> PretrainingResult:
    """Pretrain on one text; its last ``validation_fraction`` of characters is held out."""
    config = _config(config)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    train, validation = _split_text(text, config.validation_fraction)
    return _pretrain_texts(train, validation, config, "derived_fraction", options)


def pretrain_splits(train_text: str, validation_text: str, config: PretrainingConfig | None = None,
                    **options) -> PretrainingResult:
    """Pretrain on ``train_text``, validating on the explicit ``validation_text``."""
    config = _config(config)
    for name, value in (("train_text", train_text), ("validation_text", validation_text)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        if not value:
            raise ValueError(f"{name} is empty")
    if (hashlib.sha256(train_text.encode()).digest()
            == hashlib.sha256(validation_text.encode()).digest()):
        raise ValueError(
            "train_text and validation_text are identical: validation would not be held out"
        )
    return _pretrain_texts(train_text, validation_text, config, "explicit", options)


def pretrain_file(path, config: PretrainingConfig | None = None, validation_path=None,
                  **options) -> PretrainingResult:
    """Pretrain on a UTF-8 file, streaming (see the module docstring). With
    ``validation_path`` the held-out text is that file instead of the tail."""
    config = _config(config)
    source = Path(path)
    if validation_path is not None:
        held_out = Path(validation_path)
        if source.resolve() == held_out.resolve() or (
            source.exists() and held_out.exists() and os.path.samefile(source, held_out)
        ):
            raise ValueError("path and validation_path are the same file")
        train_scan, validation_scan = _scan(source), _scan(held_out)
        if train_scan.sha256 == validation_scan.sha256:
            raise ValueError("the training and validation files have identical content")
        train_range = (source, 0, train_scan.size)
        validation_range = (held_out, 0, validation_scan.size)
        validation_source = "explicit"
    else:
        scan = _scan(source)
        split = _split_offset(source, scan, config.validation_fraction)
        train_range = (source, 0, split)
        validation_range = (source, split, scan.size)
        validation_source = "derived_fraction"
    return _pretrain_ranges(train_range, validation_range, config, validation_source, options)


pretrain_files = pretrain_file


def _config(config) -> PretrainingConfig:
    if config is None:
        return PretrainingConfig()
    if not isinstance(config, PretrainingConfig):
        raise TypeError(f"config must be a PretrainingConfig, not {type(config).__name__}")
    return config


@dataclass(frozen=True)
class _FileScan:
    """What one streaming pass over a text file learns: its size, the UTF-8 characters of
    each CHUNK_BYTES chunk, and its SHA-256."""

    size: int
    chunk_characters: tuple[int, ...]
    sha256: str


_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))


def _characters(data: bytes) -> int:
    """UTF-8 characters in ``data``: the bytes that are not continuation bytes (one C pass)."""
    return len(data.translate(None, _CONTINUATION_BYTES))


def _scan(path: Path) -> _FileScan:
    """One pass over ``path``: ValueError unless it is UTF-8 with at least 2 characters."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    digest = hashlib.sha256()
    counts = []
    offset = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK_BYTES):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}: not UTF-8 at byte {offset + error.start}") from None
            counts.append(_characters(chunk))
            digest.update(chunk)
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ValueError(f"{path}: ends inside a UTF-8 sequence") from None
    if sum(counts) < 2:
        raise ValueError(f"{path}: needs at least 2 characters")
    return _FileScan(offset, tuple(counts), digest.hexdigest())


def _split_offset(path: Path, scan: _FileScan, fraction: float) -> int:
    """The byte offset where the last ceil(characters · fraction) characters start (reads
    only the chunk that holds it)."""
    total = sum(scan.chunk_characters)
    held_out = max(1, math.ceil(total * fraction))
    if held_out >= total:
        raise ValueError("validation_fraction leaves no training text")
    need = total - held_out  # characters before the split
    index = 0
    # index is read after the loop (the chunk where the split falls), which B007 misses.
    for index, count in enumerate(scan.chunk_characters):  # noqa: B007
        if need < count:
            break
        need -= count
    with open(path, "rb") as stream:
        stream.seek(index * CHUNK_BYTES)
        chunk = stream.read(CHUNK_BYTES)
    for position, byte in enumerate(chunk):
        if not 0x80 <= byte < 0xC0:
            if need == 0:
                return index * CHUNK_BYTES + position
            need -= 1
    raise ValueError(f"{path}: the file changed while it was being read")


def _read_range(path: Path, begin: int, end: int, cut_at_newline: bool = False):
    """The bytes of [begin, end) in pieces of about CHUNK_BYTES; with ``cut_at_newline`` each
    piece but the last ends right after a newline when it holds one (the rest carries over)."""
    with open(path, "rb") as stream:
        stream.seek(begin)
        remaining = end - begin
        carry = b""
        while remaining > 0:
            piece = stream.read(min(CHUNK_BYTES, remaining))
            if not piece:
                raise ValueError(f"{path}: the file shrank while it was being read")
            remaining -= len(piece)
            data, carry = carry + piece, b""
            if remaining > 0 and cut_at_newline:
                cut = data.rfind(b"\n") + 1
                if cut > 0:
                    data, carry = data[:cut], data[cut:]
            yield data


def _sample(path: Path, begin: int, end: int, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of [begin, end), cut after a newline."""
    with open(path, "rb") as stream:
        stream.seek(begin)
        data = stream.read(min(limit, end - begin))
    if end - begin > limit:
        cut = data.rfind(b"\n") + 1
        if cut > 0:
            data = data[:cut]
    return data


def _pretrain_texts(train: str, validation: str, config, validation_source: str, options):
    train_bytes, validation_bytes = train.encode("utf-8"), validation.encode("utf-8")
    sample = train_bytes[: config.tokenizer_training_bytes]
    tokenizer = _fit_tokenizer(sample, config)
    train_tokens = _encode(tokenizer, train_bytes, "training")
    validation_tokens = _encode(tokenizer, validation_bytes, "validation")
    facts = {
        "training_text_sha256": hashlib.sha256(train_bytes).hexdigest(),
        "validation_text_sha256": hashlib.sha256(validation_bytes).hexdigest(),
        "tokenizer_fit_bytes": len(sample),
        "tokenizer_fit_scope": (
            "training_text" if len(sample) == len(train_bytes) else "training_text_prefix"
        ),
    }
    return _train(tokenizer, train_tokens, validation_tokens, config, validation_source, facts,
                  options)


def _pretrain_ranges(train_range, validation_range, config, validation_source: str, options):
    sample = _sample(*train_range, config.tokenizer_training_bytes)
    tokenizer = _fit_tokenizer(sample, config)
    work = options.pop("work_directory", None)
    with tempfile.TemporaryDirectory(prefix="riftco-tokens-", dir=work) as directory:
        files, digests = [], []
        try:
            ranges = (("training", train_range), ("validation", validation_range))
            for name, (path, begin, end) in ranges:
                token_path = Path(directory) / f"{name}.tokens"
                digest = hashlib.sha256()  # of the text, in the same pass that tokenizes it

                def pieces(path=path, begin=begin, end=end, digest=digest):
                    for piece in _read_range(path, begin, end, True):
                        digest.update(piece)
                        yield piece

                TokenFile.write(token_path, (_encode(tokenizer, piece, name) for piece in pieces()))
                files.append(TokenFile.open(token_path))
                digests.append(digest.hexdigest())
            facts = {
                "training_text_sha256": digests[0],
                "validation_text_sha256": digests[1],
                "tokenizer_fit_bytes": len(sample),
                "tokenizer_fit_scope": "training_text"
                if len(sample) == train_range[2] - train_range[1]
                else "training_text_prefix",
            }
            return _train(tokenizer, files[0], files[1], config, validation_source, facts, options)
        finally:
            for token_file in files:
                token_file.close()


def _require_same_run_on_every_rank(data_parallel, config, *data, facts=None) -> None:
    """Every rank must train the same ``config`` (a dataclass with ``batch_size``, the global
    batch) on the same ``data`` (token sequences, TokenFiles or bytes, in order) and agree on
    ``facts`` (JSON: whatever else the run depends on, e.g. the base model or the checkpoint it
    resumes). A hash of them all is compared across ranks: ValueError on every rank naming the
    first rank that differs. Then the global batch must split evenly over the ranks (ValueError
    on every rank otherwise). The stages call this before their first step."""
    import json

    digest = hashlib.sha256(
        json.dumps([dataclasses.asdict(config), facts], sort_keys=True).encode()
    )
    for tokens in data:
        digest.update(len(tokens).to_bytes(8, "little"))
        if isinstance(tokens, TokenFile):  # its header holds the SHA-256 of every token
            digest.update(tokens.token_sha256)
        else:
            digest.update(tokens if isinstance(tokens, (array, bytes)) else array("I", tokens))
    mine = int.from_bytes(digest.digest()[:8], "little")
    hashes = data_parallel.group.allgather(mine)
    for rank, value in enumerate(hashes):
        if value != hashes[0]:
            raise ValueError(f"data parallel: rank {rank} runs a different configuration or data "
                             f"than rank 0 (every rank must get the same flags and files)")
    try:
        data_parallel.shard(config.batch_size)
    except ValueError:
        ranks = data_parallel.world_size
        raise ValueError(f"data parallel: the global batch of {config.batch_size} rows "
                         f"(batch_size, --batch-size) does not split evenly over {ranks} ranks; "
                         f"use a multiple of {ranks}") from None


def _new_model(tokenizer: Tokenizer, config: PretrainingConfig):
    """The model to pretrain: the GPT decoder, or the rotary family's preset of the same size."""
    # The sizes both decoders take under the same names.
    sizes = dict(
        vocabulary_size=tokenizer.vocab_size,
        maximum_context=config.context_size,
        model_width=config.model_width,
        block_count=config.block_count,
        feed_forward_width=config.feed_forward_width,
        random_seed=config.random_seed,
    )
    if config.architecture == "gpt2":
        return DecoderOnlyTransformer(
            TransformerConfig(head_count=config.head_count, **sizes),
            config.attention,
            config.activation_checkpointing,
        )
    window = (max(1, config.context_size // 2) if config.architecture in _WINDOWED_FAMILIES
              else None)
    family = LlamaMistralConfig.preset(
        config.architecture,
        query_head_count=config.head_count,
        key_value_head_count=config.head_count,
        sliding_window=window,
        tie_embeddings=config.architecture in _TIED_FAMILIES,
        **sizes,
    )
    return LlamaMistralTransformer(family, config.attention, config.activation_checkpointing)


def _config_record(config: PretrainingConfig) -> dict:
    """The config for a bundle's metadata; the architecture only when it is not the default,
    so a GPT run's bundle (and its artifact id) is what it always was."""
    record = dataclasses.asdict(config)
    if record["architecture"] == "gpt2":
        del record["architecture"]
    return record


def _train(tokenizer, train_tokens, validation_tokens, config: PretrainingConfig,
           validation_source: str, facts: dict, options: dict) -> PretrainingResult:
    metric_sink: Callable | None = options.pop("metric_sink", None)
    on_step: Callable | None = options.pop("on_step", None)
    checkpoint_path = options.pop("checkpoint_path", None)
    checkpoint_interval = options.pop("checkpoint_interval", None)
    resume_from = options.pop("resume_from", None)
    data_parallel = options.pop("data_parallel", None)
    if options:
        raise TypeError(f"unexpected options {sorted(options)}")
    if data_parallel is not None:
        _require_same_run_on_every_rank(data_parallel, config, train_tokens, validation_tokens)
    for name, tokens in (("training", train_tokens), ("validation", validation_tokens)):
        if len(tokens) < config.context_size + 1:
            raise ValueError(
                f"the {name} split encodes to {len(tokens)} tokens; it needs at least "
                f"context_size + 1 = {config.context_size + 1}"
            )
    backend = resolve_backend(config.backend)
    source = RandomWindowBatchSource(train_tokens, config.batch_size, config.context_size,
                                     config.random_seed)
    validation_batches = fixed_batches(
        RandomWindowBatchSource(validation_tokens, config.batch_size, config.context_size,
                                config.validation_random_seed),
        config.validation_batch_count,
    )
    from .checkpoints import TrainingCheckpoint, save_training_checkpoint

    if resume_from is not None:
        checkpoint = (resume_from if isinstance(resume_from, TrainingCheckpoint)
                      else TrainingCheckpoint.load(resume_from))
        resumed = checkpoint.resume(backend, config.attention, config.activation_checkpointing,
                                    config.optimizer_state)
        model, optimizer = resumed.model, resumed.optimizer
        if resumed.tokenizer is not None and resumed.tokenizer.state() != tokenizer.state():
            resumed.close()
            raise ValueError("the checkpoint's tokenizer differs from the one fitted on this data")
        checkpoint.restore_source(source)
    else:
        model = _new_model(tokenizer, config).to(backend)
        with model.parameters() as parameters:
            optimizer = Adam(parameters, AdamOptions(
                learning_rate=config.learning_rate, state_storage=config.optimizer_state,
                page_size=config.optimizer_page_size))
    try:
        trainer = CausalLanguageModelTrainer(model, optimizer, data_parallel=data_parallel)
        optimizer = trainer.optimizer  # sharded over the ranks under ZeRO-1
        if resume_from is not None:
            checkpoint.restore_trainer(trainer)

        def save_checkpoint() -> None:
            # Under data parallelism rank 0 writes (the replicas and the global batch position
            # are the same everywhere) while the others wait for the file to be complete.
            def write() -> None:
                save_training_checkpoint(checkpoint_path, model, optimizer, tokenizer, source,
                                         trainer)
            if data_parallel is None:
                write()
            else:
                data_parallel.write_on_rank_zero(write, optimizer)
        done = optimizer.step_count
        remaining = config.steps - done
        if remaining < 0:
            raise ValueError(f"the checkpoint is at step {done}, past steps = {config.steps}")

        def step_hook(metric: TrainingMetric) -> None:
            if on_step is not None:
                on_step(metric)
            if (checkpoint_path is not None and checkpoint_interval
                    and metric.step % checkpoint_interval == 0):
                save_checkpoint()

        metrics = ()
        # With a checkpoint, Ctrl-C stops at the next step boundary and saves it there. Under
        # data parallelism the ranks must stop together, so the signal is left as it is.
        with DeferredInterrupt(enabled=checkpoint_path is not None
                               and data_parallel is None) as interrupt:
            if remaining:
                metrics = trainer.run(
                    source,
                    TrainingLoopConfig(remaining, config.evaluation_interval,
                                       config.loss_average_window),
                    validation_batches,
                    metric_sink,
                    step_hook,
                    evaluate_first=resume_from is None,
                    stop_requested=interrupt.stop_requested,
                )
            if checkpoint_path is not None:
                save_checkpoint()
        if interrupt.requested:
            raise TrainingInterrupted(optimizer.step_count, checkpoint_path,
                                      interrupt.signal_number)
        optimizer.close()
        metadata = {
            "objective": "next_token_prediction",
            "training_token_count": len(train_tokens),
            "validation_token_count": len(validation_tokens),
            "validation_source": validation_source,
            "validation_fraction": (
                config.validation_fraction if validation_source == "derived_fraction" else None
            ),
            "config": _config_record(config),
            "backend": backend,
            "optimizer": "adam",
            "optimizer_state_included": False,
            "steps_completed": config.steps,
            **facts,
        }
        if metrics:
            final = [m for m in metrics if m.phase == "validation"]
            if final:
                metadata["final_validation_loss"] = final[-1].loss
        if model.backend != "cpu":
            model.to("cpu")
        bundle = ModelBundle.capture(model, tokenizer, "pretraining", None, metadata)
    finally:
        if not optimizer.closed:
            optimizer.close()
        model.close()
    return PretrainingResult(bundle, tuple(metrics), len(train_tokens), len(validation_tokens))
