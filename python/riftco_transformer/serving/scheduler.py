"""Continuous batching: one thread owns the engine and steps every active request together.

Requests are submitted from any thread (:meth:`Scheduler.submit` returns a
:class:`RequestHandle`). The scheduler thread loops:

1. drop cancelled requests (their streams close, so their pages return to the pool);
2. admit waiting requests in arrival order while ``max_active_requests`` allows and the
   engine's admission says ADMIT (a WAIT keeps the request, and everyone behind it,
   queued: no request overtakes an earlier one);
3. build ONE batch: every request with a single token to feed (a decode row), then prefill
   chunks of the requests still feeding a prompt (or a rollover replay), oldest first, at
   most ``prefill_chunk_tokens`` prompt tokens in all, so a long prompt is spread over
   several steps instead of stalling the running streams. Before its first chunk, a request
   asks the engine to adopt cached KV pages of its prompt's prefix
   (``Engine.reuse_prefix``: prefix caching) and feeds only the rest;
4. run it as one ``engine.step``; requests whose feed completed sample their next token
   (each with its own sampler, and its own grammar matcher when its config constrains the
   text: built at submit, over the tokenizer's vocabulary indexed once per scheduler) and
   receive its event; finished requests leave.

Requests join and leave between steps. Admission reserves a request's worst-case pages up
front (see ``serving.engine``), so a running request never runs out; a request that could
never fit is rejected at ``submit`` (:class:`~.errors.RequestRejectedError`), and a full
waiting queue raises :class:`~.errors.QueueFullError`.

*Groups* (:meth:`Scheduler.submit_group`, OpenAI's ``n`` choices): several requests over one
prompt, queued together and admitted together, all in the same pass once the pool holds
every member's reservation at once (until then they wait, and nothing behind them
overtakes). A group that could never run at once (more members than
``max_active_requests``, or more pages than the whole pool) is rejected at submit. With an
engine that caches prefixes (``engine.prefix_caching``), the first member prefills the
prompt and the others join one step later, adopting its full KV pages by reference and
feeding only the rest; otherwise all prefill together.

Failures stay with the requests they concern: when a batched step fails (the engine
guarantees it changed no stream), each row is retried alone and only the rows that fail
again fail their request, with that exception. A failure in sampling or in an event
callback fails that request only. Should the loop itself break, every request fails with
the error. No client waits forever: ``close()`` fails what is left with
:class:`~.errors.SchedulerClosedError`.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..native._validation import UINT32_LIMIT, require_int
from ._text import TokenBytes
from .engine import Admission
from .errors import (
    QueueFullError,
    RequestCancelledError,
    RequestRejectedError,
    SchedulerClosedError,
)
from .generation import (
    GenerationConfig,
    GenerationProgress,
    GenerationResult,
    GrammarVocabulary,
    TokenEvent,
    require_matching_vocabulary,
)
from .sampling import Sampler

_END = object()  # the last item of a handle's event queue


class RequestHandle:
    """A submitted request: its events as they come, its result, and ``cancel()``.

    Iterating yields :class:`~.generation.TokenEvent` values until the request ends, then
    raises the request's error if it failed (a cancelled request:
    :class:`~.errors.RequestCancelledError`). ``result(timeout)`` waits for the
    :class:`~.generation.GenerationResult` (TimeoutError when the time runs out).
    """

    def __init__(self, request_id: str, prompt_ids: tuple[int, ...], cancel: Callable) -> None:
        self.id = request_id
        self.prompt_token_ids = prompt_ids
        self._cancel = cancel
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[RequestHandle], None]] | None = []
        self._callback_lock = threading.Lock()
        self.cancel_requested = False

    def cancel(self) -> None:
        """Stop the request (idempotent; no effect once it finished). Its pages are freed
        before the scheduler's next step."""
        if not self._done.is_set():
            self.cancel_requested = True
            self._cancel(self)

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, callback: Callable[[RequestHandle], None]) -> None:
        """Call ``callback(handle)`` once the request has ended (at once when it already
        has), on the thread that ended it: keep it short; what it raises is ignored."""
        with self._callback_lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        _call_quietly(callback, self)

    @property
    def error(self) -> BaseException | None:
        """The exception the request failed with, once done (None on success)."""
        return self._error

    def result(self, timeout: float | None = None) -> GenerationResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def next_event(self, timeout: float | None = None) -> TokenEvent | None:
        """The next event; None once the request ended successfully. Raises the request's
        error once it failed, TimeoutError when no event arrives in ``timeout`` seconds."""
        try:
            item = self._events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no event of request {self.id} within {timeout} s") from None
        if item is _END:
            self._events.put(_END)  # later calls see the end too
            if self._error is not None:
                raise self._error
            return None
        return item

    def __iter__(self) -> Iterator[TokenEvent]:
        while (event := self.next_event()) is not None:
            yield event

    # ---- the scheduler thread's side -------------------------------------------------------

    def _emit(self, event: TokenEvent) -> None:
        self._events.put(event)

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> None:
        if self._done.is_set():
            return
        self._result, self._error = result, error
        self._done.set()
        self._events.put(_END)
        with self._callback_lock:
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _call_quietly(callback, self)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<RequestHandle {self.id} {state}>"


def _call_quietly(callback: Callable[[RequestHandle], None], handle: RequestHandle) -> None:
    try:
        callback(handle)
    except Exception:  # noqa: BLE001, S110 - a done callback cannot fail its request
        pass


@dataclass(eq=False)
class _Request:
    handle: RequestHandle
    progress: GenerationProgress
    on_event: Callable[[TokenEvent], None] | None
    stream: object = None
    group: object = None  # shared by the members of one submit_group (None: alone)
    leader: _Request | None = None  # a group's first member, whose prefill the others await
    prefix_asked: bool = False  # whether the engine was asked for cached prompt pages


@dataclass(frozen=True)
class SchedulerStats:
    """Counters since the scheduler started (a snapshot)."""

    step_count: int  # batched engine steps run
    library_sampled_step_count: int  # of which the library also chose the tokens (step_sample)
    decode_row_count: int  # rows that fed one token
    prefill_row_count: int  # rows that fed a prefill chunk (several tokens)
    prefill_token_count: int  # tokens fed by prefill chunks
    prefix_reused_token_count: int  # prompt tokens taken from the engine's prefix cache
    completed_count: int
    failed_count: int
    cancelled_count: int
    active_count: int
    waiting_count: int


class Scheduler:
    """The continuous-batching loop over one engine (see the module docstring).

    ``tokenizer`` decodes tokens for text and stop sequences; its vocabulary must be the
    engine's. ``max_active_requests`` bounds the batch, ``max_queued_requests`` the
    requests waiting for admission, ``prefill_chunk_tokens`` the prefill tokens per step.
    The scheduler does not close the engine unless ``close_engine`` is True.
    """

    def __init__(
        self,
        engine,
        tokenizer,
        *,
        max_active_requests: int = 8,
        max_queued_requests: int = 64,
        prefill_chunk_tokens: int = 64,
        close_engine: bool = False,
        name: str = "riftco-scheduler",
    ) -> None:
        self._max_active = require_int(max_active_requests, "max_active_requests", 1,
                                       UINT32_LIMIT)
        self._max_queued = require_int(max_queued_requests, "max_queued_requests", 1,
                                       UINT32_LIMIT)
        self._prefill_chunk = require_int(prefill_chunk_tokens, "prefill_chunk_tokens", 1,
                                          UINT32_LIMIT)
        self._sampled_vocabulary = require_matching_vocabulary(tokenizer, engine)
        self._engine = engine
        self._token_bytes = TokenBytes(tokenizer)
        # Constrained decoding: the vocabulary indexed once, a matcher per request (choice).
        self._grammar_vocabulary = GrammarVocabulary(tokenizer)
        self._close_engine = close_engine
        self._condition = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._active: list[_Request] = []  # the scheduler thread's own
        self._closing = False
        self._broken: BaseException | None = None
        self._ids = itertools.count(1)
        self._counts = dict.fromkeys(
            ("step", "library_sampled_step", "decode_row", "prefill_row", "prefill_token",
             "prefix_reused_token", "completed", "failed", "cancelled"), 0)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def engine(self):
        return self._engine

    @property
    def closed(self) -> bool:
        return self._closing

    def stats(self) -> SchedulerStats:
        with self._condition:
            counts = dict(self._counts)
            waiting = len(self._waiting)
            active = len(self._active)
        return SchedulerStats(
            step_count=counts["step"],
            library_sampled_step_count=counts["library_sampled_step"],
            decode_row_count=counts["decode_row"],
            prefill_row_count=counts["prefill_row"], prefill_token_count=counts["prefill_token"],
            prefix_reused_token_count=counts["prefix_reused_token"],
            completed_count=counts["completed"], failed_count=counts["failed"],
            cancelled_count=counts["cancelled"], active_count=active, waiting_count=waiting,
        )

    def submit(
        self,
        prompt_ids: Sequence[int],
        config: GenerationConfig | None = None,
        *,
        sampler: Sampler | None = None,
        on_event: Callable[[TokenEvent], None] | None = None,
    ) -> RequestHandle:
        """Queue a request; returns at once. ``on_event`` (called on the scheduler thread,
        keep it short) receives each token event; an exception it raises fails the request.

        Raises ValueError/TypeError for a bad prompt or config, RequestRejectedError when the
        request can never fit, QueueFullError when the waiting queue is full, and
        SchedulerClosedError after ``close()``.
        """
        request = self._prepare(prompt_ids, config, sampler, on_event)
        self._enqueue([request])
        return request.handle

    def submit_group(
        self,
        prompt_ids: Sequence[int],
        configs: Sequence[GenerationConfig],
        *,
        on_event: Sequence[Callable[[TokenEvent], None] | None] | None = None,
    ) -> list[RequestHandle]:
        """Queue one request per config, all over ``prompt_ids``, as a group (see the module
        docstring): every one is queued, or none is. ``on_event[i]`` (None: none) is request
        ``i``'s callback, as for :meth:`submit`. The errors are :meth:`submit`'s; a group
        that can never run at once is a RequestRejectedError whose ``param`` is ``"n"``."""
        configs = list(configs)
        if not configs:
            raise ValueError("submit_group needs at least one config")
        callbacks = [None] * len(configs) if on_event is None else list(on_event)
        if len(callbacks) != len(configs):
            raise ValueError(f"submit_group got {len(configs)} configs but "
                             f"{len(callbacks)} callbacks")
        if len(configs) > self._max_active:
            raise RequestRejectedError(
                f"n={len(configs)} choices must run at once, but this scheduler runs at most "
                f"{self._max_active} requests at once (max_active_requests)", param="n")
        prompt = list(prompt_ids)
        requests = [self._prepare(prompt, config, None, callback)
                    for config, callback in zip(configs, callbacks, strict=True)]
        group = object() if len(requests) > 1 else None
        for request in requests:
            request.group = group
        self._enqueue(requests)
        return [request.handle for request in requests]

    def _prepare(self, prompt_ids, config, sampler, on_event) -> _Request:
        config = GenerationConfig() if config is None else config
        if not isinstance(config, GenerationConfig):
            raise TypeError(f"config must be a GenerationConfig, not {type(config).__name__}")
        progress = GenerationProgress(
            list(prompt_ids), config, sampler or config.make_sampler(),
            maximum_context=self._engine.maximum_context,
            vocabulary_size=self._sampled_vocabulary,
            token_bytes=self._token_bytes,
            matcher=self._grammar_vocabulary.matcher(config),
        )
        handle = RequestHandle(f"request-{next(self._ids)}", progress.prompt_ids, self._cancel)
        return _Request(handle, progress, on_event)

    def _enqueue(self, requests: list[_Request]) -> None:
        """Queue the requests that need steps (all or none; raises for the whole lot) and
        complete those that need none (max_new_tokens == 0)."""
        running = [request for request in requests if not request.progress.finished]
        for request in running:
            if self._engine.admission(request.progress.token_budget) is Admission.REJECT:
                raise RequestRejectedError(
                    f"the request can never fit: its KV reservation of "
                    f"{request.progress.token_budget} tokens (prompt window + max_new_tokens "
                    "- 1, at most maximum_context) needs more blocks than the engine's whole "
                    "pool"
                )
        if len(running) > 1:
            self._reject_unless_group_fits(running)
        with self._condition:
            if running:
                self._raise_if_unavailable()
                if len(self._waiting) + len(running) > self._max_queued:
                    raise QueueFullError(
                        f"{len(self._waiting)} requests are already waiting "
                        f"(max_queued_requests={self._max_queued}); "
                        + (f"{len(running)} more do not fit; " if len(running) > 1 else "")
                        + "retry later"
                    )
                self._waiting.extend(running)
                self._condition.notify_all()
        for request in requests:
            if request.progress.finished:  # max_new_tokens == 0: nothing to run
                self._complete(request, count=False)

    def _group_blocks(self, requests: list[_Request], capacity) -> int:
        """The blocks the requests reserve together (the engine's rule: ``ceil(min(budget,
        C) / block_size)`` each)."""
        context = self._engine.maximum_context
        return sum(-(-min(request.progress.token_budget, context) // capacity.block_size)
                   for request in requests)

    def _reject_unless_group_fits(self, requests: list[_Request]) -> None:
        capacity = self._engine.capacity()
        if capacity.block_count is None:
            return
        needed = self._group_blocks(requests, capacity)
        if needed > capacity.block_count:
            raise RequestRejectedError(
                f"n={len(requests)} choices can never run at once: together their KV "
                f"reservations need {needed} blocks of {capacity.block_size} tokens, more "
                f"than the engine's whole pool of {capacity.block_count}", param="n")

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the thread: waiting and running requests fail with SchedulerClosedError.
        Idempotent; waits up to ``timeout`` seconds for the thread (a step in progress
        finishes first)."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exception_info) -> None:
        self.close()

    # ---- any thread --------------------------------------------------------------------------

    def _raise_if_unavailable(self) -> None:
        if self._broken is not None:
            raise SchedulerClosedError(f"the scheduler stopped after an error: "
                                       f"{self._broken!r}") from self._broken
        if self._closing:
            raise SchedulerClosedError("the scheduler is closed")

    def _cancel(self, handle: RequestHandle) -> None:
        with self._condition:
            for request in self._waiting:
                if request.handle is handle:
                    self._waiting.remove(request)
                    self._counts["cancelled"] += 1
                    handle._finish(None, RequestCancelledError(f"{handle.id} was cancelled"))
                    return
            self._condition.notify_all()  # an active request: the loop drops it

    # ---- the scheduler thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._condition:
                    while not (self._closing or self._waiting or self._active):
                        self._condition.wait()
                    if self._closing:
                        break
                self._drop_cancelled()
                self._admit()
                if self._active:
                    self._step()
                else:
                    # Waiting requests that cannot be admitted with nothing running would
                    # spin; admission says REJECT for those at submit, so this is a guard.
                    with self._condition:
                        self._condition.wait(0.05)
        except BaseException as error:  # noqa: BLE001 - every client must learn of it
            self._broken = error
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        with self._condition:
            self._closing = True
            waiting = list(self._waiting)
            self._waiting.clear()
        error_text = "the scheduler was closed"
        if self._broken is not None:
            error_text = f"the scheduler stopped after an error: {self._broken!r}"
        for request in self._active + waiting:
            error = SchedulerClosedError(error_text)
            error.__cause__ = self._broken
            self._fail(request, error)
        if self._close_engine:
            self._engine.close()

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._active if r.handle.cancel_requested]:
            error = RequestCancelledError(f"{request.handle.id} was cancelled")
            try:
                self._release(request)
            except Exception as release_error:  # noqa: BLE001
                error.__cause__ = release_error
            with self._condition:
                self._counts["cancelled"] += 1
            request.handle._finish(None, error)

    def _admit(self) -> None:
        while len(self._active) < self._max_active:
            with self._condition:
                if not self._waiting:
                    return
                members = self._leading_group()
                if len(self._active) + len(members) > self._max_active:
                    return  # the group waits for room in the batch
                if not self._admits(members):
                    return  # WAIT: the oldest request keeps its place
                for _ in members:
                    self._waiting.popleft()
            for request in members:
                try:
                    request.stream = self._engine.open_stream(request.progress.token_budget)
                except Exception as error:  # noqa: BLE001 - fail this request only
                    self._fail(request, error)
                    continue
                if request is not members[0] and getattr(self._engine, "prefix_caching", False):
                    request.leader = members[0]
                self._active.append(request)

    def _awaits_leader(self, request: _Request) -> bool:
        """Whether a group member still waits for its leader to finish feeding the prompt
        (whose full pages it then adopts). A leader that left stops nobody."""
        leader = request.leader
        if leader is not None and not leader.progress.generated_ids and (
                not leader.progress.finished) and leader in self._active:
            return True
        request.leader = None
        return False

    def _reuse_prefix(self, request: _Request) -> None:
        """Before a request's first prompt chunk: feed from the engine's prefix cache what
        it holds (engines without ``reuse_prefix`` hold nothing)."""
        request.prefix_asked = True
        prompt = request.progress.reusable_prompt()
        reuse = getattr(self._engine, "reuse_prefix", None)
        if len(prompt) < 2 or reuse is None:
            return
        reused = reuse(request.stream, prompt)
        if reused:
            request.progress.commit_chunk(reused)
            with self._condition:
                self._counts["prefix_reused_token"] += reused

    def _leading_group(self) -> list[_Request]:
        """The oldest waiting request and the rest of its group (queued consecutively)."""
        head = self._waiting[0]
        members = [head]
        if head.group is not None:
            for request in itertools.islice(self._waiting, 1, None):
                if request.group is not head.group:
                    break
                members.append(request)
        return members

    def _admits(self, members: list[_Request]) -> bool:
        """Whether the engine admits every member now, all reservations together."""
        if any(self._engine.admission(request.progress.token_budget) is not Admission.ADMIT
               for request in members):
            return False
        if len(members) == 1:
            return True
        capacity = self._engine.capacity()
        if capacity.block_count is None:
            return True
        free = capacity.available_block_count  # the pool's own count where there is a pool
        return self._group_blocks(members, capacity) <= free

    def _step(self) -> None:
        rows: list[tuple[_Request, list[int]]] = []
        prefill_budget = self._prefill_chunk
        for request in list(self._active):
            progress = request.progress
            try:
                if progress.needs_reset:
                    self._engine.reset_stream(request.stream)
                    progress.acknowledge_reset()
                if not request.prefix_asked:
                    if self._awaits_leader(request):
                        continue
                    self._reuse_prefix(request)
                if progress.pending_count == 1:
                    rows.append((request, progress.next_chunk()))
                elif prefill_budget > 0:
                    chunk = progress.next_chunk(prefill_budget)
                    prefill_budget -= len(chunk)
                    rows.append((request, chunk))
            except Exception as error:  # noqa: BLE001 - fail this request only
                self._fail(request, error)
        if not rows:
            return
        if self._step_sampled(rows):
            return
        outcomes = self._run_rows(rows)
        self._count_step(rows)
        for (request, chunk), (logits, error) in zip(rows, outcomes, strict=True):
            if error is not None:
                self._fail(request, error)
                continue
            self._deliver(request, request.progress.feed, len(chunk), logits)

    def _deliver(self, request: _Request, feed: Callable, *arguments) -> None:
        """Record a step's outcome for one request (``feed(*arguments)``, one of its
        progress's feeds, returns its event, if any), emit the event, and complete or fail
        the request."""
        try:
            event = feed(*arguments)
            if event is not None:
                request.handle._emit(event)
                if request.on_event is not None:
                    request.on_event(event)
        except Exception as error:  # noqa: BLE001 - sampling or a callback failed
            self._fail(request, error)
            return
        if request.progress.finished:
            self._complete(request)

    def _step_sampled(self, rows) -> bool:
        """Run the step with the library choosing every completing row's token inside it
        (``engine.step_sample``: no logits come back), when the engine can and every row's
        sampler is the library's; False, having run nothing, otherwise or when the fused
        step fails (which changes no stream: the plain path then runs and finds the row)."""
        if not getattr(self._engine, "library_sampling", False):
            return False
        step_sample = self._engine.step_sample
        plans = []
        for request, chunk in rows:
            progress = request.progress
            if not progress.library_samples:
                return False
            completes = len(chunk) == progress.pending_count and (
                progress.config.max_new_tokens > 0)
            plans.append(progress.sampling_plan(self._engine.vocabulary_size)
                         if completes else None)
        try:
            outcomes = step_sample([(request.stream, chunk) for request, chunk in rows], plans)
        except Exception:  # noqa: BLE001 - nothing changed: the plain path runs the step
            return False
        self._count_step(rows)
        with self._condition:
            self._counts["library_sampled_step"] += 1
        for (request, chunk), outcome in zip(rows, outcomes, strict=True):
            sampled = outcome if outcome.status != "fed" else None
            self._deliver(request, request.progress.feed_sampled, len(chunk), sampled)
        return True

    def _count_step(self, rows) -> None:
        with self._condition:
            self._counts["step"] += 1
            for _, chunk in rows:
                if len(chunk) == 1:
                    self._counts["decode_row"] += 1
                else:
                    self._counts["prefill_row"] += 1
                    self._counts["prefill_token"] += len(chunk)

    def _run_rows(self, rows):
        """[(logits, None) | (None, error)] per row: one batched step, and only when that
        fails (which changed no stream) each row alone, to find the rows that fail."""
        batch = [(request.stream, chunk) for request, chunk in rows]
        try:
            return [(logits, None) for logits in self._engine.step(batch)]
        except Exception as batch_error:  # noqa: BLE001
            if len(rows) == 1:
                return [(None, batch_error)]
        outcomes = []
        for row in batch:
            try:
                outcomes.append((self._engine.step([row])[0], None))
            except Exception as error:  # noqa: BLE001
                outcomes.append((None, error))
        return outcomes

    def _release(self, request: _Request) -> None:
        if request in self._active:
            self._active.remove(request)
        if request.stream is not None:
            stream, request.stream = request.stream, None
            self._engine.close_stream(stream)

    def _complete(self, request: _Request, count: bool = True) -> None:
        try:
            self._release(request)
            result = request.progress.result()
        except Exception as error:  # noqa: BLE001 - e.g. the tokenizer failed
            self._fail(request, error)
            return
        if count:
            with self._condition:
                self._counts["completed"] += 1
        request.handle._finish(result, None)

    def _fail(self, request: _Request, error: BaseException) -> None:
        """Fail one request; never raises (the request's own error is what its client sees)."""
        try:
            self._release(request)
        except Exception:  # noqa: BLE001, S110 - closing a failed request's stream is best effort
            pass
        with self._condition:
            self._counts["failed"] += 1
        request.handle._finish(None, error)

