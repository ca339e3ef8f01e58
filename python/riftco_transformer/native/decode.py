"""KV-cached decoding: decode sessions, shared KV cache pools and the batched step.

A :class:`DecodeSession` is one request's sequence over a model. Each :meth:`~DecodeSession.step`
runs ONE position (learned absolute position = the session's ``size``) against the keys and
values cached for the earlier ones and returns that position's logits; :meth:`~DecodeSession.
prefill` runs a whole prompt in one batched pass. A :class:`KvCachePool` holds pages for many
sessions, and :func:`decode_batch` advances several of its sessions in ONE pass over the
model (the continuous-batching step): every weight is read once for all of them.

Rules (the native library enforces them):

* a session never rolls over: stepping past ``capacity`` (the model's maximum context) raises
  :class:`RiftcoTransformerError` with status ``out_of_range``; roll over with ``reset()``
  and a prefill of the newest tokens;
* every step is one transaction: on any error (an id >= V, a full session, ``runtime_error``
  "pool exhausted") no session changed;
* while a session lives, its model rejects ``to()``, NF4 conversion, LoRA attach/merge,
  parameter and packed-state loads and Adam steps (``runtime_error``).

Sessions and pools share their model's lock and native state: they keep working after the
model wrapper is closed.
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence

from ._abi import (
    KV_CACHE_CONTIGUOUS,
    KV_CACHE_PAGED,
    DecodeSessionOptionsStruct,
    KvCachePoolOptionsStruct,
)
from ._buffers import token_ids
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._validation import UINT32_LIMIT, UINT64_LIMIT, require_bool, require_choice, require_int

KV_CACHE_VALUES = {"paged": KV_CACHE_PAGED, "contiguous": KV_CACHE_CONTIGUOUS}
KV_CACHE_NAMES = {value: name for name, value in KV_CACHE_VALUES.items()}
ADMISSION_NAMES = {0: "admit", 1: "wait", 2: "reject"}  # RT_KV_ADMIT, RT_KV_WAIT, RT_KV_REJECT


class LogitsRow(array):
    """One position's V logits as ``array('f')``, with what the library computed over them:
    ``argmax`` (the first maximum: ties go to the lowest id) and ``all_finite``. Samplers
    that need no more (greedy) read those instead of scanning V floats in Python."""

    argmax: int
    all_finite: bool


def _logits_rows(logits, rows: int, vocabulary: int) -> list[LogitsRow]:
    """Split a native [rows, V] float buffer into LogitsRows (one C-level pass for the
    argmax and finiteness of every row, then one memcpy per row)."""
    argmax = (ctypes.c_uint32 * rows)()
    finite = (ctypes.c_uint8 * rows)()
    check_status(library().rt_f32_rows_argmax(logits, rows, vocabulary, argmax, finite))
    raw = memoryview(logits).cast("B")
    row_bytes = vocabulary * ctypes.sizeof(ctypes.c_float)
    result = []
    for i in range(rows):
        row = LogitsRow("f")
        row.frombytes(raw[i * row_bytes : (i + 1) * row_bytes])
        row.argmax = argmax[i]
        row.all_finite = bool(finite[i])
        result.append(row)
    return result


def _token(token: object) -> int:
    return require_int(token, "token", 0, UINT32_LIMIT)


def _flat_ids(tokens: object, name: str):
    ids = token_ids(tokens, name)
    if len(ids.shape) != 1:
        raise ValueError(f"{name} must be one flat row of token ids, got shape {ids.shape}")
    if ids.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one token id")
    return ids


class DecodeSession(NativeHandle):
    """One request's KV-cached sequence (made by ``model.decode_session()`` or
    ``pool.session()``; there is no public constructor).

    ``step(token)`` and ``prefill(tokens)`` return the logits of the last position fed, as a
    tuple of V floats. ``size`` is the positions seen, ``capacity`` the model's maximum
    context, ``cache_kind`` ``"paged"`` or ``"contiguous"``, ``block_size`` the positions per
    page (a contiguous cache reports the maximum context).
    """

    _release_function = "rt_decode_session_release"

    def _bind(self, vocabulary_size: int, pool: KvCachePool | None) -> DecodeSession:
        self._vocabulary_size = vocabulary_size
        self._pool = pool  # keeps the pool's Python wrapper alive for `pool` and batching
        return self

    @property
    def pool(self) -> KvCachePool | None:
        """The shared pool the session leases from (None for a private cache)."""
        with self._native():
            return self._pool

    def _logits_row(self) -> tuple[array, ctypes.Array]:
        """A row of V floats the native call writes in place (no per-float Python objects:
        building a tuple of V floats cost more than a whole native decode step)."""
        row = array("f", [0.0]) * self._vocabulary_size
        address, _ = row.buffer_info()
        return row, (ctypes.c_float * self._vocabulary_size).from_address(address)

    def step(self, token: int) -> array:
        """Feed ``token`` at position ``size``; the logits of that position (``array('f')``
        of V floats)."""
        value = _token(token)
        row, logits = self._logits_row()
        required = ctypes.c_uint64()
        with self._native() as pointer:
            check_status(
                library().rt_decode_session_step(
                    pointer, value, logits, self._vocabulary_size, ctypes.byref(required)
                )
            )
        return row

    def prefill(self, tokens) -> array:
        """Feed ``tokens`` (one flat row) at positions ``size``.. in one batched pass; the
        logits of the last one (``array('f')`` of V floats)."""
        ids = _flat_ids(tokens, "tokens")
        row, logits = self._logits_row()
        required = ctypes.c_uint64()
        with self._native() as pointer:
            check_status(
                library().rt_decode_session_prefill(
                    pointer,
                    ids.values,
                    len(ids.values),
                    logits,
                    self._vocabulary_size,
                    ctypes.byref(required),
                )
            )
        return row

    def reset(self) -> None:
        """Forget every position and return every page."""
        with self._native() as pointer:
            check_status(library().rt_decode_session_reset(pointer))

    def reuse_prefix(self, prompt) -> int:
        """Prefix caching: an empty session of a pool made with ``prefix_caching=True`` takes,
        by reference, the cached pages holding the longest whole-page prefix of ``prompt``
        without its last token, and returns the positions it now holds; feed
        ``prompt[returned:]`` next. 0 without a match, for a pool without prefix caching or a
        private cache. Pages computed with other parameter values or another structure are
        never adopted. RuntimeError when the session is not empty."""
        ids = _flat_ids(prompt, "prompt")
        reused = ctypes.c_uint64()
        with self._native() as pointer:
            check_status(
                library().rt_decode_session_reuse_prefix(
                    pointer, ids.values, len(ids.values), ctypes.byref(reused)
                )
            )
        return reused.value

    @property
    def size(self) -> int:
        return self._query("rt_decode_session_size", ctypes.c_uint64)

    @property
    def capacity(self) -> int:
        return self._query("rt_decode_session_capacity", ctypes.c_uint64)

    @property
    def cache_kind(self) -> str:
        return KV_CACHE_NAMES[self._query("rt_decode_session_cache_kind", ctypes.c_int32)]

    # Both names, as the earlier Python API had (docs/ARCHITECTURE.md, 'The Python package').
    cache = cache_kind

    @property
    def block_size(self) -> int:
        return self._query("rt_decode_session_block_size", ctypes.c_uint64)

    @property
    def reserved_block_count(self) -> int:
        """The pages reserved for this session (0: none)."""
        return self._query("rt_decode_session_reserved_block_count", ctypes.c_uint64)

    @property
    def vocabulary_size(self) -> int:
        with self._native():
            return self._vocabulary_size

    def __repr__(self) -> str:
        if self.closed:
            return "<DecodeSession (closed)>"
        return (
            f"<DecodeSession {self.cache_kind} size={self.size} capacity={self.capacity} "
            f"block_size={self.block_size}>"
        )


class KvCachePool(NativeHandle):
    """K/V pages shared by many sessions of one model (made by ``model.kv_cache_pool()``).

    ``block_size`` positions per page, ``block_count`` pages (the default 0 asked for exactly
    one full context, ``blocks_per_full_cache``); ``free_block_count`` and
    ``leased_block_count`` report the pages now. Pages are leased lazily as sessions grow and
    return on ``reset()``/``close()`` of a session.

    With ``prefix_caching`` every page a session fills is kept for later sessions whose prompt
    starts with the same tokens (:meth:`DecodeSession.reuse_prefix`): shared by reference,
    counted once, and kept after its sessions close (``cached_block_count``; such pages still
    count as free, and the least recently released one is evicted when a lease needs it).
    """

    _release_function = "rt_kv_cache_pool_release"

    def _bind(self, vocabulary_size: int, prefix_caching: bool = False) -> KvCachePool:
        self._vocabulary_size = vocabulary_size
        self._prefix_caching = prefix_caching
        return self

    def session(self, token_budget: int | None = None) -> DecodeSession:
        """A new paged session leasing from this pool. With ``token_budget``, the session
        holds a reservation of ``ceil(min(budget, C) / block_size)`` pages for its life (the
        pool is the one page ledger): it never meets an exhausted pool and cannot pass its
        reservation. A reservation that does not fit now is a ``RiftcoTransformerError``
        with status ``runtime_error`` ("pool full"; :meth:`admission` says ``"wait"``), one
        larger than the pool ``out_of_range`` (``"reject"``)."""
        handle = ctypes.c_void_p()
        with self._native() as pointer:
            if token_budget is None:
                check_status(
                    library().rt_kv_cache_pool_session_create(pointer, ctypes.byref(handle)))
            else:
                budget = require_int(token_budget, "token_budget", 1, UINT64_LIMIT)
                check_status(library().rt_kv_cache_pool_session_create_reserved(
                    pointer, budget, ctypes.byref(handle)))
        return DecodeSession._from_pointer(handle.value, self._lock)._bind(
            self._vocabulary_size, self
        )

    def admission(self, token_budget: int) -> str:
        """``"admit"`` when a reservation for ``token_budget`` positions fits now, ``"wait"``
        when it will once other reservations end, ``"reject"`` when it exceeds the pool."""
        budget = require_int(token_budget, "token_budget", 1, UINT64_LIMIT)
        verdict = ctypes.c_int32()
        with self._native() as pointer:
            check_status(library().rt_kv_cache_pool_admission(pointer, budget,
                                                              ctypes.byref(verdict)))
        return ADMISSION_NAMES[verdict.value]

    @property
    def reserved_block_count(self) -> int:
        """Pages reserved by living sessions, in all."""
        return self._query("rt_kv_cache_pool_reserved_block_count", ctypes.c_uint64)

    @property
    def available_block_count(self) -> int:
        """Pages a new reservation can take now (neither reserved nor held by sessions without
        a reservation)."""
        return self._query("rt_kv_cache_pool_available_block_count", ctypes.c_uint64)

    @property
    def block_size(self) -> int:
        return self._query("rt_kv_cache_pool_block_size", ctypes.c_uint64)

    @property
    def block_count(self) -> int:
        return self._query("rt_kv_cache_pool_block_count", ctypes.c_uint64)

    @property
    def blocks_per_full_cache(self) -> int:
        return self._query("rt_kv_cache_pool_blocks_per_full_cache", ctypes.c_uint64)

    @property
    def free_block_count(self) -> int:
        return self._query("rt_kv_cache_pool_free_block_count", ctypes.c_uint64)

    @property
    def leased_block_count(self) -> int:
        return self._query("rt_kv_cache_pool_leased_block_count", ctypes.c_uint64)

    @property
    def prefix_caching(self) -> bool:
        with self._native():
            return self._prefix_caching

    @property
    def cached_block_count(self) -> int:
        """Cached prefix pages no session holds (0 without prefix caching)."""
        return self._query("rt_kv_cache_pool_cached_block_count", ctypes.c_uint64)

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (its pages become plain free pages)."""
        with self._native() as pointer:
            check_status(library().rt_kv_cache_pool_clear_prefix_cache(pointer))

    def __repr__(self) -> str:
        if self.closed:
            return "<KvCachePool (closed)>"
        return (
            f"<KvCachePool block_size={self.block_size} blocks={self.block_count} "
            f"free={self.free_block_count}>"
        )


def decode_session_options(cache: str, block_size: int) -> DecodeSessionOptionsStruct:
    """The native options for ``model.decode_session`` (ValueError/TypeError on bad input)."""
    kind = require_choice(cache, "cache", KV_CACHE_VALUES)
    options = DecodeSessionOptionsStruct()
    check_status(
        library().rt_decode_session_options_init(ctypes.byref(options), ctypes.sizeof(options))
    )
    options.kind = kind
    options.block_size = require_int(block_size, "block_size", 1, UINT64_LIMIT)
    return options


def kv_cache_pool_options(
    block_size: int, block_count: int, prefix_caching: bool = False
) -> KvCachePoolOptionsStruct:
    options = KvCachePoolOptionsStruct()
    check_status(
        library().rt_kv_cache_pool_options_init(ctypes.byref(options), ctypes.sizeof(options))
    )
    options.block_size = require_int(block_size, "block_size", 1, UINT64_LIMIT)
    options.block_count = require_int(block_count, "block_count", 0, UINT64_LIMIT)
    options.prefix_caching = int(require_bool(prefix_caching, "prefix_caching"))
    return options


def _step_arguments(sessions, tokens, name: str):
    """The checked sessions and the flat token buffer of one batched step."""
    sessions = list(sessions)
    tokens = list(tokens)
    if not sessions:
        raise ValueError(f"{name} needs at least one session")
    if len(tokens) != len(sessions):
        raise ValueError(f"{name} got {len(sessions)} sessions but {len(tokens)} token lists")
    for index, session in enumerate(sessions):
        if not isinstance(session, DecodeSession):
            raise TypeError(
                f"sessions[{index}] must be a DecodeSession, not {type(session).__name__}"
            )
    rows = [_flat_ids(row, f"tokens[{index}]") for index, row in enumerate(tokens)]
    counts = (ctypes.c_uint64 * len(rows))(*(len(row.values) for row in rows))
    total = sum(counts)
    flat = (ctypes.c_uint32 * total)()
    offset = 0
    for row in rows:
        ctypes.memmove(
            ctypes.addressof(flat) + offset * ctypes.sizeof(ctypes.c_uint32),
            row.values,
            len(row.values) * ctypes.sizeof(ctypes.c_uint32),
        )
        offset += len(row.values)
    lock = sessions[0]._lock
    if any(session._lock is not lock for session in sessions):
        raise ValueError(f"{name}: every session must belong to the same model")
    return sessions, lock, flat, counts, total


def _session_handles(sessions):
    """The native handles (the caller holds the model's lock)."""
    pointers = []
    for index, session in enumerate(sessions):
        if session._pointer is None:
            raise RuntimeError(f"sessions[{index}]: DecodeSession is closed")
        pointers.append(session._pointer)
    return (ctypes.c_void_p * len(pointers))(*pointers)


def decode_batch(
    sessions: Sequence[DecodeSession], tokens: Sequence[Sequence[int]]
) -> list[array]:
    """Advance ``sessions[i]`` by ``tokens[i]`` (one id = a decode step, several = a prefill
    chunk) in ONE native pass over the model; the logits of each session's last new position,
    one :class:`LogitsRow` (an ``array('f')`` of V floats with ``argmax`` and ``all_finite``)
    per session.

    The sessions must be distinct sessions of one model; they may share one pool (the
    continuous-batching layout) or have private caches (``model.decode_session()``, paged or
    contiguous). On any error (:class:`RiftcoTransformerError`: ``out_of_range`` for an id >= V
    or a session that would pass its capacity, ``runtime_error`` "pool exhausted",
    ``invalid_argument`` for a repeated session) no session changed.
    """
    sessions, lock, flat, counts, total = _step_arguments(sessions, tokens, "decode_batch")
    vocabulary = sessions[0]._vocabulary_size
    logits = (ctypes.c_float * (vocabulary * len(sessions)))()
    required = ctypes.c_uint64()
    with lock:
        handles = _session_handles(sessions)
        check_status(
            library().rt_decode_sessions_step(
                handles,
                len(sessions),
                flat,
                counts,
                total,
                logits,
                len(logits),
                ctypes.byref(required),
            )
        )
    # One array('f') row per session, made at C speed (a tuple of V Python floats per row
    # would cost more than the step itself at GPT-2's vocabulary).
    return _logits_rows(logits, len(sessions), vocabulary)
