"""Engines: the narrow interface through which the serving layer drives a model.

An engine owns a model's decode state as *streams* (one per request). ``TextGenerator`` and
the scheduler's thread use nothing but these members (the :class:`Engine` protocol):

==================================================  =========================================
``vocabulary_size``, ``maximum_context``            the model's V and C
``kind``                                            ``"full_forward"`` or ``"native"``
``admission(token_budget) -> Admission``            ADMIT now, WAIT for pages, or REJECT
``open_stream(token_budget) -> stream``             reserve the budget's pages, open a stream
``step([(stream, tokens), ...]) -> [logits, ...]``  ONE batched step (see below)
``reuse_prefix(stream, prompt) -> int``             adopt cached pages of a prompt's prefix
``reset_stream(stream)``                            empty a stream (context rollover)
``close_stream(stream)``                            free it: pages and reservation (idempotent)
``capacity() -> KvCapacity``                        pool introspection
``close()``                                         close every stream and the pool
==================================================  =========================================

A stream has ``size`` (tokens it holds), ``capacity`` (= C) and ``closed``.

``step`` advances every row's stream by that row's tokens (1 token is a decode step, several
are a prefill chunk) and returns, per row, the logits of the row's last position as a sequence
of V floats. Rows must name distinct open streams of this engine and nonempty token lists of
ids below V, and no stream may pass its capacity (``size + len(tokens) <= C``). On any
failure no stream changed, so a caller may retry rows one at a time to isolate a bad one.

*Prefix caching.* ``reuse_prefix(stream, prompt)`` is asked of an empty stream before its
prompt is fed: it returns how many leading tokens of ``prompt`` (whole KV pages, never the last
token) the stream now holds from pages an earlier stream computed, so the caller feeds only
``prompt[returned:]``. The logits that follow equal a cold run's within float rounding. Engines
without a cache (and a NativeEngine made with ``prefix_caching=False``) return 0.

*Token budget and admission.* The budget of a request is the most tokens its stream will
ever hold at once; with learned absolute positions that is at most C, because context
rollover resets the stream instead of growing it (docs/ARCHITECTURE.md, 'Context rollover').
Opening a stream *reserves* ``ceil(min(budget, C) / block_size)`` blocks of the pool, and a
stream leases at most that many pages, so a running stream never meets "pool exhausted":
admission control happens once, up front. ``admission`` says REJECT when the reservation exceeds
the whole pool (the request can never fit) and WAIT when it exceeds what other reservations leave
free now. There is no preemption.

Two engines implement the protocol:

* :class:`FullForwardEngine` works with any model (no KV cache): each step runs one full
  forward over every row's whole stream (at most C tokens), right-padded into one
  ``[B, T]`` batch when the model is a native ``DecoderOnlyTransformer``.
* :class:`NativeEngine` uses the library's KV-cache decode sessions (``kv_cache_pool``,
  ``decode_session`` and ``decode_batch``): one native batched step per call, pages leased
  lazily from one shared pool.

:func:`make_engine` picks NativeEngine for a model that has ``kv_cache_pool``, else
FullForwardEngine.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..native._validation import (
    UINT32_LIMIT,
    describe_value,
    require_bool,
    require_choice,
    require_int,
)
from ..native.decode import KV_CACHE_VALUES
from .errors import PoolFullError, RequestRejectedError

# The cache names the native API accepts (one home: native.decode).
KV_CACHE_KINDS = KV_CACHE_VALUES

Logits = Sequence[float]  # one position's V logits (a tuple, or array('f') from native)


class Admission(enum.Enum):
    """What an engine says about a request's token budget."""

    ADMIT = "admit"  # a stream can be opened now
    WAIT = "wait"  # the pool is full now; the request fits once other streams close
    REJECT = "reject"  # the request needs more pages than the whole pool holds


@dataclass(frozen=True)
class KvCapacity:
    """A snapshot of an engine's KV pool (all counts in blocks of ``block_size`` tokens).

    ``kv_cache`` is ``"paged"``, ``"contiguous"`` (one private full-context page per stream)
    or ``"none"`` (no cache: FullForwardEngine, whose counts are accounting only).
    ``block_count`` is None when nothing bounds the pool.
    """

    kv_cache: str
    block_size: int
    block_count: int | None
    blocks_per_full_cache: int
    reserved_block_count: int
    leased_block_count: int
    open_stream_count: int
    # Blocks a new reservation can take now (None: block_count - reserved_block_count), and
    # cached prefix blocks no stream holds (they count as free: a lease may evict them).
    available_block_count: int | None = None
    cached_block_count: int = 0

    def __post_init__(self) -> None:
        if self.available_block_count is None and self.block_count is not None:
            object.__setattr__(self, "available_block_count",
                               self.block_count - self.reserved_block_count)


@runtime_checkable
class EngineStream(Protocol):
    """One request's decode state inside an engine."""

    @property
    def size(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def closed(self) -> bool: ...


@runtime_checkable
class Engine(Protocol):
    """What the serving layer needs from a model (see the module docstring for the contract)."""

    @property
    def vocabulary_size(self) -> int: ...

    @property
    def maximum_context(self) -> int: ...

    @property
    def kind(self) -> str: ...

    def admission(self, token_budget: int) -> Admission: ...

    def open_stream(self, token_budget: int) -> EngineStream: ...

    def step(self, batch: Sequence[tuple[EngineStream, Sequence[int]]]) -> list[Logits]: ...

    def reuse_prefix(self, stream: EngineStream, prompt: Sequence[int]) -> int: ...

    def reset_stream(self, stream: EngineStream) -> None: ...

    def close_stream(self, stream: EngineStream) -> None: ...

    def capacity(self) -> KvCapacity: ...

    def close(self) -> None: ...


def is_engine(value: object) -> bool:
    """Whether ``value`` already is an engine (it has the protocol's stream methods)."""
    return all(
        callable(getattr(value, name, None))
        for name in ("admission", "open_stream", "step", "reset_stream", "close_stream")
    )


class BlockLedger:
    """Block reservations against a pool of ``block_count`` blocks (None: unbounded).

    One rule for every engine: a token budget needs ``ceil(min(budget, C) / block_size)``
    blocks. Thread-safe: ``admission`` may be asked from any thread.
    """

    def __init__(self, block_size: int, block_count: int | None, maximum_context: int) -> None:
        self.block_size = block_size
        self.block_count = block_count
        self.maximum_context = maximum_context
        self.blocks_per_full_cache = -(-maximum_context // block_size)
        self._reserved = 0
        self._lock = threading.Lock()

    @property
    def reserved_block_count(self) -> int:
        with self._lock:
            return self._reserved

    def blocks_for(self, token_budget: int) -> int:
        budget = require_int(token_budget, "token_budget", 1, math.inf)
        return -(-min(budget, self.maximum_context) // self.block_size)

    def admission(self, token_budget: int) -> Admission:
        needed = self.blocks_for(token_budget)
        if self.block_count is None:
            return Admission.ADMIT
        if needed > self.block_count:
            return Admission.REJECT
        with self._lock:
            fits_now = self._reserved + needed <= self.block_count
        return Admission.ADMIT if fits_now else Admission.WAIT

    def reserve(self, token_budget: int) -> int:
        """Reserve the budget's blocks and return their count; raise if it is not ADMIT."""
        needed = self.blocks_for(token_budget)
        if self.block_count is not None and needed > self.block_count:
            raise RequestRejectedError(
                f"a token budget of {token_budget} needs {needed} KV blocks of "
                f"{self.block_size} tokens, more than the whole pool of {self.block_count}"
            )
        with self._lock:
            if self.block_count is not None and self._reserved + needed > self.block_count:
                raise PoolFullError(
                    f"a token budget of {token_budget} needs {needed} KV blocks; only "
                    f"{self.block_count - self._reserved} of {self.block_count} are unreserved"
                )
            self._reserved += needed
        return needed

    def release(self, block_count: int) -> None:
        with self._lock:
            self._reserved -= block_count


def _require_token_ids(tokens: Sequence[int], name: str, vocabulary_size: int) -> list[int]:
    """``tokens`` as a nonempty list of ids in ``[0, V)`` (TypeError/ValueError otherwise)."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name} must be a sequence of token ids, not {type(tokens).__name__}")
    if not tokens:
        raise ValueError(f"{name} must hold at least one token id")
    ids = [require_int(token, f"{name}[{index}]", 0, UINT32_LIMIT)
           for index, token in enumerate(tokens)]
    for index, token in enumerate(ids):
        if token >= vocabulary_size:
            raise ValueError(
                f"{name}[{index}] = {token} is not below the vocabulary size {vocabulary_size}"
            )
    return ids


class _EngineBase:
    """What both engines share: dimensions, the ledger, the open streams, batch validation."""

    kind: str
    _ledger: BlockLedger

    def __init__(self, vocabulary_size: int, maximum_context: int) -> None:
        self._vocabulary_size = vocabulary_size
        self._maximum_context = maximum_context
        self._streams: set = set()
        self._closed = False

    @property
    def vocabulary_size(self) -> int:
        return self._vocabulary_size

    @property
    def maximum_context(self) -> int:
        return self._maximum_context

    @property
    def closed(self) -> bool:
        return self._closed

    def admission(self, token_budget: int) -> Admission:
        return self._ledger.admission(token_budget)

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    def _own_stream(self, stream: object, name: str = "stream"):
        if stream not in self._streams:
            state = "closed" if getattr(stream, "closed", False) else "not a stream of it"
            raise ValueError(f"{name} is {state} ({type(self).__name__}: {describe_value(stream)})")
        return stream

    def _validated_batch(self, batch) -> list[tuple[object, list[int]]]:
        """Every row checked before anything runs: open distinct streams, ids below V, and no
        stream past its capacity (so a failure here changes nothing)."""
        self._require_open()
        if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence):
            raise TypeError(f"batch must be a sequence of (stream, tokens) pairs, not "
                            f"{type(batch).__name__}")
        rows = []
        seen: set[int] = set()
        for index, row in enumerate(batch):
            if not isinstance(row, Sequence) or len(row) != 2:
                raise TypeError(f"batch[{index}] must be a (stream, tokens) pair")
            stream = self._own_stream(row[0], f"batch[{index}] stream")
            if id(stream) in seen:
                raise ValueError(f"batch[{index}] names a stream an earlier row already steps")
            seen.add(id(stream))
            tokens = _require_token_ids(row[1], f"batch[{index}] tokens", self._vocabulary_size)
            if stream.size + len(tokens) > stream.capacity:
                raise IndexError(
                    f"batch[{index}]: the stream holds {stream.size} tokens; {len(tokens)} more "
                    f"would pass its capacity of {stream.capacity} (reset it first)"
                )
            rows.append((stream, tokens))
        return rows

    def reuse_prefix(self, stream, prompt: Sequence[int]) -> int:
        """No cache to share: every prompt token is fed (see the module docstring)."""
        self._require_open()
        self._own_stream(stream)
        return 0

    def _stream_budget_blocks(self, token_budget: int) -> int:
        self._require_open()
        return self._ledger.reserve(token_budget)

    def close(self) -> None:
        """Close every open stream (idempotent)."""
        if self._closed:
            return
        for stream in list(self._streams):
            self.close_stream(stream)
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()


_ADMISSIONS = {"admit": Admission.ADMIT, "wait": Admission.WAIT, "reject": Admission.REJECT}


class _FullForwardStream:
    """A stream of FullForwardEngine: just its tokens (at most C)."""

    __slots__ = ("tokens", "capacity", "reserved_blocks", "closed")

    def __init__(self, capacity: int, reserved_blocks: int) -> None:
        self.tokens: list[int] = []
        self.capacity = capacity
        self.reserved_blocks = reserved_blocks
        self.closed = False

    @property
    def size(self) -> int:
        return len(self.tokens)


class FullForwardEngine(_EngineBase):
    """The engine for any model: no cache, one full forward over each stream per step.

    ``model`` needs ``.config`` with ``vocabulary_size`` and ``maximum_context``, and
    ``model(tokens)`` returning logits for a flat token list (an object with ``to_array()``
    or ``tolist()`` giving the ``[1, T, V]`` values, flat or nested). A native
    ``DecoderOnlyTransformer`` gets all rows of a step in ONE forward, right-padded to the
    longest row: attention is causal, so padding after a row's last token cannot change
    that token's logits. Other models get one forward per row.

    There is no KV cache, so nothing bounds memory; ``block_count`` (None by default)
    optionally bounds admission by the same block accounting the native pool uses, e.g. to
    exercise a scheduler's wait and reject paths. It may be smaller than one full context.
    """

    kind = "full_forward"

    def __init__(self, model, *, block_size: int = 16, block_count: int | None = None) -> None:
        config = getattr(model, "config", None)
        if config is None or not callable(model):
            raise TypeError(
                "model must be callable on a token list and have .config with vocabulary_size "
                f"and maximum_context, not {type(model).__name__}"
            )
        vocabulary_size = require_int(config.vocabulary_size, "config.vocabulary_size", 1,
                                      math.inf)
        maximum_context = require_int(config.maximum_context, "config.maximum_context", 1,
                                      math.inf)
        super().__init__(vocabulary_size, maximum_context)
        block_size = require_int(block_size, "block_size", 1, UINT32_LIMIT)
        if block_count is not None:
            block_count = require_int(block_count, "block_count", 1, UINT32_LIMIT)
        self._model = model
        self._ledger = BlockLedger(block_size, block_count, maximum_context)
        self._batched = _is_native_transformer(model)

    @property
    def model(self):
        return self._model

    def open_stream(self, token_budget: int) -> _FullForwardStream:
        blocks = self._stream_budget_blocks(token_budget)
        stream = _FullForwardStream(self._maximum_context, blocks)
        self._streams.add(stream)
        return stream

    def step(self, batch) -> list[Logits]:
        rows = self._validated_batch(batch)
        if not rows:
            return []
        windows = [stream.tokens + tokens for stream, tokens in rows]
        if self._batched:
            logits = self._batched_last_logits(windows)
        else:
            logits = [self._batched_last_logits([window])[0] for window in windows]
        # Commit only after every forward.
        for (stream, _), window in zip(rows, windows, strict=True):
            stream.tokens = window
        return logits

    def _batched_last_logits(self, windows: list[list[int]]) -> list[Logits]:
        """The last-position logits of each window: one forward over ``[B, T]`` (right-padded
        with id 0), or over the flat row when B = 1."""
        time = max(map(len, windows))
        batch = [window + [0] * (time - len(window)) for window in windows]
        output = self._model(batch[0] if len(batch) == 1 else batch)
        try:
            values = _flat_values(output)
        finally:
            close = getattr(output, "close", None)
            if callable(close):
                close()
        vocabulary = self._vocabulary_size
        expected = len(batch) * time * vocabulary
        if len(values) != expected:
            raise RuntimeError(
                f"the model returned {len(values)} logits for a [{len(batch)}, {time}] batch; "
                f"expected {expected} (V = {vocabulary})"
            )
        result = []
        for row, window in enumerate(windows):
            start = (row * time + len(window) - 1) * vocabulary
            result.append(tuple(values[start : start + vocabulary]))
        return result

    def reset_stream(self, stream) -> None:
        self._require_open()
        self._own_stream(stream).tokens = []

    def close_stream(self, stream) -> None:
        if stream not in self._streams:
            return
        self._streams.discard(stream)
        stream.closed = True
        stream.tokens = []
        self._ledger.release(stream.reserved_blocks)

    def capacity(self) -> KvCapacity:
        ledger = self._ledger
        streams = list(self._streams)
        return KvCapacity(
            kv_cache="none",
            block_size=ledger.block_size,
            block_count=ledger.block_count,
            blocks_per_full_cache=ledger.blocks_per_full_cache,
            reserved_block_count=ledger.reserved_block_count,
            leased_block_count=sum(-(-s.size // ledger.block_size) for s in streams),
            open_stream_count=len(streams),
        )


def _is_native_transformer(model) -> bool:
    from ..native.model import CausalLanguageModel

    return isinstance(model, CausalLanguageModel)


def _flat_values(output) -> Sequence[float]:
    """A model output's values as one flat sequence (``to_array()``, or a flat or nested
    ``tolist()``)."""
    to_array = getattr(output, "to_array", None)
    if callable(to_array):
        return to_array()
    values = output.tolist() if hasattr(output, "tolist") else output
    while values and isinstance(values[0], (list, tuple)):
        values = [value for row in values for value in row]
    return values


# ---- the native KV-cache engine ------------------------------------------------------------


def native_decode_available(model=None) -> bool:
    """Whether this package's library binding has KV-cache decode sessions (and ``model``,
    when given, offers ``kv_cache_pool``)."""
    import riftco_transformer

    from ..native.model import DecoderOnlyTransformer

    target = DecoderOnlyTransformer if model is None else model
    return hasattr(target, "kv_cache_pool") and callable(
        getattr(riftco_transformer, "decode_batch", None)
    )


class _NativeStream:
    """A stream of NativeEngine: one native decode session and its reservation."""

    __slots__ = ("session", "reserved_blocks", "closed")

    def __init__(self, session, reserved_blocks: int) -> None:
        self.session = session
        self.reserved_blocks = reserved_blocks
        self.closed = False

    @property
    def size(self) -> int:
        return self.session.size

    @property
    def capacity(self) -> int:
        return self.session.capacity


class NativeEngine(_EngineBase):
    """The engine over the library's KV-cache decode sessions.

    ``kv_cache="paged"`` (default) creates one shared pool,
    ``model.kv_cache_pool(block_size=block_size, block_count=block_count,
    prefix_caching=prefix_caching)`` (``block_count`` 0 = exactly one full context), and every
    stream is a ``pool.session()`` that leases pages lazily. With ``prefix_caching`` (the
    default) a prompt that starts like an earlier one adopts that one's full pages
    (:meth:`reuse_prefix`); ``prefix_reused_tokens`` counts the prompt tokens so skipped.
    ``"contiguous"`` gives each stream a private ``model.decode_session(cache="contiguous")``
    of one full context (``block_count`` must be 0; admission is then unbounded). Each step
    is ONE ``riftco_transformer.decode_batch``.

    Raises RuntimeError when the library binding has no decode sessions (see
    :func:`native_decode_available`).
    """

    kind = "native"

    def __init__(self, model, kv_cache: str = "paged", block_size: int = 16,
                 block_count: int = 0, prefix_caching: bool = True) -> None:
        require_choice(kv_cache, "kv_cache", KV_CACHE_KINDS)
        require_bool(prefix_caching, "prefix_caching")
        block_size = require_int(block_size, "block_size", 1, UINT32_LIMIT)
        block_count = require_int(block_count, "block_count", 0, UINT32_LIMIT)
        if not native_decode_available(model):
            raise RuntimeError(
                "NativeEngine needs KV-cache decode sessions (model.kv_cache_pool and "
                "riftco_transformer.decode_batch), which this library binding does not have; "
                "use FullForwardEngine"
            )
        import riftco_transformer

        config = model.config
        super().__init__(config.vocabulary_size, config.maximum_context)
        from ..native.decode import decode_batch as library_decode_batch

        self._model = model
        self._decode_batch = riftco_transformer.decode_batch
        # The library's own step (not a stand-in) can also choose the tokens (step_sample).
        self.library_sampling = self._decode_batch is library_decode_batch
        self._kv_cache = kv_cache
        self._pool = None
        self.prefix_reused_tokens = 0
        if kv_cache == "paged":
            # The pool is the page ledger: streams are sessions holding reservations.
            self._pool = model.kv_cache_pool(block_size=block_size, block_count=block_count,
                                             prefix_caching=prefix_caching)
        else:
            if block_count != 0:
                raise ValueError(
                    f"block_count applies to the paged cache only; got {block_count} with "
                    "kv_cache='contiguous'"
                )
            # One private page of a full context per stream: nothing shared to run out of.
            self._ledger = BlockLedger(self._maximum_context, None, self._maximum_context)

    @property
    def model(self):
        return self._model

    @property
    def kv_cache(self) -> str:
        return self._kv_cache

    @property
    def prefix_caching(self) -> bool:
        """Whether prompts adopt cached KV pages (:meth:`reuse_prefix`)."""
        return self._pool is not None and bool(getattr(self._pool, "prefix_caching", False))

    def admission(self, token_budget: int) -> Admission:
        if self._pool is None:
            return self._ledger.admission(token_budget)
        return _ADMISSIONS[self._pool.admission(token_budget)]

    def open_stream(self, token_budget: int) -> _NativeStream:
        if self._pool is not None:
            self._require_open()
            session = self._reserved_session(token_budget)
            blocks = session.reserved_block_count
        else:
            blocks = self._stream_budget_blocks(token_budget)
            try:
                session = self._model.decode_session(cache="contiguous")
            except BaseException:
                self._ledger.release(blocks)
                raise
        if session.capacity != self._maximum_context:
            session.close()
            if self._pool is None:
                self._ledger.release(blocks)
            raise RuntimeError(
                f"a decode session's capacity is {session.capacity}, not the model's maximum "
                f"context {self._maximum_context}"
            )
        stream = _NativeStream(session, blocks)
        self._streams.add(stream)
        return stream

    def _reserved_session(self, token_budget: int):
        """A pool session holding the budget's reservation; the pool's refusals as the
        serving errors (RequestRejectedError: never fits; PoolFullError: not now)."""
        from ..native._errors import RiftcoTransformerError

        budget = require_int(token_budget, "token_budget", 1, math.inf)
        try:
            return self._pool.session(token_budget=budget)
        except RiftcoTransformerError as error:
            blocks = -(-min(budget, self._maximum_context) // self._pool.block_size)
            if error.status_name == "out_of_range":
                raise RequestRejectedError(
                    f"a token budget of {budget} needs {blocks} KV blocks of "
                    f"{self._pool.block_size} tokens, more than the whole pool of "
                    f"{self._pool.block_count}") from error
            if error.status_name == "runtime_error" and "pool full" in str(error):
                raise PoolFullError(
                    f"a token budget of {budget} needs {blocks} KV blocks; only "
                    f"{self._pool.available_block_count} of {self._pool.block_count} are "
                    "available") from error
            raise

    def step(self, batch) -> list[Logits]:
        rows = self._validated_batch(batch)
        if not rows:
            return []
        logits = self._decode_batch([stream.session for stream, _ in rows],
                                    [tokens for _, tokens in rows])
        if len(logits) != len(rows):
            raise RuntimeError(f"decode_batch returned {len(logits)} rows for {len(rows)}")
        return list(logits)  # array('f') rows: no per-float Python objects

    def step_sample(self, batch, plans) -> list:
        """``step``'s batch, with each row's next token chosen by the library inside the step
        (``plans[i]``: a ``native.sampling.RowSamplingPlan``, or None for a row that only
        feeds): no logits leave the library; ``native.sampling.SampledRow`` per row. On any
        error no stream changed (the plans are checked before the step)."""
        from ..native.sampling import decode_batch_sample

        rows = self._validated_batch(batch)
        if len(plans) != len(rows):
            raise ValueError(f"step_sample got {len(rows)} rows but {len(plans)} plans")
        if not rows:
            return []
        return decode_batch_sample([stream.session for stream, _ in rows],
                                   [tokens for _, tokens in rows], plans)

    def reuse_prefix(self, stream, prompt: Sequence[int]) -> int:
        self._require_open()
        session = self._own_stream(stream).session
        if not self.prefix_caching:
            return 0
        ids = _require_token_ids(prompt, "prompt", self._vocabulary_size)
        reused = session.reuse_prefix(ids)
        self.prefix_reused_tokens += reused
        return reused

    def reset_stream(self, stream) -> None:
        self._require_open()
        self._own_stream(stream).session.reset()

    def close_stream(self, stream) -> None:
        if stream not in self._streams:
            return
        self._streams.discard(stream)
        stream.closed = True
        try:
            stream.session.close()  # ends its reservation in the pool
        finally:
            if self._pool is None:
                self._ledger.release(stream.reserved_blocks)

    def capacity(self) -> KvCapacity:
        streams = list(self._streams)
        pool = self._pool
        if pool is None:
            ledger = self._ledger
            return KvCapacity(
                kv_cache=self._kv_cache,
                block_size=self._maximum_context,
                block_count=None,
                blocks_per_full_cache=ledger.blocks_per_full_cache,
                reserved_block_count=ledger.reserved_block_count,
                leased_block_count=len(streams),
                open_stream_count=len(streams),
            )
        return KvCapacity(
            kv_cache=self._kv_cache,
            block_size=pool.block_size,
            block_count=pool.block_count,
            blocks_per_full_cache=pool.blocks_per_full_cache,
            reserved_block_count=pool.reserved_block_count,
            leased_block_count=pool.leased_block_count,
            open_stream_count=len(streams),
            available_block_count=pool.available_block_count,
            cached_block_count=getattr(pool, "cached_block_count", 0),
        )

    def close(self) -> None:
        if self._closed:
            return
        try:
            super().close()
        finally:
            if self._pool is not None:
                self._pool.close()


def make_engine(model, kv_cache: str = "paged", block_size: int = 16, block_count: int = 0,
                prefix_caching: bool = True):
    """An engine for ``model``: ``model`` itself when it already is one, a
    :class:`NativeEngine` when it has ``kv_cache_pool``, else a :class:`FullForwardEngine`
    (which has no KV cache, so the cache arguments are only validated)."""
    if is_engine(model):
        return model
    if hasattr(model, "kv_cache_pool"):
        return NativeEngine(model, kv_cache=kv_cache, block_size=block_size,
                            block_count=block_count, prefix_caching=prefix_caching)
    require_choice(kv_cache, "kv_cache", KV_CACHE_KINDS)
    require_int(block_size, "block_size", 1, UINT32_LIMIT)
    require_int(block_count, "block_count", 0, UINT32_LIMIT)
    require_bool(prefix_caching, "prefix_caching")
    return FullForwardEngine(model)
