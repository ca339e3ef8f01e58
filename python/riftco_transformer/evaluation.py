"""Honest held-out evaluation: exhaustive chunked scoring and generalization gaps
(docs/ARCHITECTURE.md, 'Evaluation').

:func:`evaluate_sequences` scores every target of every sequence exactly once. A sequence of
``n >= 2`` tokens has the ``n - 1`` targets ``tokens[1:]``; it is cut into chunks of at most
``context_size`` targets, and each chunk's input starts at the previous chunk's last target,
so the chunks' target sets are disjoint and cover everything. Positions restart at 0 in each
chunk (the model's context is at most ``context_size``). Chunks of equal width are batched
together in a fixed order; the mean loss is weighted by target count, i.e. it is the mean
over all scored targets. Nothing is trained and no gradient is kept.

Reported figures: ``loss`` (nats per target token), ``perplexity = e^loss``, and, across
splits, the gaps ``G_val = L_val - L_train`` and ``G_test = L_test - L_train`` (the training
loss measured with this same evaluator, never the last minibatch) and the change against a
base model ``ΔL = L_tuned - L_base`` (negative is better).
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from .native import cross_entropy
from .native._validation import require_int
from .training import perplexity


@dataclass(frozen=True)
class CausalEvaluation:
    """The result of one exhaustive evaluation."""

    example_count: int
    usable_example_count: int
    skipped_example_count: int
    target_token_count: int
    chunk_count: int
    forward_batch_count: int
    loss: float
    perplexity: float
    elapsed_seconds: float


def _chunks(sequence, context: int, mask=None):
    """(inputs, targets, mask-or-None) chunks covering every target of ``sequence`` once."""
    start = 0
    last = len(sequence) - 1
    while start < last:
        width = min(context, last - start)
        inputs = array("I", sequence[start : start + width])
        targets = array("I", sequence[start + 1 : start + width + 1])
        piece = None if mask is None else bytes(mask[start + 1 : start + width + 1])
        yield inputs, targets, piece
        start += width


def evaluate_sequences(
    model,
    sequences: Sequence,
    context_size: int | None = None,
    batch_size: int = 8,
    masks: Sequence | None = None,
) -> CausalEvaluation:
    """Score every target of ``sequences`` (token-id rows) once; see the module docstring.

    ``context_size`` defaults to the model's maximum context (larger: ValueError).
    ``masks`` (one bytes-like per sequence) restricts scoring to targets marked 1, as a
    response-only objective does; chunks with no marked target are skipped. Sequences with
    fewer than 2 tokens (or no marked target) are counted as skipped; none usable is a
    ValueError.
    """
    maximum = model.config.maximum_context
    context = (maximum if context_size is None
               else require_int(context_size, "context_size", 1, 1 << 63))
    if context > maximum:
        raise ValueError(f"context_size {context} exceeds the model's maximum_context {maximum}")
    batch_size = require_int(batch_size, "batch_size", 1, 1 << 63)
    if masks is not None and len(masks) != len(sequences):
        raise ValueError(f"masks has {len(masks)} rows for {len(sequences)} sequences")
    started = time.perf_counter()
    by_width: dict[int, list] = {}
    usable = skipped = chunk_count = 0
    for index, sequence in enumerate(sequences):
        mask = None if masks is None else masks[index]
        pieces = [
            piece
            for piece in _chunks(sequence, context, mask)
            if piece[2] is None or any(piece[2])
        ]
        if not pieces:
            skipped += 1
            continue
        usable += 1
        chunk_count += len(pieces)
        for piece in pieces:
            by_width.setdefault(len(piece[0]), []).append(piece)
    if not usable:
        raise ValueError("no sequence has a target to score (each needs at least 2 tokens)")
    total_loss = 0.0
    total_targets = 0
    batches = 0
    for width in sorted(by_width, reverse=True):
        pieces = by_width[width]
        for begin in range(0, len(pieces), batch_size):
            group = pieces[begin : begin + batch_size]
            logits = model([piece[0] for piece in group])
            if masks is None:
                loss = cross_entropy(logits, [piece[1] for piece in group])
                counted = width * len(group)
            else:
                from .native.autograd import cross_entropy_masked

                loss = cross_entropy_masked(
                    logits, [piece[1] for piece in group], [piece[2] for piece in group]
                )
                counted = sum(sum(1 for flag in piece[2] if flag) for piece in group)
            total_loss += loss.item() * counted
            total_targets += counted
            batches += 1
            loss.close()
            logits.close()
    mean = total_loss / total_targets
    return CausalEvaluation(
        example_count=len(sequences),
        usable_example_count=usable,
        skipped_example_count=skipped,
        target_token_count=total_targets,
        chunk_count=chunk_count,
        forward_batch_count=batches,
        loss=mean,
        perplexity=perplexity(mean),
        elapsed_seconds=time.perf_counter() - started,
    )


def evaluate_text(
    model, tokenizer, text, context_size=None, batch_size: int = 8
) -> CausalEvaluation:
    """:func:`evaluate_sequences` of one text (str or bytes), encoded with ``tokenizer``."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return evaluate_sequences(model, [tokenizer.encode_to_array(data)], context_size, batch_size)


def evaluate_instruction_examples(
    model,
    tokenizer,
    examples: Sequence,
    context_size: int | None = None,
    batch_size: int = 1,
    formatter=None,
    response_only: bool = False,
) -> CausalEvaluation:
    """Score formatted instruction examples (every token, or the responses only)."""
    from .instructions import PlainChatFormatter

    formatter = PlainChatFormatter() if formatter is None else formatter
    sequences, masks = encode_examples(tokenizer, examples, formatter, response_only)
    return evaluate_sequences(model, sequences, context_size, batch_size, masks)


def encode_examples(tokenizer, examples: Sequence, formatter, response_only: bool):
    """Each example's formatted token ids, and (when ``response_only``) a mask marking the
    tokens that belong to assistant text. Segments are encoded separately so that no token
    straddles a prompt/response boundary."""
    sequences = []
    masks = [] if response_only else None
    for example in examples:
        if response_only:
            ids = array("I")
            mask = bytearray()
            for text, is_response in formatter.segments(example):
                piece = tokenizer.encode_to_array(text.encode("utf-8"))
                ids.extend(piece)
                mask.extend(b"\x01" * len(piece) if is_response else bytes(len(piece)))
            sequences.append(ids)
            masks.append(bytes(mask))
        else:
            sequences.append(tokenizer.encode_to_array(formatter.format(example).encode("utf-8")))
    return sequences, masks


@dataclass(frozen=True)
class GeneralizationReport:
    """Losses on each split and the gaps between them (None where a split was not scored)."""

    train_loss: float
    validation_loss: float
    test_loss: float | None = None

    @property
    def validation_gap(self) -> float:
        """``G_val = L_val - L_train``."""
        return self.validation_loss - self.train_loss

    @property
    def test_gap(self) -> float | None:
        """``G_test = L_test - L_train``."""
        return None if self.test_loss is None else self.test_loss - self.train_loss

    def as_dict(self) -> dict:
        return {
            "train_loss": self.train_loss,
            "validation_loss": self.validation_loss,
            "test_loss": self.test_loss,
            "validation_gap": self.validation_gap,
            "test_gap": self.test_gap,
            "train_perplexity": perplexity(self.train_loss),
            "validation_perplexity": perplexity(self.validation_loss),
            "test_perplexity": None if self.test_loss is None else perplexity(self.test_loss),
        }


def loss_delta(base_loss: float, tuned_loss: float) -> float:
    """``ΔL = L_tuned - L_base`` (negative: the tuned model is better)."""
    if not (math.isfinite(base_loss) and math.isfinite(tuned_loss)):
        raise ValueError("losses must be finite")
    return tuned_loss - base_loss


class HeldOutProtocol:
    """Train/validation/test discipline for token sequences.

    Score train and validation as often as you like (:meth:`score_train`,
    :meth:`score_validation`); the test split is scored once, by :meth:`score_test`, after
    which it is consumed (a second call is a RuntimeError), so no choice is ever tuned on it.
    The splits must be disjoint as token sequences (ValueError otherwise).
    """

    def __init__(self, train: Sequence, validation: Sequence, test: Sequence | None = None,
                 context_size: int | None = None, batch_size: int = 8) -> None:
        for name, split in (("train", train), ("validation", validation)):
            if not split:
                raise ValueError(f"the {name} split is empty")
        keys = {name: {bytes(array("I", row)) for row in split}
                for name, split in (("train", train), ("validation", validation),
                                    ("test", test or ()))}
        for first, second in (("train", "validation"), ("train", "test"), ("validation", "test")):
            shared = keys[first] & keys[second]
            if shared:
                raise ValueError(f"the {first} and {second} splits share {len(shared)} sequences")
        self._splits = {"train": train, "validation": validation, "test": test}
        self._context_size = context_size
        self._batch_size = batch_size
        self.test_consumed = False

    def _score(self, model, name: str) -> CausalEvaluation:
        return evaluate_sequences(model, self._splits[name], self._context_size, self._batch_size)

    def score_train(self, model) -> CausalEvaluation:
        return self._score(model, "train")

    def score_validation(self, model) -> CausalEvaluation:
        return self._score(model, "validation")

    def score_test(self, model) -> CausalEvaluation:
        if self._splits["test"] is None:
            raise ValueError("this protocol has no test split")
        if self.test_consumed:
            raise RuntimeError("the test split was already scored once; it is consumed")
        self.test_consumed = True
        return self._score(model, "test")

    def report(self, model, include_test: bool = False) -> GeneralizationReport:
        train = self.score_train(model).loss
        validation = self.score_validation(model).loss
        test = self.score_test(model).loss if include_test else None
        return GeneralizationReport(train, validation, test)
