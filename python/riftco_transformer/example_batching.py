"""Supervised fine-tuning batches: whole examples, one per row, padded, with an ignore mask.

An example tokenized whole (in the model's chat template) is a sequence ``c`` of ``n`` tokens:
its row is ``inputs = c[:-1]`` and ``targets = c[1:]``, ``n - 1`` positions that start at
position 0. A batch pads its rows to its longest one: a padded position has the input
``pad_id`` and a target that does not count (mask 0). Attention is causal, so the padding
after a row's end never reaches its real positions: their logits are the ones the row alone
would give, and the batch's mean loss runs over the counted targets only. Nothing ever needs an
example to be longer than the context, the rule windowed training has.

- **Over-long examples** (more than ``context_size + 1`` tokens, i.e. more positions than the
  context holds) are ``"truncate"``\\ d to their first ``context_size + 1`` tokens (the
  default) or ``"drop"``\\ ped; :attr:`ExampleBatchSource.truncated_count` and
  :attr:`~ExampleBatchSource.dropped_count` report how many.
- An example with nothing to learn (fewer than 2 tokens, or a mask that marks no target once
  truncated, e.g. a response cut off by truncation) is left out and counted in
  :attr:`~ExampleBatchSource.unusable_count`; none usable is a ValueError.
- **Order**: epochs. Every epoch visits every usable example once, in an order that
  ``random.Random(random_seed)`` shuffles (``shuffle``); batches take consecutive examples of
  that stream, so a batch may span two epochs, and every batch is full.
- **Packing** (``packing=True``): a row holds as many consecutive examples of the stream as fit
  in its ``context_size`` positions (an example that does not fit starts the next row). Each
  example keeps positions 0, 1, ... of its own, and attention never crosses an example
  boundary (``positions`` in the batch; the model's packed forward), so an example's logits
  are those it gets alone; only the last example's padding is left over per row.
  Materialized attention packs on every backend; flash needs document bounds in the kernel
  (the CPU's and PJRT's).

The source is checkpointable like the window sources (:mod:`.batching`): its state is
``{type, fingerprint, batches_emitted, rng}``. The position is a function of the seed and
``batches_emitted`` alone, so restoring replays the epochs' shuffles, and the recorded
generator state must equal the replayed one (a check that the state belongs to this source).

Standard library only; importing this module loads no native library.
"""

from __future__ import annotations

import hashlib
import random
import struct
from array import array
from collections.abc import Sequence

from .batching import TrainingBatch, _as_token_row, _positive, _seed, source_state, token_digest

__all__ = ["OVERLONG_POLICIES", "ExampleBatchSource", "example_batches"]

OVERLONG_POLICIES = ("truncate", "drop")
_FINGERPRINT_TAG = b"riftco-transformer/example-batch-source/v1\0"


def _prepare(sequences: Sequence, masks: Sequence | None, context_size: int, overlong: str):
    """The usable (row, mask) pairs after the over-long policy, and the counts."""
    if masks is not None and len(masks) != len(sequences):
        raise ValueError(f"masks has {len(masks)} rows for {len(sequences)} sequences")
    limit = context_size + 1
    rows, row_masks = [], []
    truncated = dropped = unusable = 0
    for index, sequence in enumerate(sequences):
        row = _as_token_row(sequence, index)
        mask = None
        if masks is not None:
            mask = bytes(masks[index])
            if len(mask) != len(row):
                raise ValueError(f"masks[{index}] has {len(mask)} entries for {len(row)} tokens")
            if any(flag > 1 for flag in mask):
                raise ValueError(f"masks[{index}] holds a flag other than 0 or 1")
        if len(row) > limit:
            if overlong == "drop":
                dropped += 1
                continue
            truncated += 1
            row = row[:limit]
            mask = None if mask is None else mask[:limit]
        # A row of n tokens has the targets row[1:]; under a mask, mask[1:] says which count.
        if len(row) < 2 or (mask is not None and not any(mask[1:])):
            unusable += 1
            continue
        rows.append(array("I", row))
        row_masks.append(mask)
    return rows, row_masks, truncated, dropped, unusable


def example_batches(sequences: Sequence, batch_size: int, context_size: int,
                    masks: Sequence | None = None, overlong: str = "truncate",
                    pad_id: int = 0) -> tuple[TrainingBatch, ...]:
    """Every usable example once, in the given order, ``batch_size`` per batch (the last one
    may be smaller), padded as :class:`ExampleBatchSource` pads: a deterministic validation
    set."""
    batch_size = _positive(batch_size, "batch_size")
    context_size = _positive(context_size, "context_size")
    if overlong not in OVERLONG_POLICIES:
        raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
    rows, row_masks, *_ = _prepare(sequences, masks, context_size, overlong)
    if not rows:
        raise ValueError("no example has a target to learn (each needs at least 2 tokens, and "
                         "a marked target when masked)")
    return tuple(
        _padded_batch(rows[begin:begin + batch_size], row_masks[begin:begin + batch_size],
                      _seed(pad_id, "pad_id"))
        for begin in range(0, len(rows), batch_size)
    )


def _padded_batch(rows: Sequence[array], masks: Sequence[bytes | None],
                  pad_id: int) -> TrainingBatch:
    width = max(len(row) for row in rows) - 1
    inputs, targets, target_masks = [], [], []
    for row, mask in zip(rows, masks, strict=True):
        count = len(row) - 1
        padding = width - count
        inputs.append(array("I", row[:-1]) + array("I", [pad_id]) * padding)
        targets.append(array("I", row[1:]) + array("I", [pad_id]) * padding)
        counted = b"\x01" * count if mask is None else bytes(mask[1:])
        target_masks.append(counted + bytes(padding))
    return TrainingBatch(tuple(inputs), tuple(targets), tuple(target_masks))


def _packed_batch(rows: Sequence[Sequence[array]], masks: Sequence[Sequence[bytes | None]],
                  pad_id: int) -> TrainingBatch:
    """Rows of several examples each: inputs, targets and flags concatenated, positions
    restarting at 0 per example; the rows padded to the longest (the padding one more
    document, at positions 0.., whose targets do not count)."""
    built = []
    for examples, example_masks in zip(rows, masks, strict=True):
        inputs, targets, flags, positions = array("I"), array("I"), bytearray(), array("I")
        for row, mask in zip(examples, example_masks, strict=True):
            count = len(row) - 1
            inputs.extend(row[:-1])
            targets.extend(row[1:])
            flags.extend(b"\x01" * count if mask is None else mask[1:])
            positions.extend(range(count))
        built.append((inputs, targets, bytes(flags), positions))
    width = max(len(row[0]) for row in built)
    inputs, targets, target_masks, positions = [], [], [], []
    for row_inputs, row_targets, row_flags, row_positions in built:
        padding = width - len(row_inputs)
        inputs.append(row_inputs + array("I", [pad_id]) * padding)
        targets.append(row_targets + array("I", [pad_id]) * padding)
        target_masks.append(row_flags + bytes(padding))
        positions.append(row_positions + array("I", range(padding)))
    return TrainingBatch(tuple(inputs), tuple(targets), tuple(target_masks), tuple(positions))


class ExampleBatchSource:
    """Batches of whole examples, one per row, padded to the batch's longest row with an
    ignore mask; see the module docstring.

    ``sequences`` are token-id rows (one example each), ``masks`` optional per-token flags (1:
    the token is a target that counts, e.g. assistant text for a response-only loss; without
    masks every real target counts). ``overlong`` is ``"truncate"`` or ``"drop"``;
    ``pad_id`` the input id of padded positions (any id: nothing real attends to it).
    """

    source_type = "example_rows"

    def __init__(self, sequences: Sequence, batch_size: int, context_size: int,
                 random_seed: int, masks: Sequence | None = None, overlong: str = "truncate",
                 pad_id: int = 0, shuffle: bool = True, packing: bool = False) -> None:
        self.batch_size = _positive(batch_size, "batch_size")
        self.context_size = _positive(context_size, "context_size")
        self.random_seed = _seed(random_seed, "random_seed")
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, got {overlong!r}")
        for name, flag in (("shuffle", shuffle), ("packing", packing)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, not {type(flag).__name__}")
        self.packing = packing
        self.overlong = overlong
        self.pad_id = _seed(pad_id, "pad_id")
        self.shuffle = shuffle
        self.example_count = len(sequences)
        (self._rows, self._masks, self.truncated_count, self.dropped_count,
         self.unusable_count) = _prepare(sequences, masks, self.context_size, overlong)
        if not self._rows:
            raise ValueError(
                f"none of the {self.example_count} examples has a target to learn "
                f"({self.dropped_count} dropped as longer than context_size + 1 = "
                f"{self.context_size + 1} tokens, {self.unusable_count} with no target)"
            )
        self._fingerprint: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._generator = random.Random(self.random_seed)
        self._order: list[int] = []
        self._cursor = 0
        self._pending: int | None = None  # packing: the example that did not fit the last row
        self.epoch = 0
        self.batches_emitted = 0

    @property
    def sequence_count(self) -> int:
        """The usable examples (after the over-long policy)."""
        return len(self._rows)

    @property
    def target_token_count(self) -> int:
        """Counted targets over one epoch."""
        return sum(len(row) - 1 if mask is None else sum(mask[1:])
                   for row, mask in zip(self._rows, self._masks, strict=True))

    @property
    def token_count(self) -> int:
        return sum(len(row) for row in self._rows)

    def _next_index(self) -> int:
        if self._pending is not None:
            index, self._pending = self._pending, None
            return index
        if self._cursor == len(self._order):
            self._order = list(range(len(self._rows)))
            if self.shuffle:
                self._generator.shuffle(self._order)
            self._cursor = 0
            self.epoch += 1
        index = self._order[self._cursor]
        self._cursor += 1
        return index

    def _next_rows(self) -> list[list[int]]:
        """The example indices of the next batch's rows (advances the position)."""
        if not self.packing:
            return [[self._next_index()] for _ in range(self.batch_size)]
        rows = []
        for _ in range(self.batch_size):
            row: list[int] = []
            free = self.context_size
            while True:
                index = self._next_index()
                needed = len(self._rows[index]) - 1
                if row and needed > free:
                    self._pending = index  # starts the next row
                    break
                row.append(index)
                free -= needed
                if free == 0:
                    break
            rows.append(row)
        return rows

    def next(self) -> TrainingBatch:
        """The next batch (advances the position and ``batches_emitted``)."""
        rows = self._next_rows()
        self.batches_emitted += 1
        if not self.packing:
            return _padded_batch([self._rows[row[0]] for row in rows],
                                 [self._masks[row[0]] for row in rows], self.pad_id)
        return _packed_batch([[self._rows[i] for i in row] for row in rows],
                             [[self._masks[i] for i in row] for row in rows], self.pad_id)

    __next__ = next

    def __iter__(self):
        return self

    # ---- checkpointing --------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the source's settings and data (computed once)."""
        if self._fingerprint is None:
            digest = hashlib.sha256(_FINGERPRINT_TAG)
            digest.update(f"{self.overlong}\0{int(self.shuffle)}\0".encode())
            if self.packing:  # (absent before packing existed: the same ids for unpacked)
                digest.update(b"packing\0")
            digest.update(struct.pack("<QQQQ", self.batch_size, self.context_size, self.pad_id,
                                      len(self._rows)))
            for row, mask in zip(self._rows, self._masks, strict=True):
                digest.update(struct.pack("<Q", len(row)))
                digest.update(token_digest(row))
                digest.update(b"\0" if mask is None else hashlib.sha256(mask).digest())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def capture_state(self) -> dict:
        """The JSON-serialisable position: type, fingerprint, batches emitted, generator."""
        return source_state(self)

    def _replayed(self, emitted: int) -> ExampleBatchSource:
        """A copy of this source's position machinery after ``emitted`` batches from the start
        (the batches are not built)."""
        replay = object.__new__(ExampleBatchSource)
        replay.__dict__.update(self.__dict__)
        replay._reset()
        for _ in range(emitted):
            replay._next_rows()
        replay.batches_emitted = emitted
        return replay

    def check_state(self, state: object) -> int:
        """Validate ``state`` against this source without changing it; returns the batch
        count :meth:`restore_state` continues from."""
        return self._checked_replay(state).batches_emitted

    def _checked_replay(self, state: object) -> ExampleBatchSource:
        """:meth:`check_state`'s checks; returns the replayed position they compared."""
        if (not isinstance(state, dict)
                or set(state) != {"type", "fingerprint", "batches_emitted", "rng"}):
            raise ValueError("batch source state must have type, fingerprint, batches_emitted, rng")
        if state["type"] != self.source_type:
            raise ValueError(
                f"batch source state is for a {state['type']!r} source, not {self.source_type!r}"
            )
        if state["fingerprint"] != self.fingerprint:
            raise ValueError(
                "batch source fingerprint differs: the checkpoint was taken on other data, batch "
                "size, context size or over-long policy"
            )
        emitted = state["batches_emitted"]
        if isinstance(emitted, bool) or not isinstance(emitted, int) or not 0 <= emitted < 1 << 40:
            raise ValueError(f"batches_emitted must be an int in [0, 2**40), got {emitted!r}")
        rng = state["rng"]
        if not isinstance(rng, dict) or set(rng) != {"version", "state", "gauss_next"}:
            raise ValueError("batch source rng must have version, state, gauss_next")
        replay = self._replayed(emitted)
        version, internal, gauss = replay._generator.getstate()
        if (rng["version"] != version or rng["state"] != list(internal)
                or rng["gauss_next"] != gauss):
            raise ValueError(f"batch source rng state is not this source's after {emitted} "
                             "batches (another seed, or a corrupted checkpoint)")
        return replay

    def restore_state(self, state: object) -> None:
        """Continue exactly where :meth:`capture_state` was taken; ValueError (and nothing
        changed) for another source type, other data or a generator state that is not this
        source's."""
        replay = self._checked_replay(state)  # validated and replayed once
        self._generator, self._order, self._cursor = (replay._generator, replay._order,
                                                      replay._cursor)
        self._pending, self.epoch = replay._pending, replay.epoch
        self.batches_emitted = replay.batches_emitted
