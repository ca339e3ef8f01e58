"""The library's samplers over one row of logits (C ABI 2.15; docs/ARCHITECTURE.md, 'Sampling').

:func:`sample_f32_row` and :func:`row_log_probabilities` take an ``array('f')`` row (a
:class:`~riftco_transformer.native.decode.LogitsRow` from the decode path, or any float32
array) without copying it. They follow the rules of ``serving.sampling``'s reference samplers
and return the same ids bit for bit; ``serving.sampling`` calls them for float32 rows.
Arguments are validated by the callers (``serving.sampling``'s ``require_*``); the library
checks them again and names any value it refuses.
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from ._abi import MAX_TOP_LOGPROBS, SamplingOptionsStruct, SamplingRowStruct
from ._errors import check_status
from ._loader import library

_FLOAT_POINTER = ctypes.POINTER(ctypes.c_float)
_BYTE_POINTER = ctypes.POINTER(ctypes.c_uint8)
_ID_POINTER = ctypes.POINTER(ctypes.c_uint32)


def _row_pointer(row: array):
    if not isinstance(row, array) or row.typecode != "f":
        raise TypeError(f"the row must be array('f'), not {type(row).__name__}")
    address, length = row.buffer_info()
    return ctypes.cast(address, _FLOAT_POINTER), length


def sampling_options(
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    seed: int = 0,
) -> SamplingOptionsStruct:
    """The native options (None: the rule is off)."""
    options = SamplingOptionsStruct()
    check_status(library().rt_sampling_options_init(ctypes.byref(options), ctypes.sizeof(options)))
    options.temperature = temperature
    options.top_k = top_k or 0
    options.top_p = 1.0 if top_p is None else top_p
    options.min_p = min_p or 0.0
    options.repetition_penalty = repetition_penalty
    options.presence_penalty = presence_penalty
    options.frequency_penalty = frequency_penalty
    options.seed = seed
    return options


def sample_f32_row(
    row: array,
    options: SamplingOptionsStruct,
    context_ids: Sequence[int] = (),
    prompt_length: int = 0,
    mask: bytes | None = None,
    draw_index: int = 0,
) -> int:
    """The id the rules choose from ``row`` (ValueError naming a refused value)."""
    logits, vocabulary = _row_pointer(row)
    context = array("I", context_ids) if context_ids else None
    context_pointer = None
    context_count = 0
    if context is not None:
        context_pointer = ctypes.cast(context.buffer_info()[0], _ID_POINTER)
        context_count = len(context)
    mask_pointer = None
    if mask is not None:
        if len(mask) != vocabulary:
            raise ValueError(f"mask has {len(mask)} entries for {vocabulary} logits")
        mask_pointer = ctypes.cast(ctypes.c_char_p(bytes(mask)), _BYTE_POINTER)
    token = ctypes.c_uint32()
    check_status(
        library().rt_sample_f32_row(
            logits,
            vocabulary,
            ctypes.byref(options),
            context_pointer,
            context_count,
            prompt_length,
            mask_pointer,
            draw_index,
            ctypes.byref(token),
        )
    )
    return token.value


def row_log_probabilities(
    row: array, token_id: int, top_count: int = 0
) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The log-softmax of ``row`` at ``token_id`` and the ``top_count`` most likely ids with
    theirs, most likely first (ties: the lower id first)."""
    logits, vocabulary = _row_pointer(row)
    value = ctypes.c_double()
    top_ids = (ctypes.c_uint32 * max(top_count, 1))()
    top_values = (ctypes.c_double * max(top_count, 1))()
    check_status(
        library().rt_f32_row_log_probabilities(
            logits, vocabulary, token_id, top_count, ctypes.byref(value), top_ids, top_values
        )
    )
    return value.value, tuple((top_ids[i], top_values[i]) for i in range(top_count))


@dataclass(frozen=True)
class RowSamplingPlan:
    """How the library samples one row of a batched step (:func:`decode_batch_sample`):
    ``options`` from :func:`sampling_options` (None: greedy), the penalties' ``context_ids``
    and ``prompt_length``, a token ``mask`` (bytes of ``vocabulary_limit`` or V entries, 0:
    never drawn), the request's ``draw_index``, ``vocabulary_limit`` (ids below it; 0: V, a
    padded vocabulary's tokenizer size otherwise), and whether the chosen id's
    ``log_probability`` and ``top_count`` alternatives (at most 20) come back."""

    options: SamplingOptionsStruct | None = None
    context_ids: Sequence[int] = ()
    prompt_length: int = 0
    mask: bytes | None = None
    draw_index: int = 0
    vocabulary_limit: int = 0
    log_probability: bool = False
    top_count: int = 0


@dataclass(frozen=True)
class SampledRow:
    """What a row of :func:`decode_batch_sample` gave: ``status`` ``"sampled"`` (``token``,
    and ``log_probability``/``top`` when asked), ``"fed"`` (a row without a plan) or
    ``"not_finite"`` (its logits were not all finite: the step still happened)."""

    status: str
    token: int = 0
    log_probability: float | None = None
    top: tuple[tuple[int, float], ...] = ()


_ROW_STATUS = {0: "fed", 1: "sampled", 2: "not_finite"}


def decode_batch_sample(sessions, tokens, plans) -> list[SampledRow]:
    """:func:`~riftco_transformer.native.decode.decode_batch`'s step, then every row with a
    plan (``plans[i]``, or None for a row that only feeds) sampled by the library, in parallel
    over rows, without copying logits out (``rt_decode_sessions_step_sample``). Every plan is
    checked before the step: a refused call changes no session."""
    from .decode import _session_handles, _step_arguments

    sessions, lock, flat, counts, total = _step_arguments(sessions, tokens,
                                                          "decode_batch_sample")
    plans = list(plans)
    if len(plans) != len(sessions):
        raise ValueError(f"decode_batch_sample got {len(sessions)} sessions but {len(plans)} "
                         "plans")
    count = len(sessions)
    rows = (SamplingRowStruct * count)()
    keep = []  # the buffers the rows point into, alive until the call returns
    for index, plan in enumerate(plans):
        row = rows[index]
        row.struct_size = ctypes.sizeof(SamplingRowStruct)
        if plan is None:
            continue
        row.sample = 1
        if plan.options is not None:
            row.options = ctypes.pointer(plan.options)
        if plan.context_ids:
            context = array("I", plan.context_ids)
            keep.append(context)
            row.context = ctypes.cast(context.buffer_info()[0], _ID_POINTER)
            row.context_count = len(context)
            row.prompt_length = plan.prompt_length
        if plan.mask is not None:
            mask = bytes(plan.mask)
            keep.append(mask)
            row.mask = ctypes.cast(ctypes.c_char_p(mask), _BYTE_POINTER)
        row.draw_index = plan.draw_index
        row.vocabulary_limit = plan.vocabulary_limit
        row.log_probability = int(plan.log_probability)
        row.top_count = plan.top_count
    ids = (ctypes.c_uint32 * count)()
    status = (ctypes.c_uint8 * count)()
    log_probabilities = (ctypes.c_double * count)()
    top_ids = (ctypes.c_uint32 * (count * MAX_TOP_LOGPROBS))()
    top_values = (ctypes.c_double * (count * MAX_TOP_LOGPROBS))()
    with lock:
        handles = _session_handles(sessions)
        check_status(library().rt_decode_sessions_step_sample(
            handles, count, flat, counts, total, rows, ids, status, log_probabilities,
            top_ids, top_values))
    results = []
    for index, plan in enumerate(plans):
        name = _ROW_STATUS[status[index]]
        if name != "sampled":
            results.append(SampledRow(name))
            continue
        base = index * MAX_TOP_LOGPROBS
        results.append(SampledRow(
            name, ids[index],
            log_probabilities[index] if plan.log_probability else None,
            tuple((top_ids[base + j], top_values[base + j]) for j in range(plan.top_count))))
    return results
