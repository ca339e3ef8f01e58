"""Deterministic stand-ins for the serving tests: a tokenizer of arbitrary byte pieces, a
bigram "model" whose greedy continuation is a lookup table, an engine that records (and can
slow down or fail) its steps, and small polling helpers. Imported as ``serving_fakes``."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from riftco_transformer.serving import FullForwardEngine
from riftco_transformer.serving.engine import BlockLedger


class PieceTokenizer:
    """Token id i stands for ``pieces[i]`` (any bytes); encoding takes the longest piece."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.vocabulary_size = len(pieces)
        self.decode_calls = 0

    def encode_bytes(self, data) -> list[int]:
        data, ids, offset = bytes(data), [], 0
        while offset < len(data):
            best = max(
                (i for i, piece in enumerate(self.pieces) if piece and data.startswith(piece,
                                                                                      offset)),
                key=lambda i: len(self.pieces[i]), default=None)
            if best is None:
                raise ValueError(f"cannot encode byte {data[offset]:#x}")
            ids.append(best)
            offset += len(self.pieces[best])
        return ids

    def decode_bytes(self, ids) -> bytes:
        self.decode_calls += 1
        return b"".join(self.pieces[i] for i in ids)


def ascii_tokenizer(extra: list[bytes] = ()) -> PieceTokenizer:
    """Ids 0-127 are the ASCII bytes; ``extra`` pieces follow from id 128."""
    return PieceTokenizer([bytes([value]) for value in range(128)] + list(extra))


class BigramModel:
    """A model whose logits at every position put 1.0 on ``table[token]`` (default id 0)
    and 0.0 elsewhere: greedy decoding follows the table from the prompt's last token."""

    def __init__(self, table: dict[int, int], vocabulary_size: int, maximum_context: int):
        self.table = dict(table)
        self.config = SimpleNamespace(vocabulary_size=vocabulary_size,
                                      maximum_context=maximum_context)
        self.calls = 0

    def __call__(self, tokens):
        self.calls += 1
        rows = tokens if tokens and isinstance(tokens[0], list) else [tokens]
        vocabulary = self.config.vocabulary_size
        result = []
        for row in rows:
            positions = []
            for token in row:
                logits = [0.0] * vocabulary
                logits[self.table.get(token, 0)] = 1.0
                positions.append(logits)
            result.append(positions)
        return result


def chain(*ids: int) -> dict[int, int]:
    """A bigram table that continues ids[0] with ids[1], ids[1] with ids[2], ..."""
    return {a: b for a, b in zip(ids, ids[1:])}


class RecordingEngine(FullForwardEngine):
    """A FullForwardEngine that records each step's rows and each reset, and can sleep in
    every step (``step_delay``), hold a step until ``gate`` is set (it starts set), or fail
    every step with a row containing ``poison``."""

    def __init__(self, model, *, step_delay: float = 0.0, poison: int | None = None,
                 **ledger) -> None:
        super().__init__(model, **ledger)
        self.step_delay = step_delay
        self.poison = poison
        self.steps: list[list[tuple[int, list[int]]]] = []  # [(stream number, tokens)] per call
        self.resets: list[int] = []
        self._numbers: dict[int, int] = {}
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set whenever a step has been recorded

    def number(self, stream) -> int:
        return self._numbers.setdefault(id(stream), len(self._numbers))

    def open_stream(self, token_budget):
        stream = super().open_stream(token_budget)
        self.number(stream)
        return stream

    def step(self, batch):
        with self.lock:
            self.steps.append([(self.number(stream), list(tokens)) for stream, tokens in batch])
        self.entered.set()
        if not self.gate.wait(10):
            raise TimeoutError("the test never opened the gate")
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.poison is not None and any(self.poison in tokens for _, tokens in batch):
            raise RuntimeError(f"poisoned token {self.poison}")
        return super().step(batch)

    def reset_stream(self, stream) -> None:
        self.resets.append(self.number(stream))
        super().reset_stream(stream)


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.005) -> bool:
    """Poll until ``predicate()`` holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)
    return True


# ---- a stand-in for the native decode-session API ---------------------------------------------
#
# The API NativeEngine is written against (model.decode_session, model.kv_cache_pool,
# pool.session(), riftco_transformer.decode_batch), implemented over full forwards of a real
# model so its logits are exact. Used (through monkeypatch) only while the library binding
# lacks the real one.


def _native_error(status_name: str, detail: str):
    from riftco_transformer import STATUS_OUT_OF_RANGE, STATUS_RUNTIME_ERROR, RiftcoTransformerError

    status = STATUS_RUNTIME_ERROR if status_name == "runtime_error" else STATUS_OUT_OF_RANGE
    return RiftcoTransformerError(status, status_name, detail)


class FakeDecodeSession:
    def __init__(self, owner: FakeNativeModel, cache_kind: str, block_size: int, pool=None):
        self._owner = owner
        self.cache_kind = cache_kind
        self.block_size = block_size
        self.capacity = owner.config.maximum_context
        self._pool = pool
        self.tokens: list[int] = []
        self.closed = False
        self.reserved_block_count = 0

    @property
    def size(self) -> int:
        return len(self.tokens)

    def leased_pages(self, size: int | None = None) -> int:
        size = self.size if size is None else size
        return -(-size // self.block_size)

    def step(self, token: int):
        return fake_decode_batch([self], [[token]])[0]

    def prefill(self, tokens):
        return fake_decode_batch([self], [list(tokens)])[0]

    def reset(self) -> None:
        self.tokens = []

    def close(self) -> None:
        if self._pool is not None and not self.closed:
            self._pool.sessions.discard(self)
            self._pool.ledger.release(self.reserved_block_count)
        self.closed = True
        self.tokens = []

    def __enter__(self):
        return self

    def __exit__(self, *exception_info):
        self.close()


class FakeKvCachePool:
    def __init__(self, owner: FakeNativeModel, block_size: int, block_count: int):
        context = owner.config.maximum_context
        self.block_size = block_size
        self.blocks_per_full_cache = -(-context // block_size)
        if block_count and block_count < self.blocks_per_full_cache:
            raise _native_error("runtime_error", "invalid block_count")  # not exercised
        self.block_count = block_count or self.blocks_per_full_cache
        self._owner = owner
        self.sessions: set[FakeDecodeSession] = set()
        self.closed = False
        # Reservations as the library's pool keeps them (without sharing, its rule is the
        # Python ledger's: every reservation fits in the pool at once).
        self.ledger = BlockLedger(block_size, self.block_count, context)

    @property
    def leased_block_count(self) -> int:
        return sum(session.leased_pages() for session in list(self.sessions))

    @property
    def free_block_count(self) -> int:
        return self.block_count - self.leased_block_count

    def session(self, token_budget: int | None = None) -> FakeDecodeSession:
        blocks = 0
        if token_budget is not None:
            from riftco_transformer.serving.errors import PoolFullError, RequestRejectedError

            try:
                blocks = self.ledger.reserve(token_budget)
            except RequestRejectedError as error:
                raise _native_error("out_of_range", str(error)) from None
            except PoolFullError as error:
                raise _native_error("runtime_error", f"pool full: {error}") from None
        session = FakeDecodeSession(self._owner, "paged", self.block_size, pool=self)
        session.reserved_block_count = blocks
        self.sessions.add(session)
        return session

    def admission(self, token_budget: int) -> str:
        return self.ledger.admission(token_budget).value

    @property
    def reserved_block_count(self) -> int:
        return self.ledger.reserved_block_count

    @property
    def available_block_count(self) -> int:
        return self.block_count - self.ledger.reserved_block_count

    def close(self) -> None:
        self.closed = True


class FakeNativeModel:
    """A real model plus the decode-session API, over full forwards."""

    def __init__(self, model) -> None:
        self.model = model
        self.config = model.config
        self.pools: list[FakeKvCachePool] = []

    def __call__(self, tokens):
        return self.model(tokens)

    def decode_session(self, cache: str = "paged", block_size: int = 16) -> FakeDecodeSession:
        if cache == "contiguous":
            return FakeDecodeSession(self, "contiguous", self.config.maximum_context)
        return self.kv_cache_pool(block_size=block_size).session()

    def kv_cache_pool(self, block_size: int = 16, block_count: int = 0,
                      prefix_caching: bool = False) -> FakeKvCachePool:
        pool = FakeKvCachePool(self, block_size, block_count)  # caches no prefix
        pool.prefix_caching = False
        self.pools.append(pool)
        return pool


def fake_decode_batch(sessions, tokens):
    """One all-or-nothing step: check capacity and pages for every row, then run."""
    extra_pages: dict[int, int] = {}
    for session, row in zip(sessions, tokens):
        if session.size + len(row) > session.capacity:
            raise _native_error("out_of_range", "decode session is full")
        if session._pool is not None:
            new = session.leased_pages(session.size + len(row)) - session.leased_pages()
            extra_pages[id(session._pool)] = extra_pages.get(id(session._pool), 0) + new
            if session._pool.free_block_count < extra_pages[id(session._pool)]:
                raise _native_error("runtime_error", "kv cache pool exhausted")
    results = []
    for session, row in zip(sessions, tokens):
        window = session.tokens + list(row)
        vocabulary = session._owner.config.vocabulary_size
        with session._owner.model(window) as logits:
            values = logits.tolist()
        results.append(tuple(values[(len(window) - 1) * vocabulary :]))
    for session, row in zip(sessions, tokens):
        session.tokens += list(row)
    return results


# ---- an oracle for log-probabilities ---------------------------------------------------------


def full_forward_log_softmax(model, token_ids):
    """The float64 log-softmax of ``model``'s logits at every position of ONE full forward
    over ``token_ids`` (a native model's ``model(ids)``), as a numpy ``[T, V]`` array: row
    ``t`` is the distribution of the token after ``token_ids[t]``. Needs numpy."""
    import numpy

    ids = list(token_ids)
    with model(ids) as logits:
        values = numpy.asarray(logits.to_array(), dtype=numpy.float64)
    values = values.reshape(len(ids), -1)
    highest = values.max(axis=1, keepdims=True)
    return values - highest - numpy.log(numpy.exp(values - highest).sum(axis=1, keepdims=True))


# ---- shared fixtures' bodies -----------------------------------------------------------------


def start_server(service, **server_options) -> SimpleNamespace:
    """``service`` behind an HTTP server on its own thread: server, thread, host, port."""
    from riftco_transformer.serving import make_server

    server = make_server(service, **server_options)
    thread = server.serve_in_thread()
    host, port = server.server_address[:2]
    return SimpleNamespace(server=server, thread=thread, host=host, port=port, service=service)


def stop_server(served: SimpleNamespace, timeout: float = 10.0) -> None:
    """Shut down what :func:`start_server` started, and close its service."""
    served.server.shutdown()
    served.server.server_close()
    served.thread.join(timeout)
    served.service.close()


def scheduler_factory(successor: dict[int, int], default_context: int, timeout: float = 10.0):
    """A generator for a pytest fixture: yields ``make(maximum_context=default_context, *,
    engine_options=None, **scheduler_options) -> (scheduler, engine)`` over RecordingEngines
    of a BigramModel, and releases and closes every one afterwards."""
    from riftco_transformer.serving import Scheduler

    made = []

    def make(maximum_context: int = default_context, *, engine_options=None, **options):
        model = BigramModel(successor, 128, maximum_context)
        engine = RecordingEngine(model, **(engine_options or {}))
        scheduler = Scheduler(engine, ascii_tokenizer(), **options)
        made.append((scheduler, engine))
        return scheduler, engine

    yield make
    for scheduler, engine in made:
        engine.gate.set()
        scheduler.close(timeout=timeout)
