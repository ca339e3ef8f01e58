"""Text generation: configuration, the per-request generator sequence, and TextGenerator.

*Exact generator sequence* (docs/ARCHITECTURE.md, 'Context rollover'), shared by
:class:`TextGenerator` and the scheduler through :class:`GenerationProgress`: feed (prefill) the
last C = maximum_context tokens of the prompt; then for each of the N = max_new_tokens new tokens,
sample from the current logits and append; if more tokens remain, either the stream is full (it
holds C tokens), so reset it and replay the newest C tokens from position 0 (learned absolute
positions forbid evicting old pages), or feed the new token. The final sampled token is
never fed. A stream therefore never holds more than ``min(C, min(P, C) + N - 1)`` tokens,
the request's *token budget*.

Generation ends after N tokens (``finish_reason="length"``), when the text contains a stop
sequence (``"stop"``: the text is cut where the stop starts), or when the end token is
sampled (``"end_token"``: its bytes are not part of the text). Token ids always list every
sampled token, the stop's and the end token included.

*Log-probabilities* (``GenerationConfig.logprobs``): each generated token's log-probability
under the model's raw distribution, the log-softmax of the logits of the position that
predicted it (before penalties, temperature and truncation, as OpenAI reports them; over the
tokenizer's ids, the ones sampling draws from), and its ``logprobs`` most likely
alternatives. They are computed from the logits row the sampler reads, at the moment of
sampling, and only when asked. ``prompt_logprobs`` scores the prompt too: the prompt is then
fed one token per step, so that the logits of every prompt position are in hand (it costs a
step per prompt token instead of one prefill), and the first prompt token has none.

*Constrained decoding* (``GenerationConfig.grammar``, a
:class:`~.structured_output.Grammar`: OpenAI's ``response_format`` and required tool calls):
each generation follows the grammar with its own :class:`~.structured_output.Matcher`
(:class:`GrammarVocabulary` makes them, indexing the tokenizer's vocabulary once). Before each
sample, the matcher's mask rules out every token the grammar cannot take (the sampler's
``mask=``; a sampler without one samples from :func:`~.sampling.apply_mask`'s row), then the
sampled token advances the matcher; an end token is allowed only where the text is a complete
match. Once the text is complete and nothing can follow, generation ends with ``"stop"``
without sampling an end token. Log-probabilities stay those of the model's raw distribution
(the unmasked row): a masked token may well be listed among the alternatives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..native._validation import UINT32_LIMIT, require_int, require_real
from ._logprobs import log_probabilities
from ._text import IncrementalText, TokenBytes, lenient_utf8, require_stop_sequences
from .engine import make_engine
from .sampling import (
    Greedy,
    Sampler,
    TemperatureSampler,
    apply_mask,
    require_min_p,
    require_occurrence_penalty,
    require_repetition_penalty,
    require_seed,
    require_top_k,
    require_top_p,
)
from .structured_output import Grammar, Matcher, TokenVocabulary

FINISH_REASONS = ("length", "stop", "end_token")
MAXIMUM_TOP_LOGPROBS = 20  # the most alternatives a token's log-probability lists (OpenAI's)


def choice_seed(seed: int, index: int) -> int:
    """The sampler seed of choice ``index`` of a request seeded ``seed`` (``n`` choices are
    ``n`` requests over one prompt): choice 0 keeps ``seed`` itself (so it samples what the
    request would alone), choice ``i > 0`` gets the first 8 bytes (big-endian) of the
    BLAKE2b digest of ``"{seed}:{i}"``, a seed in [0, 2**64) that the same request always
    derives again."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode("ascii"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class GenerationConfig:
    """How one request generates.

    ``max_new_tokens`` (int >= 0) tokens at most. ``temperature`` 0 (the default) is greedy
    decoding, which takes neither ``top_k`` nor ``top_p`` (ValueError); a temperature > 0
    samples (see :class:`~.sampling.TemperatureSampler`) with ``seed``.
    ``repetition_penalty`` (> 0, 1 = off), ``presence_penalty`` and ``frequency_penalty``
    (in [-2, 2], 0 = off; they count the generated tokens) apply to both; ``min_p`` (in
    [0, 1], None or 0 = off) only samples (with temperature 0 it is a ValueError, like
    ``top_k``). ``stop`` is a str or a sequence of nonempty str; ``end_token_id`` (None: none)
    and every id of ``end_token_ids`` end generation when sampled.

    ``logprobs`` (None: off; an int in [0, ``MAXIMUM_TOP_LOGPROBS``]) reports each generated
    token's log-probability with that many most likely alternatives (see the module
    docstring); ``prompt_logprobs`` (which needs ``logprobs``) scores the prompt's tokens
    too, and needs the prompt to fit the context (checked by the generator).

    ``grammar`` (None: none) constrains the generated text to a
    :class:`~.structured_output.Grammar` (see the module docstring); generators build each
    request's matcher from it.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    end_token_id: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float | None = None
    end_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    prompt_logprobs: bool = False
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        set_field = _field_setter(self)
        set_field("max_new_tokens", require_int(self.max_new_tokens, "max_new_tokens", 0,
                                                UINT32_LIMIT))
        temperature = require_real(self.temperature, "temperature")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature!r}")
        set_field("temperature", temperature)
        if self.top_k is not None:
            set_field("top_k", require_top_k(self.top_k))
        if self.top_p is not None:
            set_field("top_p", require_top_p(self.top_p))
        if self.min_p is not None:
            set_field("min_p", require_min_p(self.min_p))
        if temperature == 0 and (self.top_k is not None or self.top_p is not None
                                 or self.min_p):
            given = next(name for name in ("top_k", "top_p", "min_p")
                         if getattr(self, name) is not None)
            raise ValueError(
                f"temperature 0 is greedy decoding, which takes no {given} (got "
                f"{given}={getattr(self, given)!r}); set temperature > 0 to sample"
            )
        set_field("repetition_penalty", require_repetition_penalty(self.repetition_penalty))
        for name in ("presence_penalty", "frequency_penalty"):
            set_field(name, require_occurrence_penalty(getattr(self, name), name))
        set_field("seed", require_seed(self.seed))
        set_field("stop", require_stop_sequences(self.stop))
        if self.end_token_id is not None:
            set_field("end_token_id", require_int(self.end_token_id, "end_token_id", 0,
                                                  UINT32_LIMIT))
        if isinstance(self.end_token_ids, (str, bytes)) or not isinstance(
                self.end_token_ids, Sequence):
            raise TypeError(f"end_token_ids must be a sequence of ids, not "
                            f"{type(self.end_token_ids).__name__}")
        set_field("end_token_ids", tuple(
            require_int(token, f"end_token_ids[{index}]", 0, UINT32_LIMIT)
            for index, token in enumerate(self.end_token_ids)))
        if self.logprobs is not None:
            set_field("logprobs", require_int(self.logprobs, "logprobs", 0,
                                              MAXIMUM_TOP_LOGPROBS + 1))
        if not isinstance(self.prompt_logprobs, bool):
            raise TypeError(f"prompt_logprobs must be a bool, not "
                            f"{type(self.prompt_logprobs).__name__}")
        if self.prompt_logprobs and self.logprobs is None:
            raise ValueError("prompt_logprobs needs logprobs (the count of alternatives, 0 "
                             "or more)")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise TypeError(f"grammar must be a Grammar (serving.structured_output) or None, "
                            f"not {type(self.grammar).__name__}")

    @property
    def ending_ids(self) -> frozenset[int]:
        """Every id that ends generation (``end_token_id`` and ``end_token_ids``)."""
        ids = set(self.end_token_ids)
        if self.end_token_id is not None:
            ids.add(self.end_token_id)
        return frozenset(ids)

    def make_sampler(self) -> Sampler:
        """A fresh sampler for one request: Greedy at temperature 0, else TemperatureSampler."""
        penalties = {"repetition_penalty": self.repetition_penalty,
                     "presence_penalty": self.presence_penalty,
                     "frequency_penalty": self.frequency_penalty}
        if self.temperature == 0:
            return Greedy(**penalties)
        return TemperatureSampler(
            self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
            min_p=self.min_p or None, **penalties,
        )

    def replace(self, **changes) -> GenerationConfig:
        return dataclasses.replace(self, **changes)


def _field_setter(instance) -> Callable[[str, object], None]:
    """Set fields of a frozen dataclass from its ``__post_init__`` (normalised values)."""
    return lambda name, value: object.__setattr__(instance, name, value)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability (natural log) under the model's raw distribution, and the
    ``top`` most likely ids with theirs (``((id, logprob), ...)``, most likely first, the
    lower id first among equals; as many as ``GenerationConfig.logprobs`` asks)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as it is produced.

    ``text`` is the text this token makes releasable (often "", e.g. half a UTF-8
    character or a possible start of a stop sequence); the events' texts concatenate to the
    result's ``generated_text``. The last event of a request carries its ``finish_reason``.
    ``logprob`` is the token's :class:`TokenLogprob` when the config asks for ``logprobs``
    (else None); the first event (``index`` 0) of a config with ``prompt_logprobs`` carries
    the prompt's, as the result has them (else None).
    """

    index: int
    token_id: int
    text: str
    finish_reason: str | None = None
    logprob: TokenLogprob | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True)
class GenerationResult:
    """A finished generation.

    ``raw_bytes`` are the exact bytes of ``token_ids`` (prompt and every generated token);
    ``generated_bytes`` those of ``generated_token_ids``. ``generated_text`` is the
    generated bytes decoded leniently (U+FFFD for invalid or incomplete UTF-8), cut where the
    stop sequence starts and without the end token's bytes; ``text`` is ``prompt_text +
    generated_text``. With ``GenerationConfig.logprobs``, ``logprobs`` has one
    :class:`TokenLogprob` per generated token id (the end token's included); with
    ``prompt_logprobs``, ``prompt_logprobs`` one per prompt token id, the first None (no
    position predicts it). Both are None when not asked for.
    """

    prompt_token_ids: tuple[int, ...]
    generated_token_ids: tuple[int, ...]
    raw_bytes: bytes
    generated_bytes: bytes
    prompt_text: str
    generated_text: str
    finish_reason: str
    stop_sequence: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.generated_token_ids

    @property
    def text(self) -> str:
        return self.prompt_text + self.generated_text


def encode_prompt(tokenizer, prompt) -> list[int]:
    """A prompt's token ids: a str (UTF-8) or bytes-like through ``tokenizer.encode_bytes``,
    or a sequence of ids as given. ValueError when it has no tokens."""
    if isinstance(prompt, str):
        ids = list(tokenizer.encode_bytes(prompt.encode("utf-8")))
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        ids = list(tokenizer.encode_bytes(prompt))
    elif isinstance(prompt, Sequence):
        ids = [require_int(token, f"prompt[{index}]", 0, UINT32_LIMIT)
               for index, token in enumerate(prompt)]
    else:
        raise TypeError(
            f"prompt must be a str, bytes or a sequence of token ids, not {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError("the prompt must encode to at least one token")
    return ids


def tokenizer_vocabulary_size(tokenizer) -> int:
    size = getattr(tokenizer, "vocabulary_size", None)
    if size is None:
        size = getattr(tokenizer, "vocab_size", None)
    if size is None:
        raise TypeError(f"tokenizer must have vocabulary_size, not {type(tokenizer).__name__}")
    return size


def require_matching_vocabulary(tokenizer, engine) -> int:
    """The ids sampling may produce: the tokenizer's. It has the model's vocabulary, or a
    smaller one when the checkpoint pads its vocabulary (real checkpoints round V up); the
    padding ids, which no text encodes to, are then never sampled. A tokenizer with more
    tokens than the model: ValueError."""
    size = tokenizer_vocabulary_size(tokenizer)
    if size > engine.vocabulary_size:
        raise ValueError(
            f"the tokenizer has {size} tokens but the model's vocabulary_size is "
            f"{engine.vocabulary_size}"
        )
    return size


class GrammarVocabulary:
    """A tokenizer's :class:`~.structured_output.TokenVocabulary` for constrained decoding,
    indexed on first use (about 0.5 s at V = 49,152) and kept, with one vocabulary object per
    set of end ids (so that a grammar's cached masks serve every request alike).
    :meth:`matcher` gives each generation of a config with a grammar its own matcher."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._vocabularies: dict[tuple[int, ...], TokenVocabulary] = {}
        self._index: TokenVocabulary | None = None

    def vocabulary(self, end_ids=()) -> TokenVocabulary:
        """The vocabulary whose ``end_ids`` are those of ``end_ids`` below its size."""
        with self._lock:
            if self._index is None:
                self._index = TokenVocabulary.from_tokenizer(self._tokenizer)
            size = self._index.size
            ends = tuple(sorted({token for token in end_ids if token < size}))
            vocabulary = self._vocabularies.get(ends)
            if vocabulary is None:
                vocabulary = self._vocabularies[ends] = self._index.with_end_ids(ends)
            return vocabulary

    def matcher(self, config: GenerationConfig) -> Matcher | None:
        """A fresh matcher of ``config.grammar`` whose end ids are the config's ending ids
        (None for a config without a grammar)."""
        if config.grammar is None:
            return None
        return Matcher(config.grammar, self.vocabulary(config.ending_ids))


def _takes_keyword(function, name: str) -> bool:
    """Whether ``function`` accepts the keyword argument ``name``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(parameter.kind is inspect.Parameter.VAR_KEYWORD
                                     for parameter in parameters.values())


class GenerationProgress:
    """One request's way through the exact generator sequence (see the module docstring).

    Its driver repeats: ``reset`` the stream when ``needs_reset`` (then
    ``acknowledge_reset()``); feed ``next_chunk(limit)`` in a step; ``feed(count, logits)``
    after the step succeeded, with the step's logits, which returns the sampled token's
    :class:`TokenEvent` when the feed completed (None while it goes on). ``finished`` ends
    the loop; ``result()`` is then the answer. (``feed`` is ``commit_chunk(count)``, which
    says whether the feed is complete, then ``advance(logits)`` if it is; with
    ``prompt_logprobs`` it also scores each prompt position: ``next_chunk`` then hands out one
    prompt token at a time.)

    A config with a ``grammar`` needs ``matcher``, a fresh
    :class:`~.structured_output.Matcher` of that grammar (:meth:`GrammarVocabulary.matcher`),
    which the progress then owns.
    """

    def __init__(
        self,
        prompt_ids: Sequence[int],
        config: GenerationConfig,
        sampler: Sampler,
        *,
        maximum_context: int,
        vocabulary_size: int,
        token_bytes: TokenBytes,
        matcher: Matcher | None = None,
    ) -> None:
        if not isinstance(config, GenerationConfig):
            raise TypeError(f"config must be a GenerationConfig, not {type(config).__name__}")
        if config.grammar is None and matcher is not None:
            raise ValueError("a matcher needs a config with a grammar")
        if config.grammar is not None:
            if not isinstance(matcher, Matcher) or matcher.grammar is not config.grammar:
                raise ValueError("a config with a grammar needs a fresh Matcher of that grammar "
                                 "(GrammarVocabulary.matcher(config))")
            if matcher.text or matcher.ended:
                raise ValueError("the matcher has already been advanced; each generation "
                                 "needs a fresh one")
            if matcher.vocabulary.size != vocabulary_size:
                raise ValueError(f"the matcher's vocabulary has {matcher.vocabulary.size} "
                                 f"tokens, but sampling draws from {vocabulary_size}")
        if not prompt_ids:
            raise ValueError("the prompt must encode to at least one token")
        for index, token in enumerate(prompt_ids):
            require_int(token, f"prompt token {index}", 0, UINT32_LIMIT)
            if token >= vocabulary_size:
                raise ValueError(
                    f"prompt token {index} is {token}, not below the vocabulary size "
                    f"{vocabulary_size}"
                )
        if config.end_token_id is not None and config.end_token_id >= vocabulary_size:
            raise ValueError(
                f"end_token_id {config.end_token_id} is not below the vocabulary size "
                f"{vocabulary_size}"
            )
        if config.prompt_logprobs and len(prompt_ids) > maximum_context:
            raise ValueError(
                f"prompt_logprobs needs the whole prompt in the context: it has "
                f"{len(prompt_ids)} tokens, the context holds {maximum_context}"
            )
        self._ending_ids = config.ending_ids
        self.prompt_ids = tuple(prompt_ids)
        self.config = config
        self._sampler = sampler
        self._matcher = matcher
        self._sampler_takes_mask = matcher is not None and _takes_keyword(sampler.sample, "mask")
        self._maximum_context = maximum_context
        self._vocabulary_size = vocabulary_size
        self._token_bytes = token_bytes
        self.generated_ids: list[int] = []
        self._text = IncrementalText(config.stop)
        self._pending = list(self.prompt_ids[-maximum_context:])
        self._fed = 0  # tokens in the stream since its last reset
        self._needs_reset = False
        self.finish_reason: str | None = None
        self._logprobs: list[TokenLogprob] | None = None if config.logprobs is None else []
        # The prompt's scores so far (the first token has none); None: not asked.
        self._prompt_scores: list[TokenLogprob | None] | None = (
            [None] if config.prompt_logprobs else None)
        if config.max_new_tokens == 0:
            if config.prompt_logprobs and len(self.prompt_ids) > 1:
                self._pending = list(self.prompt_ids[:-1])  # scoring only: no sample
            else:
                self._pending = []
                self.finish_reason = "length"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def token_budget(self) -> int:
        """The most tokens the stream will hold at once: ``min(C, min(P, C) + N - 1)``."""
        window = min(len(self.prompt_ids), self._maximum_context)
        return min(self._maximum_context, window + max(self.config.max_new_tokens - 1, 0))

    @property
    def pending_count(self) -> int:
        """Tokens still to feed before the next sample."""
        return len(self._pending)

    @property
    def needs_reset(self) -> bool:
        return self._needs_reset

    def acknowledge_reset(self) -> None:
        self._needs_reset = False
        self._fed = 0

    @property
    def _scoring_prompt(self) -> bool:
        """Whether the next step's logits score a prompt token (prompt_logprobs)."""
        scores = self._prompt_scores
        return scores is not None and len(scores) < len(self.prompt_ids)

    def next_chunk(self, limit: int | None = None) -> list[int]:
        """The next tokens to feed, at most ``limit`` (all pending ones by default; one
        while the prompt is being scored)."""
        if self._needs_reset:
            raise RuntimeError("the stream must be reset before the replay is fed")
        if self._scoring_prompt:
            limit = 1
        return self._pending[:limit] if limit is not None else list(self._pending)

    def reusable_prompt(self) -> list[int]:
        """The tokens an engine may take from a prefix cache now (``Engine.reuse_prefix``):
        the pending prompt window while the stream is still empty and no prompt token is
        scored (scoring needs every position's logits); else nothing. Commit what the engine
        adopted with :meth:`commit_chunk`."""
        if self._fed != 0 or self._needs_reset or self._scoring_prompt or self.finished:
            return []
        return list(self._pending)

    def commit_chunk(self, count: int) -> bool:
        """Record that the first ``count`` pending tokens were fed; True when none are left."""
        del self._pending[:count]
        self._fed += count
        return not self._pending

    def feed(self, count: int, logits: Sequence[float]) -> TokenEvent | None:
        """Record a step that fed the first ``count`` pending tokens and returned ``logits``
        (of the last position fed): score the prompt token they predict (prompt_logprobs),
        and when the feed is complete, sample (``advance``) and return the event."""
        scoring = self._scoring_prompt
        complete = self.commit_chunk(count)
        if scoring:
            position = len(self._prompt_scores)  # the prompt token these logits predict
            if count != 1 or self._fed != position:
                raise RuntimeError("a scored prompt is fed one token per step")
            self._prompt_scores.append(self._score(logits, self.prompt_ids[position]))
        if not complete:
            return None
        if self.config.max_new_tokens == 0:  # the prompt was only scored
            self.finish_reason = "length"
            return None
        return self.advance(logits)

    def _score(self, logits: Sequence[float], token: int) -> TokenLogprob:
        if len(logits) > self._vocabulary_size:
            logits = logits[: self._vocabulary_size]
        logprob, top = log_probabilities(logits, token, self.config.logprobs)
        return TokenLogprob(token, logprob, top)

    def advance(self, logits: Sequence[float]) -> TokenEvent:
        """Sample the next token from the logits of the last fed position and plan the next
        feed (the new token, or a reset and replay when the stream is full)."""
        if self.finished or self._pending:
            raise RuntimeError("advance() needs a completed feed of an unfinished generation")
        if len(logits) > self._vocabulary_size:  # a padded vocabulary: never its padding
            logits = logits[: self._vocabulary_size]
        context = self.prompt_ids + tuple(self.generated_ids)
        options = {}
        if self.config.presence_penalty or self.config.frequency_penalty:
            # only this module's samplers take it (the config's own sampler is one of them)
            options["prompt_length"] = len(self.prompt_ids)
        row = logits  # ``logits`` stays the raw row: log-probabilities come from it
        matcher = self._matcher
        if matcher is not None:
            mask = matcher.allowed_tokens()
            if self._sampler_takes_mask:
                options["mask"] = mask
            else:
                row = apply_mask(logits, mask)
        token = self._sampler.sample(row, context, **options)
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not (
            0 <= token < self._vocabulary_size
        ):
            raise RuntimeError(f"the sampler returned {token!r}, not an id below "
                               f"{self._vocabulary_size}")
        token = int(token)
        scored = None
        if self._logprobs is not None:  # the raw row, which the samplers never modify
            scored = self._score(logits, token)
        return self._accept(token, scored)

    # ---- sampling inside the library's batched step (the scheduler's fused path) ----------

    @property
    def library_samples(self) -> bool:
        """Whether the library can choose this request's next token inside its batched step
        (``sampling_plan``/``accept_sampled``): this module's samplers, and no prompt token
        to score (scoring needs the whole row)."""
        return type(self._sampler) in (Greedy, TemperatureSampler) and not self._scoring_prompt

    def sampling_plan(self, vocabulary_size: int):
        """The library's plan for the next token (``native.sampling.RowSamplingPlan``),
        the same rules :meth:`advance` applies: the sampler's options, the penalties'
        context, the grammar's mask, the sampler's draw number, ids below the tokenizer's
        vocabulary (of the model's ``vocabulary_size``), and the log-probabilities asked."""
        from ..native.sampling import RowSamplingPlan

        sampler = self._sampler
        penalised = sampler.penalised
        top = self.config.logprobs if self._logprobs is not None else 0
        return RowSamplingPlan(
            options=sampler.native_options(),
            context_ids=self.prompt_ids + tuple(self.generated_ids) if penalised else (),
            prompt_length=len(self.prompt_ids) if penalised else 0,
            mask=self._matcher.allowed_tokens() if self._matcher is not None else None,
            draw_index=getattr(sampler, "draws", 0),
            vocabulary_limit=(self._vocabulary_size
                              if self._vocabulary_size < vocabulary_size else 0),
            log_probability=self._logprobs is not None,
            top_count=top or 0,
        )

    def feed_sampled(self, count: int, sampled) -> TokenEvent | None:
        """Record a fused step that fed ``count`` pending tokens; ``sampled`` is the
        library's ``SampledRow`` when the feed completed (None while a prompt is still being
        fed). Returns the event, as :meth:`feed` does."""
        complete = self.commit_chunk(count)
        if not complete:
            return None
        if self.config.max_new_tokens == 0:
            self.finish_reason = "length"
            return None
        if sampled is None or sampled.status != "sampled":
            reason = "not all finite" if sampled is not None else "missing"
            raise ValueError(f"the logits of the last position fed are {reason}")
        if isinstance(self._sampler, TemperatureSampler):
            self._sampler.draws += 1  # the library made this draw
        scored = None
        if self._logprobs is not None:
            scored = TokenLogprob(sampled.token, sampled.log_probability, sampled.top)
        return self._accept(sampled.token, scored)

    def _accept(self, token: int, scored: TokenLogprob | None) -> TokenEvent:
        """The chosen token: its log-probability, the grammar, the text, the end, and the
        next feed (the new token, or a reset and replay when the stream is full)."""
        matcher = self._matcher
        if scored is not None:
            self._logprobs.append(scored)
        if matcher is not None:
            matcher.advance(token)  # a ValueError for a token the mask did not allow
        self.generated_ids.append(token)
        if token in self._ending_ids:
            released = self._text.finish()
            self.finish_reason = "end_token"
        else:
            released = self._text.push(self._token_bytes(token))
            if self._text.stopped:
                self.finish_reason = "stop"
            elif matcher is not None and matcher.is_complete():
                released += self._text.finish()  # the grammar's text is whole: nothing follows
                self.finish_reason = "stop"
            elif len(self.generated_ids) == self.config.max_new_tokens:
                released += self._text.finish()
                self.finish_reason = "stop" if self._text.stopped else "length"
        if not self.finished:
            if self._fed == self._maximum_context:
                self._needs_reset = True
                self._pending = list((self.prompt_ids + tuple(self.generated_ids))[
                    -self._maximum_context:
                ])
            else:
                self._pending = [token]
        index = len(self.generated_ids) - 1
        prompt_scores = None
        if index == 0 and self._prompt_scores is not None:
            prompt_scores = tuple(self._prompt_scores)
        return TokenEvent(index, token, released, self.finish_reason, scored, prompt_scores)

    def result(self) -> GenerationResult:
        if not self.finished:
            raise RuntimeError("the generation has not finished")
        self._text.finish()
        token_bytes = self._token_bytes
        generated = tuple(self.generated_ids)
        return GenerationResult(
            prompt_token_ids=self.prompt_ids,
            generated_token_ids=generated,
            raw_bytes=token_bytes.of_ids(self.prompt_ids + generated),
            generated_bytes=b"".join(map(token_bytes, generated)),
            prompt_text=lenient_utf8(token_bytes.of_ids(self.prompt_ids)),
            generated_text=self._text.text,
            finish_reason=self.finish_reason,
            stop_sequence=self._text.stop_sequence,
            logprobs=None if self._logprobs is None else tuple(self._logprobs),
            prompt_logprobs=(None if self._prompt_scores is None
                             else tuple(self._prompt_scores)),
        )


def resolve_config(config: GenerationConfig | None, overrides: dict) -> GenerationConfig:
    """``config`` (default: GenerationConfig()) with keyword ``overrides`` applied."""
    if config is None:
        return GenerationConfig(**overrides)
    if not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig, not {type(config).__name__}")
    return dataclasses.replace(config, **overrides) if overrides else config


class GenerationStream:
    """The events of one streamed generation (an iterator of :class:`TokenEvent`).

    ``result`` is available once the iterator is exhausted. ``close()`` (or leaving a
    ``with`` block) abandons the generation early and frees its stream.
    """

    def __init__(self, events: Iterator[TokenEvent]) -> None:
        self._events = events
        self._result: GenerationResult | None = None

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> TokenEvent:
        try:
            return next(self._events)
        except StopIteration as finished:
            self._result = finished.value
            raise StopIteration from None

    @property
    def result(self) -> GenerationResult:
        if self._result is None:
            raise RuntimeError("the stream has not been consumed to its end")
        return self._result

    def close(self) -> None:
        self._events.close()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()


class TextGenerator:
    """Generates text from a prompt with one model (or engine) and its tokenizer.

    ``model_or_engine``: an engine (``serving.engine``), or a model, for which
    :func:`~.engine.make_engine` builds one (a native model with decode sessions gets a
    ``kv_cache`` (``"paged"``/``"contiguous"``) engine with ``kv_cache_block_size``-token
    blocks; any other model the full-forward fallback). ``sampler`` (default: the config's)
    is a caller-owned sampler used for every call that passes none. The tokenizer's
    vocabulary must be the model's (ValueError).

    Thread-safe: concurrent generations interleave their engine steps under one lock, and
    each needs its own stream (a paged engine sized for one context holds one at a time:
    the next one fails with PoolFullError instead of waiting; use the scheduler to queue).
    """

    def __init__(
        self,
        model_or_engine,
        tokenizer,
        sampler: Sampler | None = None,
        kv_cache: str = "paged",
        kv_cache_block_size: int = 16,
    ) -> None:
        self._engine = make_engine(model_or_engine, kv_cache=kv_cache,
                                   block_size=kv_cache_block_size)
        self._owns_engine = self._engine is not model_or_engine
        self._sampled_vocabulary = require_matching_vocabulary(tokenizer, self._engine)
        self._tokenizer = tokenizer
        self._token_bytes = TokenBytes(tokenizer)
        self._grammar_vocabulary = GrammarVocabulary(tokenizer)
        self._sampler = sampler
        self._lock = threading.Lock()

    @property
    def engine(self):
        return self._engine

    @property
    def tokenizer(self):
        return self._tokenizer

    def generate(
        self,
        prompt,
        config: GenerationConfig | None = None,
        *,
        sampler: Sampler | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
        **overrides,
    ) -> GenerationResult:
        """Generate from ``prompt`` (str, bytes or token ids) and return the result.

        ``config`` fields may be overridden by keyword (``max_new_tokens=8``). ``on_token``
        is called with each :class:`TokenEvent` as it is produced.
        """
        stream = self.stream(prompt, config, sampler=sampler, **overrides)
        with stream:
            for event in stream:
                if on_token is not None:
                    on_token(event)
        return stream.result

    def stream(
        self,
        prompt,
        config: GenerationConfig | None = None,
        *,
        sampler: Sampler | None = None,
        **overrides,
    ) -> GenerationStream:
        """The generation as a :class:`GenerationStream` of token events (lazy: nothing runs
        before the first ``next``); arguments as for :meth:`generate`."""
        resolved = resolve_config(config, overrides)
        prompt_ids = encode_prompt(self._tokenizer, prompt)
        chosen = sampler or self._sampler or resolved.make_sampler()
        progress = GenerationProgress(
            prompt_ids, resolved, chosen,
            maximum_context=self._engine.maximum_context,
            vocabulary_size=self._sampled_vocabulary,
            token_bytes=self._token_bytes,
            matcher=self._grammar_vocabulary.matcher(resolved),
        )
        return GenerationStream(self._events(progress))

    def _events(self, progress: GenerationProgress):
        engine = self._engine
        if progress.finished:
            return progress.result()
        with self._lock:
            stream = engine.open_stream(progress.token_budget)
        try:
            while not progress.finished:
                with self._lock:
                    if progress.needs_reset:
                        engine.reset_stream(stream)
                        progress.acknowledge_reset()
                    chunk = progress.next_chunk()
                    logits = engine.step([(stream, chunk)])[0]
                event = progress.feed(len(chunk), logits)
                if event is not None:
                    yield event
        finally:
            with self._lock:
                engine.close_stream(stream)
        return progress.result()

    def close(self) -> None:
        """Close the engine this generator created (an engine passed in stays open)."""
        if self._owns_engine:
            self._engine.close()

    def __enter__(self) -> TextGenerator:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()
