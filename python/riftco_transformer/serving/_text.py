"""Token bytes to releasable text: lenient incremental UTF-8 and stop sequences.

Generated text is released token by token, but two things can make the newest bytes
premature: a multibyte UTF-8 character split across tokens (the incremental decoder holds
its incomplete trailing bytes back), and text that may turn out to be the start of a stop
sequence (held back until it either completes the stop, which is then cut with everything
after it, or stops matching). Invalid bytes become U+FFFD; an incomplete character still
pending at the end becomes one U+FFFD.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ..native._validation import describe_value


def lenient_utf8(data: bytes) -> str:
    """``data`` decoded as UTF-8 with replacement characters."""
    return data.decode("utf-8", errors="replace")


class TokenBytes:
    """A tokenizer's bytes per token id, cached (the tokenizer needs ``decode_bytes(ids)``)."""

    def __init__(self, tokenizer) -> None:
        decode = getattr(tokenizer, "decode_bytes", None)
        if not callable(decode):
            raise TypeError(
                f"tokenizer must have decode_bytes(ids) -> bytes, not {type(tokenizer).__name__}"
            )
        self._decode = decode
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = bytes(self._decode([token_id]))
        return cached

    def of_ids(self, token_ids: Sequence[int]) -> bytes:
        """The exact bytes of a row of ids (one tokenizer call)."""
        return bytes(self._decode(list(token_ids))) if token_ids else b""


def require_stop_sequences(stop: object, name: str = "stop") -> tuple[str, ...]:
    """``stop`` (a str, or a sequence of str) as a tuple of nonempty, distinct strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if isinstance(stop, bytes) or not isinstance(stop, Sequence):
        raise TypeError(f"{name} must be a str or a sequence of str, not {type(stop).__name__}")
    sequences = []
    for index, sequence in enumerate(stop):
        if not isinstance(sequence, str):
            raise TypeError(
                f"{name}[{index}] must be a str, not {type(sequence).__name__} "
                f"({describe_value(sequence)})"
            )
        if not sequence:
            raise ValueError(f"{name}[{index}] must not be empty")
        if sequence not in sequences:
            sequences.append(sequence)
    return tuple(sequences)


class IncrementalText:
    """Text assembled from byte pieces, released only once no stop sequence can claim it.

    ``push(data)`` and ``finish()`` return the newly releasable text. When a stop sequence
    appears, the text is cut where it starts (the earliest occurrence; among stops starting
    there, the one listed first), ``stop_sequence`` names it and ``stopped`` is True; later
    pushes are ignored. The releases concatenate to ``text``.
    """

    def __init__(self, stop_sequences: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = stop_sequences
        self._longest_stop = max(map(len, stop_sequences), default=0)
        self._text = ""
        self._released = 0
        self.stop_sequence: str | None = None
        self._finished = False

    @property
    def stopped(self) -> bool:
        return self.stop_sequence is not None

    @property
    def text(self) -> str:
        """Everything released so far."""
        return self._text[: self._released]

    def push(self, data: bytes) -> str:
        if self._finished or self.stopped:
            return ""
        return self._append(self._decoder.decode(data), final=False)

    def finish(self) -> str:
        """Flush the decoder (a pending partial character becomes U+FFFD) and release the rest."""
        if self._finished or self.stopped:
            self._finished = True
            return ""
        released = self._append(self._decoder.decode(b"", final=True), final=True)
        self._finished = True
        return released

    def _append(self, piece: str, final: bool) -> str:
        # A stop not found before ends inside the new piece, so it starts at most
        # len(longest stop) - 1 characters before it.
        search_from = max(self._released, len(self._text) - self._longest_stop + 1)
        self._text += piece
        match = self._earliest_stop(search_from)
        if match is not None:
            start, sequence = match
            self._text = self._text[:start]
            self.stop_sequence = sequence
            end = start
        elif final:
            end = len(self._text)
        else:
            end = len(self._text) - self._stop_prefix_length()
        released = self._text[self._released : end]
        self._released = end
        return released

    def _earliest_stop(self, search_from: int) -> tuple[int, str] | None:
        best = None
        for sequence in self._stops:
            start = self._text.find(sequence, search_from)
            if start >= 0 and (best is None or start < best[0]):
                best = (start, sequence)
        return best

    def _stop_prefix_length(self) -> int:
        """The length of the longest unreleased suffix that starts some stop sequence."""
        unreleased = len(self._text) - self._released
        for length in range(min(self._longest_stop - 1, unreleased), 0, -1):
            suffix = self._text[-length:]
            if any(sequence.startswith(suffix) for sequence in self._stops):
                return length
        return 0
