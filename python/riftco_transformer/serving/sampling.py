"""Choosing the next token from one position's logits (docs/ARCHITECTURE.md, 'Sampling').

A sampler is any object with ``sample(logits, context_ids=()) -> int``: ``logits`` are the V
logits of the position being predicted, ``context_ids`` every token id the model has seen so
far (prompt and generated), which only the penalties read. This module's samplers also take
``prompt_length`` (keyword, default 0): the first ``prompt_length`` context ids are the
prompt, the rest were generated (what the presence and frequency penalties count), and
``mask`` (keyword, default None): a token mask of constrained decoding
(``serving.structured_output``), ``bytes`` of V entries, 0 ruling the id out.

The order of the rules (the order of llama.cpp's chain for penalties, top-k, top-p and
min-p; temperature shapes the probabilities that top-p and min-p read, as it always has
here): the mask (a ruled-out id counts as a logit of -inf: it is never drawn and takes no
place in the top-k), penalties (repetition, then frequency and presence), top-k,
temperature, top-p, min-p, the draw. :func:`apply_mask` writes the -inf logits out, for
samplers that take no mask.

* :class:`Greedy`: the argmax; ties go to the lowest id.
* :class:`TemperatureSampler`: keep the ``top_k`` best ids ranked by (-logit, id); weight
  them ``w = exp((l - l_max) / T)``; with ``top_p`` (1 = off), keep the shortest prefix of
  that ranking whose running sum (in rank order) reaches ``top_p`` times the total (summed
  in ascending id order); with ``min_p``, keep the ids whose weight is at least ``min_p``
  (the top id's weight is 1, so this is "probability >= min_p * the top probability");
  then draw ``u = draw_unit(seed, k)`` in [0, 1) for the sampler's k-th draw and, walking
  the kept ids in ascending order, return the first whose running weight sum exceeds
  ``u * sum(kept w)`` (same order), or the last kept id of positive weight when rounding
  leaves none. Walking ids in ascending order means a draw without top-k or top-p sorts
  nothing.
* The library samples ``array('f')`` rows (the decode path's) with the same rules in C
  (``native.sampling``): every double is computed by the same operations in the same
  order, so both give the same id bit for bit; other rows take the Python code here, which
  is the C code's oracle in the tests.
* The repetition penalty (CTRL, Keskar et al. 2019) divides the positive logits of ids in
  the context by ``penalty`` and multiplies the others by it, once per distinct id, before
  either rule; ``penalty = 1`` changes nothing.
* The presence and frequency penalties (OpenAI's definitions), after it:
  ``l -= presence_penalty * [count > 0] + frequency_penalty * count``, ``count`` being how
  often the id occurs among the *generated* ids (``context_ids[prompt_length:]``).

Validation names the argument and the value: TypeError for a wrong type (a bool is never a
number here), ValueError for a value outside its domain.
"""

from __future__ import annotations

import heapq
import math
import numbers
from array import array
from collections.abc import Sequence
from itertools import accumulate, compress
from typing import Protocol, runtime_checkable

from ..native._validation import UINT64_LIMIT, describe_value, require_int, require_real
from ..native.decode import LogitsRow


@runtime_checkable
class Sampler(Protocol):
    def sample(self, logits: Sequence[float], context_ids: Sequence[int] = ()) -> int: ...


# ---- argument rules (GenerationConfig uses the same ones) ----------------------------------


def require_temperature(value: object, name: str = "temperature") -> float:
    """A finite temperature > 0."""
    number = require_real(value, name)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be finite and > 0, got {number!r}")
    return number


def require_top_k(value: object, name: str = "top_k") -> int:
    """An int >= 1 (checked against the vocabulary when sampling)."""
    return require_int(value, name, 1, UINT64_LIMIT)


def require_top_p(value: object, name: str = "top_p") -> float:
    """A probability mass in (0, 1]."""
    number = require_real(value, name)
    if not 0.0 < number <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {number!r}")
    return number


def require_repetition_penalty(value: object, name: str = "repetition_penalty") -> float:
    """A finite penalty > 0 (1 = no penalty)."""
    number = require_real(value, name)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be finite and > 0, got {number!r}")
    return number


def require_occurrence_penalty(value: object, name: str) -> float:
    """A presence or frequency penalty in [-2, 2] (0 = no penalty), as OpenAI allows."""
    number = require_real(value, name)
    if not -2.0 <= number <= 2.0:
        raise ValueError(f"{name} must be in [-2, 2], got {number!r}")
    return number


def require_min_p(value: object, name: str = "min_p") -> float:
    """A fraction of the top probability in [0, 1] (0 = no filter)."""
    number = require_real(value, name)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {number!r}")
    return number


def require_seed(value: object, name: str = "seed") -> int:
    """A seed in [0, 2**64)."""
    return require_int(value, name, 0, UINT64_LIMIT)


def require_logits(logits: object) -> Sequence[float]:
    """``logits`` as a nonempty sequence of finite floats.

    The native decode path hands over ``LogitsRow`` arrays whose finiteness the library
    already checked; other ``array('f'/'d')`` rows are floats by construction, so only
    finiteness is checked, at C speed (a float32 row's sum cannot overflow a double, so it is
    finite exactly when every element is). Anything else is checked element by element and
    copied into a list.
    """
    if isinstance(logits, LogitsRow) and len(logits) and logits.all_finite:
        return logits  # the library checked every value
    if isinstance(logits, array) and logits.typecode in ("f", "d"):
        if len(logits) == 0:
            raise ValueError("logits must not be empty")
        if math.isfinite(sum(logits)):
            return logits
        for index, number in enumerate(logits):
            if not math.isfinite(number):
                raise ValueError(f"logits[{index}] must be finite, got {number!r}")
    if isinstance(logits, (str, bytes)) or not isinstance(logits, Sequence):
        raise TypeError(f"logits must be a sequence of numbers, not {type(logits).__name__}")
    if len(logits) == 0:
        raise ValueError("logits must not be empty")
    values = []
    for index, value in enumerate(logits):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"logits[{index}] must be a real number, not {type(value).__name__} "
                f"({describe_value(value)})"
            )
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"logits[{index}] must be finite, got {number!r}")
        values.append(number)
    return values


def apply_repetition_penalty(
    logits: Sequence[float], context_ids: Sequence[int], penalty: float
) -> Sequence[float]:
    """The logits with ids of ``context_ids`` penalised: ``l / penalty`` where ``l > 0``,
    else ``l * penalty`` (each distinct id once), as a new list; ``logits`` itself (never
    modified) when the penalty is 1. A context id outside ``[0, V)`` is a ValueError."""
    if penalty == 1.0:
        return logits
    values = list(logits)
    for token in set(context_ids):
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"context ids must be ints, not {type(token).__name__}")
        if not 0 <= token < len(values):
            raise ValueError(
                f"context id {token} is outside the vocabulary of {len(values)} logits"
            )
        value = values[token]
        values[token] = value / penalty if value > 0 else value * penalty
    return values


def apply_penalties(
    logits: Sequence[float],
    context_ids: Sequence[int],
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    prompt_length: int = 0,
) -> Sequence[float]:
    """Every penalty, in order: the repetition penalty over ``context_ids``, then
    ``l -= presence_penalty * [count > 0] + frequency_penalty * count`` with the counts of
    ``context_ids[prompt_length:]`` (the generated ids). ``logits`` itself when none
    applies; otherwise a new list."""
    values = apply_repetition_penalty(logits, context_ids, repetition_penalty)
    if presence_penalty == 0.0 and frequency_penalty == 0.0:
        return values
    values = list(values)
    counts: dict[int, int] = {}
    for token in context_ids[prompt_length:]:
        counts[token] = counts.get(token, 0) + 1
    for token, count in counts.items():
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"context ids must be ints, not {type(token).__name__}")
        if not 0 <= token < len(values):
            raise ValueError(
                f"context id {token} is outside the vocabulary of {len(values)} logits"
            )
        values[token] -= presence_penalty + frequency_penalty * count
    return values


# ---- token masks (constrained decoding) --------------------------------------------------------

_MASKED_OUT = bytes([1] + [0] * 255)  # bytes.translate: 0 (masked) -> 1, anything else -> 0


def _require_mask(mask: object, size: int) -> bytes:
    if not isinstance(mask, (bytes, bytearray)):
        raise TypeError(f"mask must be bytes (1 = allowed), not {type(mask).__name__}")
    if len(mask) != size:
        raise ValueError(f"mask has {len(mask)} entries for {size} logits")
    if mask.count(0) == size:  # C speed; the same error whichever path samples
        raise ValueError("the token mask allows no token")
    return mask


def masked_candidates(logits: Sequence[float], mask: bytes) -> tuple[list[int], list[float]]:
    """The ids a token mask allows (``mask[id]`` nonzero), ascending, and their logits
    (C-speed selection). ValueError when it allows none."""
    _require_mask(mask, len(logits))
    ids = list(compress(range(len(mask)), mask))
    if not ids:
        raise ValueError("the token mask allows no token")
    return ids, list(compress(logits, mask))


def apply_mask(logits: Sequence[float], mask: bytes) -> array:
    """``logits`` as a new ``array('f')`` with ``-inf`` at every id the mask rules out
    (``mask[id] == 0``), for samplers that take no ``mask=`` (this module's take one, which
    is applied first, before the penalties, top-k, temperature, top-p and min-p)."""
    _require_mask(mask, len(logits))
    row = array("f", logits)
    negative = -math.inf
    for token in compress(range(len(mask)), mask.translate(_MASKED_OUT)):
        row[token] = negative
    return row


# ---- the samplers ----------------------------------------------------------------------------


def draw_unit(seed: int, draw_index: int) -> float:
    """The uniform number in [0, 1) of a seed's ``draw_index``-th draw: the top 53 bits of
    splitmix64's output for the state ``seed + (draw_index + 1) * 0x9E3779B97F4A7C15`` (mod
    2**64), times 2**-53. The library's samplers draw the same numbers."""
    z = (seed + (draw_index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


_MASK64 = (1 << 64) - 1
_NATIVE_SAMPLING: list[bool] = []  # [available], once the library was asked


def _native_row(logits: Sequence[float]) -> bool:
    """Whether the library samples this row: a float32 row it reads in place."""
    if not (isinstance(logits, array) and logits.typecode == "f"):
        return False
    if not _NATIVE_SAMPLING:
        try:
            from ..native._loader import library

            _NATIVE_SAMPLING.append(hasattr(library(), "rt_sample_f32_row"))
        except (ImportError, OSError):
            _NATIVE_SAMPLING.append(False)
    return _NATIVE_SAMPLING[0]


class _Rules:
    """What both samplers share: the penalties, and the library's options for their rules
    (Greedy keeps the class defaults: temperature 0, no truncation)."""

    temperature = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed = 0

    def _set_penalties(self, repetition_penalty: float, presence_penalty: float,
                       frequency_penalty: float) -> None:
        self.repetition_penalty = require_repetition_penalty(repetition_penalty)
        self.presence_penalty = require_occurrence_penalty(presence_penalty,
                                                           "presence_penalty")
        self.frequency_penalty = require_occurrence_penalty(frequency_penalty,
                                                            "frequency_penalty")
        self._native_options = None

    @property
    def penalised(self) -> bool:
        """Whether a penalty reads the context."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def native_options(self):
        """The library's options for these rules (made once)."""
        if self._native_options is None:
            from ..native.sampling import sampling_options

            self._native_options = sampling_options(
                self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty,
                self.presence_penalty, self.frequency_penalty, self.seed)
        return self._native_options


class Greedy(_Rules):
    """The argmax of the (penalised) logits; ties go to the lowest id."""

    def __init__(self, repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0) -> None:
        self._set_penalties(repetition_penalty, presence_penalty, frequency_penalty)

    def sample(self, logits: Sequence[float], context_ids: Sequence[int] = (), *,
               prompt_length: int = 0, mask: bytes | None = None) -> int:
        checked = require_logits(logits)
        penalised = self.penalised
        if mask is None and isinstance(checked, LogitsRow) and not penalised:
            return checked.argmax  # the library's first maximum (the same rule)
        if mask is not None:
            _require_mask(mask, len(checked))
        if _native_row(checked):
            from ..native.sampling import sample_f32_row

            if not penalised:  # the penalties alone read the context
                context_ids, prompt_length = (), 0
            return sample_f32_row(checked, self.native_options(), context_ids, prompt_length,
                                  mask)
        values = apply_penalties(checked, context_ids, self.repetition_penalty,
                                 self.presence_penalty, self.frequency_penalty, prompt_length)
        if mask is not None:
            ids, kept = masked_candidates(values, mask)
            return ids[kept.index(max(kept))]  # ids ascend: the lowest id wins a tie
        return values.index(max(values))  # the first maximum: the lowest id wins a tie

    def __repr__(self) -> str:
        return (f"Greedy(repetition_penalty={self.repetition_penalty!r}, "
                f"presence_penalty={self.presence_penalty!r}, "
                f"frequency_penalty={self.frequency_penalty!r})")


class TemperatureSampler(_Rules):
    """Temperature sampling with optional top-k, nucleus (top-p) and min-p truncation.

    ``temperature`` is finite and > 0; ``top_k`` (None: every id) is an int >= 1 and at most
    the vocabulary size (checked when sampling); ``top_p`` (None: no nucleus) is in (0, 1];
    ``seed`` in [0, 2**64) numbers the sampler's draws (:func:`draw_unit`), so two samplers
    with the same arguments draw the same ids for the same logits. ``draws`` counts the
    draws made so far.
    """

    def __init__(
        self,
        temperature: float,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        min_p: float | None = None,
    ) -> None:
        self.temperature = require_temperature(temperature)
        self.top_k = None if top_k is None else require_top_k(top_k)
        self.top_p = None if top_p is None else require_top_p(top_p)
        self.seed = require_seed(seed)
        self._set_penalties(repetition_penalty, presence_penalty, frequency_penalty)
        self.min_p = None if min_p is None else require_min_p(min_p)
        self.draws = 0

    def sample(self, logits: Sequence[float], context_ids: Sequence[int] = (), *,
               prompt_length: int = 0, mask: bytes | None = None) -> int:
        checked = require_logits(logits)
        vocabulary = len(checked)
        if self.top_k is not None and self.top_k > vocabulary:
            raise ValueError(f"top_k={self.top_k} exceeds the vocabulary size {vocabulary}")
        if mask is not None:
            _require_mask(mask, vocabulary)
        if _native_row(checked):
            from ..native.sampling import sample_f32_row

            if not self.penalised:  # the penalties alone read the context
                context_ids, prompt_length = (), 0
            token = sample_f32_row(checked, self.native_options(), context_ids, prompt_length,
                                   mask, self.draws)
        else:
            token = self.sample_reference(checked, context_ids, prompt_length=prompt_length,
                                          mask=mask, draw_index=self.draws)
        self.draws += 1
        return token

    def sample_reference(self, logits: Sequence[float], context_ids: Sequence[int] = (), *,
                         prompt_length: int = 0, mask: bytes | None = None,
                         draw_index: int = 0) -> int:
        """The rules in Python (the library's oracle): the id of draw ``draw_index``, counting
        no draw."""
        values = apply_penalties(
            require_logits(logits), context_ids, self.repetition_penalty,
            self.presence_penalty, self.frequency_penalty, prompt_length,
        )
        ids: Sequence[int] = range(len(values))
        if mask is not None:
            ids, _ = masked_candidates(values, mask)
        if self.top_k is not None and self.top_k < len(ids):
            # heapq.nsmallest is stable: equal values keep ascending ids.
            ids = sorted(heapq.nsmallest(self.top_k, ids, key=lambda token: -values[token]))
        highest = max(values[token] for token in ids)
        temperature = self.temperature
        weight = {token: math.exp((values[token] - highest) / temperature) for token in ids}
        if self.top_p is not None and self.top_p < 1.0:
            target = self.top_p * _plain_sum(weight[token] for token in ids)
            ranked = sorted(ids, key=lambda token: -values[token])  # stable: ids ascend
            end = len(ranked)
            for index, cumulative in enumerate(accumulate(weight[t] for t in ranked), 1):
                if cumulative >= target:
                    end = index
                    break
            ids = sorted(ranked[:end])
        if self.min_p:
            ids = [token for token in ids if weight[token] >= self.min_p]
        threshold = draw_unit(self.seed, draw_index) * _plain_sum(weight[t] for t in ids)
        last_positive = ids[0]
        for token, cumulative in zip(ids, accumulate(weight[t] for t in ids), strict=True):
            if cumulative > threshold:
                return token
            if weight[token] > 0.0:
                last_positive = token
        return last_positive  # rounding left the threshold at (or past) the total

    def __repr__(self) -> str:
        return (
            f"TemperatureSampler(temperature={self.temperature!r}, top_k={self.top_k!r}, "
            f"top_p={self.top_p!r}, seed={self.seed!r}, "
            f"repetition_penalty={self.repetition_penalty!r}, "
            f"presence_penalty={self.presence_penalty!r}, "
            f"frequency_penalty={self.frequency_penalty!r}, min_p={self.min_p!r})"
        )


def _plain_sum(values) -> float:
    """Left-to-right float addition (``sum`` compensates rounding from Python 3.12 on; the
    library adds plainly)."""
    total = 0.0
    for value in values:
        total += value
    return total
