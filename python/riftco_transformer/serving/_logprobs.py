"""Log-probabilities of one position's logits, cheaply enough to run per generated token
(``serving.generation``: OpenAI's ``logprobs``)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from itertools import repeat
from operator import sub

from ..native.decode import LogitsRow


def log_probabilities(
    logits: Sequence[float], token_id: int, top_count: int = 0
) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The log-softmax of ``logits`` (finite, e.g. checked by a sampler) at ``token_id``, and
    the ``top_count`` most likely ids with theirs, most likely first (ties: the lower id
    first), as ``(logprob, ((id, logprob), ...))``.

    One pass for the maximum (none for a full ``LogitsRow``, whose argmax the library
    found), one for ``log(sum(exp(l - max)))`` in double precision, and a partial selection
    (``heapq.nlargest``) of the top values, whose ids ``index`` finds at C speed. About
    2 ms per row of V = 49,152 on one core, 3.5 ms with five alternatives.
    """
    if isinstance(logits, LogitsRow) and len(logits) and logits.all_finite:
        highest = logits[logits.argmax]
    else:
        highest = max(logits)
    normaliser = highest + math.log(sum(map(math.exp, map(sub, logits, repeat(highest)))))
    top: list[tuple[int, float]] = []
    if top_count:
        previous, start = None, 0
        for value in heapq.nlargest(top_count, logits):
            start = start if value == previous else 0  # equal values: the next such id
            token = logits.index(value, start)
            top.append((token, value - normaliser))
            previous, start = value, token + 1
    return logits[token_id] - normaliser, tuple(top)
