"""Next-token training windows, checkpointable batch sources, and memory-mapped token files.

A window of context ``T`` starting at ``s`` is ``inputs = c[s : s+T]`` and ``targets =
c[s+1 : s+T+1]`` (docs/ARCHITECTURE.md, 'Training windows'). A sequence of ``N`` tokens has
``N - T`` valid starts, so it needs at least ``T + 1`` tokens. Rows are drawn uniformly,
independently and with replacement by a private generator (Python's Mersenne Twister,
``random.Random(seed)``, identical on every platform), seeded separately from model initialisation.

Every source can :meth:`~WindowBatchSource.capture_state` and
:meth:`~WindowBatchSource.restore_state`: ``{type, fingerprint, batches_emitted, rng}``,
where the fingerprint is a SHA-256 over a domain tag, the source type and sampling, the
batch and context sizes, the sequence count and every sequence (its length, then the SHA-256
of its tokens as little-endian uint32, then that of its target mask if any). A
:class:`TokenFile` stores its tokens' SHA-256, so a memory-mapped corpus is never read
whole to fingerprint it. Restoring checks the type, the fingerprint and the generator state
before it changes anything, so an exact-resume checkpoint can never continue on other data.

Large corpora live in a :class:`TokenFile`: tokenized once, written to disk, memory-mapped,
so training reads only the pages its windows touch.
"""

from __future__ import annotations

import bisect
import hashlib
import mmap
import os
import random
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._files import atomic_write

WINDOW_UNIFORM = "window_uniform"
EXAMPLE_UNIFORM = "example_uniform"
SAMPLING_STRATEGIES = (EXAMPLE_UNIFORM, WINDOW_UNIFORM)
_FINGERPRINT_TAG = b"riftco-transformer/batch-source/v1\0"


@dataclass(frozen=True)
class TrainingBatch:
    """``inputs`` and ``targets``: ``batch_size`` rows of ``context_size`` ids (``array('I')``).

    ``target_mask`` is None (every target counts) or one ``bytes`` row per batch row, 1 where
    the target counts toward the loss (response-only post-training). ``positions`` is None
    (each row is one sequence, at positions 0..) or, for packed rows, one ``array('I')`` per
    row of each token's position inside its document (:mod:`.example_batching`).
    """

    inputs: tuple[array, ...]
    targets: tuple[array, ...]
    target_mask: tuple[bytes, ...] | None = None
    positions: tuple[array, ...] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.inputs)

    @property
    def context_size(self) -> int:
        return len(self.inputs[0])

    @property
    def token_count(self) -> int:
        return len(self.inputs) * len(self.inputs[0])


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _seed(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _as_token_row(sequence: object, index: int):
    if isinstance(sequence, array) and sequence.typecode == "I":
        return sequence
    if isinstance(sequence, memoryview) and sequence.format == "I":
        return sequence
    try:
        return array("I", sequence)
    except (TypeError, OverflowError) as error:
        raise ValueError(f"sequences[{index}] must hold token ids in [0, 2**32): {error}") from None


class WindowBatchSource:
    """Batches of windows from one or several token sequences (see the module docstring).

    ``sampling`` is ``"window_uniform"`` (uniform over every window of every sequence) or
    ``"example_uniform"`` (a sequence uniformly, then a window uniformly inside it, so long
    examples get no more weight). Windows never cross sequence boundaries; sequences shorter
    than ``context_size + 1`` tokens are dropped, and a ValueError says so when none is left.
    ``masks`` (optional, one bytes-like per sequence, same length) marks which tokens count
    as targets (1) for a response-only loss; then only windows with at least one marked
    target are drawn (a window of prompt tokens alone would teach nothing), and sequences
    without one are dropped too.
    """

    source_type = "sequence_window"

    def __init__(
        self,
        sequences: Sequence,
        batch_size: int,
        context_size: int,
        random_seed: int,
        sampling: str = WINDOW_UNIFORM,
        masks: Sequence | None = None,
        sequence_digests: Sequence[bytes] | None = None,
    ) -> None:
        self.batch_size = _positive(batch_size, "batch_size")
        self.context_size = _positive(context_size, "context_size")
        self.random_seed = _seed(random_seed, "random_seed")
        if sampling not in SAMPLING_STRATEGIES:
            raise ValueError(f"sampling must be one of {SAMPLING_STRATEGIES}, got {sampling!r}")
        self.sampling = sampling
        if masks is not None and len(masks) != len(sequences):
            raise ValueError(f"masks has {len(masks)} rows for {len(sequences)} sequences")
        rows = [_as_token_row(sequence, index) for index, sequence in enumerate(sequences)]
        mask_rows = None if masks is None else [bytes(mask) for mask in masks]
        if mask_rows is not None:
            for index, (row, mask) in enumerate(zip(rows, mask_rows, strict=True)):
                if len(mask) != len(row):
                    raise ValueError(
                        f"masks[{index}] has {len(mask)} entries for {len(row)} tokens"
                    )
        starts = None
        if mask_rows is not None:
            starts = [_marked_starts(mask, self.context_size) for mask in mask_rows]
        usable = [
            index
            for index, row in enumerate(rows)
            if len(row) >= self.context_size + 1 and (starts is None or len(starts[index]))
        ]
        if not usable:
            raise ValueError(
                f"no sequence has at least context_size + 1 = {self.context_size + 1} tokens"
            )
        self._sequences = [rows[index] for index in usable]
        self._digests = (
            None if sequence_digests is None
            else [bytes(sequence_digests[index]) for index in usable]
        )
        self._masks = None if mask_rows is None else [mask_rows[index] for index in usable]
        self._starts = None if starts is None else [starts[index] for index in usable]
        self.dropped_sequence_count = len(rows) - len(usable)
        self._first_window = []
        total = 0
        for index in range(len(self._sequences)):
            self._first_window.append(total)
            total += self._window_count(index)
        self.window_count = total
        self._generator = random.Random(self.random_seed)
        self.batches_emitted = 0
        self._fingerprint: str | None = None

    @property
    def sequence_count(self) -> int:
        return len(self._sequences)

    @property
    def token_count(self) -> int:
        return sum(len(row) for row in self._sequences)

    def _window_count(self, sequence: int) -> int:
        if self._starts is not None:
            return len(self._starts[sequence])
        return len(self._sequences[sequence]) - self.context_size

    def _draw(self) -> tuple[int, int]:
        below = self._generator.randrange
        if self.sampling == EXAMPLE_UNIFORM:
            sequence = below(len(self._sequences))
            window = below(self._window_count(sequence))
        else:
            flat = below(self.window_count)
            sequence = bisect.bisect_right(self._first_window, flat) - 1
            window = flat - self._first_window[sequence]
        return sequence, window if self._starts is None else self._starts[sequence][window]

    def next(self) -> TrainingBatch:
        """The next batch (advances the generator and ``batches_emitted``)."""
        context = self.context_size
        inputs, targets, masks = [], [], []
        for _ in range(self.batch_size):
            sequence, start = self._draw()
            row = self._sequences[sequence]
            inputs.append(array("I", row[start : start + context]))
            targets.append(array("I", row[start + 1 : start + context + 1]))
            if self._masks is not None:
                masks.append(self._masks[sequence][start + 1 : start + context + 1])
        self.batches_emitted += 1
        return TrainingBatch(
            tuple(inputs), tuple(targets), None if self._masks is None else tuple(masks)
        )

    __next__ = next

    def __iter__(self):
        return self

    # ---- checkpointing --------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the source's identity and data (computed once)."""
        if self._fingerprint is None:
            digest = hashlib.sha256(_FINGERPRINT_TAG)
            digest.update(self.source_type.encode() + b"\0" + self.sampling.encode() + b"\0")
            digest.update(
                struct.pack("<QQQ", self.batch_size, self.context_size, len(self._sequences))
            )
            for index, row in enumerate(self._sequences):
                digest.update(struct.pack("<Q", len(row)))
                digest.update(
                    self._digests[index] if self._digests is not None else token_digest(row)
                )
                if self._masks is not None:
                    digest.update(hashlib.sha256(self._masks[index]).digest())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def capture_state(self) -> dict:
        """The JSON-serialisable position: type, fingerprint, batches emitted, generator."""
        return source_state(self)

    def restore_state(self, state: object) -> None:
        """Continue exactly where :meth:`capture_state` was taken; ValueError (and nothing
        changed) for another source type, other data or a malformed generator state."""
        generator_state, emitted = self.check_state(state)
        self._generator.setstate(generator_state)
        self.batches_emitted = emitted

    def check_state(self, state: object) -> tuple[tuple, int]:
        """Validate ``state`` against this source without changing it; returns what
        :meth:`restore_state` applies."""
        if (
            not isinstance(state, dict)
            or set(state) != {"type", "fingerprint", "batches_emitted", "rng"}
        ):
            raise ValueError("batch source state must have type, fingerprint, batches_emitted, rng")
        if state["type"] != self.source_type:
            raise ValueError(
                f"batch source state is for a {state['type']!r} source, not {self.source_type!r}"
            )
        if state["fingerprint"] != self.fingerprint:
            raise ValueError(
                "batch source fingerprint differs: the checkpoint was taken on other data, batch "
                "size, context size or sampling"
            )
        emitted = state["batches_emitted"]
        if isinstance(emitted, bool) or not isinstance(emitted, int) or emitted < 0:
            raise ValueError(f"batches_emitted must be an int >= 0, got {emitted!r}")
        rng = state["rng"]
        if not isinstance(rng, dict) or set(rng) != {"version", "state", "gauss_next"}:
            raise ValueError("batch source rng must have version, state, gauss_next")
        internal = rng["state"]
        if (
            rng["version"] != 3
            or not isinstance(internal, list)
            or len(internal) != 625
            or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32
                for v in internal[:624]
            )
            or not isinstance(internal[624], int)
            or not 0 <= internal[624] <= 624
            or not (rng["gauss_next"] is None or isinstance(rng["gauss_next"], float))
        ):
            raise ValueError("batch source rng state is malformed")
        candidate = (3, tuple(internal), rng["gauss_next"])
        try:
            random.Random().setstate(candidate)
        except (TypeError, ValueError) as error:
            raise ValueError(f"batch source rng state is invalid: {error}") from None
        return candidate, emitted


class RandomWindowBatchSource(WindowBatchSource):
    """Windows of one flat token sequence (a list, ``array('I')`` or a :class:`TokenFile`)."""

    source_type = "random_window"

    def __init__(self, tokens, batch_size: int, context_size: int, random_seed: int) -> None:
        digests = None
        if isinstance(tokens, TokenFile):
            digests = [tokens.token_sha256]
            tokens = tokens.tokens
        length = len(tokens)
        if length < _positive(context_size, "context_size") + 1:
            raise ValueError(
                f"the token sequence has {length} tokens; it needs at least context_size + 1 = "
                f"{context_size + 1}"
            )
        super().__init__(
            [tokens], batch_size, context_size, random_seed, WINDOW_UNIFORM,
            sequence_digests=digests,
        )


class SequenceWindowBatchSource(WindowBatchSource):
    """Uniform over every window of every sequence ("window_uniform")."""

    source_type = "sequence_window"

    def __init__(self, sequences, batch_size, context_size, random_seed, masks=None) -> None:
        super().__init__(sequences, batch_size, context_size, random_seed, WINDOW_UNIFORM, masks)


class ExampleWindowBatchSource(WindowBatchSource):
    """A sequence uniformly, then a window inside it ("example_uniform")."""

    source_type = "example_window"

    def __init__(self, sequences, batch_size, context_size, random_seed, masks=None) -> None:
        super().__init__(sequences, batch_size, context_size, random_seed, EXAMPLE_UNIFORM, masks)


def _marked_starts(mask: bytes, context: int) -> array:
    """Window starts s whose targets mask[s+1 : s+context+1] hold at least one 1."""
    starts = array("I")
    marked = [index for index, flag in enumerate(mask) if flag]
    for start in range(0, max(0, len(mask) - context)):
        # the first marked position > start must be <= start + context
        position = bisect.bisect_right(marked, start)
        if position < len(marked) and marked[position] <= start + context:
            starts.append(start)
    return starts


def source_state(source) -> dict:
    """A checkpointable source's JSON-serialisable position, the one record every source
    writes: ``{type, fingerprint, batches_emitted, rng}`` (its ``random.Random``'s state)."""
    version, internal, gauss = source._generator.getstate()
    return {
        "type": source.source_type,
        "fingerprint": source.fingerprint,
        "batches_emitted": source.batches_emitted,
        "rng": {"version": version, "state": list(internal), "gauss_next": gauss},
    }


def fixed_batches(source: WindowBatchSource, count: int) -> tuple[TrainingBatch, ...]:
    """``count`` batches drawn from ``source``: a deterministic evaluation set."""
    return tuple(source.next() for _ in range(_positive(count, "count")))


def token_digest(row) -> bytes:
    """SHA-256 of a token row as little-endian uint32."""
    digest = hashlib.sha256()
    _update_with_tokens(digest, row)
    return digest.digest()


def _update_with_tokens(digest, row) -> None:
    step = 1 << 20
    for start in range(0, len(row), step):
        piece = row[start : start + step]
        if sys.byteorder == "little":
            digest.update(memoryview(piece).cast("B") if isinstance(piece, memoryview) else piece)
        else:
            swapped = array("I", piece)
            swapped.byteswap()
            digest.update(swapped)


# ---- token files -------------------------------------------------------------------------

_TOKEN_MAGIC = b"RIFTTOK1"
_TOKEN_HEADER = struct.Struct("<8sQ32s")  # magic, token count, SHA-256 of the tokens


class TokenFile:
    """A tokenized corpus on disk: a 48-byte header (``RIFTTOK1``, uint64 count, the SHA-256
    of the token bytes), then the ids as little-endian uint32. :meth:`open` memory-maps it;
    ``tokens`` is a read-only ``memoryview`` of format ``'I'`` that windows slice without
    reading the rest."""

    def __init__(self, path: Path, handle, mapping, tokens: memoryview, sha256: bytes) -> None:
        self.path = path
        self.token_sha256 = sha256
        self._handle = handle
        self._mapping = mapping
        self.tokens = tokens

    @staticmethod
    def write(path, chunks: Iterable) -> int:
        """Write the ids of ``chunks`` (an iterable of ``array('I')``) atomically; returns the
        token count."""
        count = 0

        def write_all(stream) -> None:
            nonlocal count
            digest = hashlib.sha256()
            stream.write(_TOKEN_HEADER.pack(_TOKEN_MAGIC, 0, bytes(32)))
            for chunk in chunks:
                piece = chunk if isinstance(chunk, array) else array("I", chunk)
                if sys.byteorder != "little":
                    piece = array("I", piece)
                    piece.byteswap()
                stream.write(piece)
                digest.update(piece)
                count += len(piece)
            stream.seek(0)
            stream.write(_TOKEN_HEADER.pack(_TOKEN_MAGIC, count, digest.digest()))

        atomic_write(path, write_all)
        return count

    @classmethod
    def open(cls, path) -> TokenFile:
        """Map ``path`` (ValueError for a bad header or a size that disagrees with it)."""
        source = Path(path)
        handle = open(source, "rb")
        try:
            size = os.fstat(handle.fileno()).st_size
            header = handle.read(_TOKEN_HEADER.size)
            if len(header) != _TOKEN_HEADER.size:
                raise ValueError(f"{source}: too short for a token file")
            magic, count, sha256 = _TOKEN_HEADER.unpack(header)
            if magic != _TOKEN_MAGIC:
                raise ValueError(f"{source}: not a token file (bad magic)")
            if size != _TOKEN_HEADER.size + 4 * count:
                raise ValueError(f"{source}: {size} bytes, but the header says {count} tokens")
            if count == 0:
                return cls(source, handle, None, memoryview(array("I")), sha256)
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(mapping)[_TOKEN_HEADER.size :]
            if sys.byteorder == "little":
                tokens = view.cast("I")
            else:  # a big-endian host copies once
                swapped = array("I")
                swapped.frombytes(view)
                swapped.byteswap()
                view.release()
                tokens = memoryview(swapped)
            return cls(source, handle, mapping, tokens, sha256)
        except BaseException:
            handle.close()
            raise

    def __len__(self) -> int:
        return len(self.tokens)

    def close(self) -> None:
        """Unmap; slices taken earlier must have been released (they are copies in batches)."""
        try:
            self.tokens.release()
        except (AttributeError, ValueError):
            pass
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                pass
        self._handle.close()

    def __enter__(self) -> TokenFile:
        return self

    def __exit__(self, *exception) -> None:
        self.close()
