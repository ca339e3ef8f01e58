"""The continuous-batching scheduler: one batched engine step per iteration, requests joining
and leaving between steps, chunked prefill beside decodes, admission (wait and reject), the
bounded queue, cancellation, and failures that stay with their requests. Every wait here is
bounded: a hung scheduler fails the test instead of hanging it."""

from __future__ import annotations

import threading

import pytest
from serving_fakes import (
    BigramModel,
    RecordingEngine,
    ascii_tokenizer,
    scheduler_factory,
    wait_until,
)

from riftco_transformer import Tokenizer
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    QueueFullError,
    RequestCancelledError,
    RequestRejectedError,
    Scheduler,
    SchedulerClosedError,
    TextGenerator,
)

TIMEOUT = 10.0
SUCCESSOR = {token: (token + 1) % 128 for token in range(128)}  # greedy counts upwards


@pytest.fixture
def schedulers():
    """Make schedulers over RecordingEngines; all are released and closed afterwards."""
    yield from scheduler_factory(SUCCESSOR, 64, TIMEOUT)


def shape(engine: RecordingEngine) -> list[list[tuple[int, int]]]:
    """Each recorded step as [(stream number, tokens fed)]."""
    return [[(number, len(tokens)) for number, tokens in rows] for rows in engine.steps]


def config(count: int, **fields) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=count, **fields)


def held_first_step(scheduler, engine, prompt, count):
    """Submit a request and hold its first step until the gate opens, so the requests
    submitted next are all waiting when the scheduler next admits."""
    engine.gate.clear()
    handle = scheduler.submit(prompt, config(count))
    assert engine.entered.wait(TIMEOUT)
    return handle


def test_active_requests_advance_together_in_one_engine_step(schedulers):
    scheduler, engine = schedulers()
    first = held_first_step(scheduler, engine, [10, 11, 12], 5)
    others = [scheduler.submit([start, start + 1, start + 2], config(5))
              for start in (20, 30, 40)]
    engine.gate.set()
    assert first.result(TIMEOUT).generated_token_ids == (13, 14, 15, 16, 17)
    for start, handle in zip((20, 30, 40), others):
        assert handle.result(TIMEOUT).generated_token_ids == tuple(range(start + 3, start + 8))
    assert shape(engine) == [
        [(0, 3)],
        [(0, 1), (1, 3), (2, 3), (3, 3)],  # the three join: prefills beside a decode
        [(0, 1), (1, 1), (2, 1), (3, 1)],
        [(0, 1), (1, 1), (2, 1), (3, 1)],
        [(0, 1), (1, 1), (2, 1), (3, 1)],
        [(1, 1), (2, 1), (3, 1)],  # the first left after its fifth token
    ]
    stats = scheduler.stats()
    assert (stats.step_count, stats.decode_row_count, stats.prefill_row_count,
            stats.prefill_token_count, stats.completed_count) == (6, 16, 4, 12, 4)
    assert engine.capacity().open_stream_count == 0


def test_long_prompts_are_prefilled_in_chunks_beside_the_running_decodes(schedulers):
    scheduler, engine = schedulers(prefill_chunk_tokens=4)
    first = held_first_step(scheduler, engine, [10, 11, 12], 6)
    long = scheduler.submit(list(range(20, 30)), config(2))
    medium = scheduler.submit(list(range(40, 46)), config(1))
    engine.gate.set()
    assert first.result(TIMEOUT).generated_token_ids == (13, 14, 15, 16, 17, 18)
    assert long.result(TIMEOUT).generated_token_ids == (30, 31)
    assert medium.result(TIMEOUT).generated_token_ids == (46,)
    assert shape(engine) == [
        [(0, 3)],
        [(0, 1), (1, 4)],  # at most 4 prefill tokens per step; the decode always runs
        [(0, 1), (1, 4)],
        [(0, 1), (1, 2), (2, 2)],  # the rest of the budget goes to the next prompt
        [(0, 1), (1, 1), (2, 4)],
        [(0, 1)],
    ]


def test_requests_join_and_leave_and_match_the_generator_one_by_one(tiny_config):
    import dataclasses

    from riftco_transformer import DecoderOnlyTransformer

    tokenizer = Tokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
    model = DecoderOnlyTransformer(
        dataclasses.replace(tiny_config, vocabulary_size=tokenizer.vocab_size))
    requests = [
        ("hello there", config(6)),
        ("a", config(12, temperature=1.0, seed=5)),
        ("the quick brown fox jumps", config(9, temperature=0.8, top_k=5, top_p=0.9, seed=2)),
        ("xyz", config(3, stop="q")),
        ("zz", config(15, repetition_penalty=1.3)),
    ]
    with model, tokenizer:
        generator = TextGenerator(FullForwardEngine(model), tokenizer)
        expected = [generator.generate(prompt, request) for prompt, request in requests]
        engine = FullForwardEngine(model)
        with Scheduler(engine, tokenizer, max_active_requests=3, prefill_chunk_tokens=5) as s:
            handles = []
            for index, (prompt, request) in enumerate(requests):
                handles.append(s.submit(tokenizer.encode(prompt), request))
                if index == 1:  # let the first two run a little before the rest join
                    assert wait_until(lambda: s.stats().step_count >= 2, TIMEOUT)
            results = [handle.result(TIMEOUT) for handle in handles]
        assert results == expected
        assert engine.capacity().open_stream_count == 0


def test_a_request_waits_while_the_pool_is_full_and_runs_when_pages_return(schedulers):
    # Blocks of 4 tokens, 2 in the pool: a request with a budget of 8 tokens takes all.
    scheduler, engine = schedulers(8, engine_options={"block_size": 4, "block_count": 2})
    first = held_first_step(scheduler, engine, [10, 11, 12], 6)  # budget 3 + 6 - 1 = 8
    second = scheduler.submit([20, 21, 22], config(6))
    assert wait_until(lambda: scheduler.stats().waiting_count == 1, TIMEOUT)
    assert engine.capacity().reserved_block_count == 2
    engine.gate.set()
    assert first.result(TIMEOUT).generated_token_ids == (13, 14, 15, 16, 17, 18)
    assert second.result(TIMEOUT).generated_token_ids == (23, 24, 25, 26, 27, 28)
    streams_per_step = [{number for number, _ in rows} for rows in engine.steps]
    assert all(len(streams) == 1 for streams in streams_per_step)
    assert streams_per_step.index({1}) == 6  # only after the first one's six steps


def test_a_request_that_can_never_fit_is_rejected_at_submit(schedulers):
    scheduler, engine = schedulers(8, engine_options={"block_size": 4, "block_count": 1})
    with pytest.raises(RequestRejectedError, match="can never fit: its KV reservation of 5 "
                                                   "tokens"):
        scheduler.submit([10, 11, 12], config(3))  # 3 + 3 - 1 = 5 tokens: 2 blocks
    assert scheduler.submit([10, 11, 12], config(2)).result(TIMEOUT).generated_token_ids == (
        13, 14)


def test_a_full_waiting_queue_refuses_more_requests(schedulers):
    scheduler, engine = schedulers(max_active_requests=1, max_queued_requests=1)
    first = held_first_step(scheduler, engine, [10], 2)
    queued = scheduler.submit([20], config(2))
    with pytest.raises(QueueFullError, match="1 requests are already waiting "
                                             r"\(max_queued_requests=1\)"):
        scheduler.submit([30], config(2))
    engine.gate.set()
    assert first.result(TIMEOUT).generated_token_ids == (11, 12)
    assert queued.result(TIMEOUT).generated_token_ids == (21, 22)


def test_cancelling_a_running_request_frees_its_pages(schedulers):
    scheduler, engine = schedulers(engine_options={"block_size": 4, "block_count": 64})
    running = held_first_step(scheduler, engine, [10, 11], 50)
    assert engine.capacity().reserved_block_count > 0
    running.cancel()
    engine.gate.set()
    with pytest.raises(RequestCancelledError, match="was cancelled"):
        running.result(TIMEOUT)
    with pytest.raises(RequestCancelledError):
        list(running)
    assert wait_until(lambda: engine.capacity().reserved_block_count == 0, TIMEOUT)
    capacity = engine.capacity()
    assert (capacity.open_stream_count, capacity.leased_block_count) == (0, 0)
    assert scheduler.stats().cancelled_count == 1
    assert len(engine.steps) <= 2  # dropped before its next step


def test_cancelling_a_waiting_request_ends_it_at_once(schedulers):
    scheduler, engine = schedulers(max_active_requests=1)
    first = held_first_step(scheduler, engine, [10], 3)
    waiting = scheduler.submit([20], config(3))
    waiting.cancel()
    assert waiting.done()
    with pytest.raises(RequestCancelledError):
        waiting.result(0)
    engine.gate.set()
    assert first.result(TIMEOUT).generated_token_ids == (11, 12, 13)
    assert {number for rows in engine.steps for number, _ in rows} == {0}


def test_a_failing_row_fails_only_its_own_request(schedulers):
    scheduler, engine = schedulers(engine_options={"poison": 99})
    healthy = held_first_step(scheduler, engine, [10, 11, 12], 4)
    poisoned = scheduler.submit([97, 98], config(4))  # samples 99, whose feed fails
    events = []
    engine.gate.set()
    assert healthy.result(TIMEOUT).generated_token_ids == (13, 14, 15, 16)
    with pytest.raises(RuntimeError, match="poisoned token 99"):
        for event in poisoned:
            events.append(event.token_id)
    assert events == [99]
    assert scheduler.stats().failed_count == 1
    assert engine.capacity().open_stream_count == 0


def test_a_failing_sampler_or_callback_fails_only_its_request(schedulers):
    scheduler, _ = schedulers()

    class BrokenSampler:
        def sample(self, logits, context_ids=()):
            raise ValueError("the sampler broke")

    def broken_callback(event):
        raise KeyError("the callback broke")

    healthy = scheduler.submit([10], config(3))
    broken = scheduler.submit([20], config(3), sampler=BrokenSampler())
    calling = scheduler.submit([30], config(3), on_event=broken_callback)
    seen = []
    counted = scheduler.submit([40], config(2), on_event=lambda event: seen.append(event.index))
    assert healthy.result(TIMEOUT).generated_token_ids == (11, 12, 13)
    with pytest.raises(ValueError, match="the sampler broke"):
        broken.result(TIMEOUT)
    with pytest.raises(KeyError, match="the callback broke"):
        calling.result(TIMEOUT)
    assert counted.result(TIMEOUT).generated_token_ids == (41, 42) and seen == [0, 1]


def test_a_broken_loop_fails_every_request_instead_of_hanging(schedulers):
    scheduler, engine = schedulers()

    def admission(token_budget):
        if threading.current_thread().name == "riftco-scheduler":
            raise RuntimeError("admission broke")
        return type(engine).admission(engine, token_budget)

    engine.admission = admission
    handle = scheduler.submit([10], config(3))
    with pytest.raises(SchedulerClosedError, match="stopped after an error") as caught:
        handle.result(TIMEOUT)
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(SchedulerClosedError, match="admission broke"):
        scheduler.submit([10], config(3))


def test_closing_fails_waiting_and_running_requests_and_refuses_new_ones(schedulers):
    scheduler, engine = schedulers(max_active_requests=1)
    running = held_first_step(scheduler, engine, [10], 20)
    waiting = scheduler.submit([20], config(5))
    scheduler.close(timeout=0.05)  # the held step keeps the thread busy
    engine.gate.set()
    for handle in (running, waiting):
        with pytest.raises(SchedulerClosedError, match="the scheduler was closed"):
            handle.result(TIMEOUT)
    with pytest.raises(SchedulerClosedError, match="the scheduler is closed"):
        scheduler.submit([30], config(1))
    scheduler.close(timeout=TIMEOUT)
    assert wait_until(lambda: engine.capacity().open_stream_count == 0, TIMEOUT)


def test_zero_new_tokens_finishes_at_submit_without_a_step(schedulers):
    scheduler, engine = schedulers()
    handle = scheduler.submit([10, 11], config(0))
    assert handle.done() and handle.result(0).generated_token_ids == ()
    assert handle.next_event(0) is None
    assert engine.steps == []


def test_waiting_for_a_slow_request_times_out_instead_of_blocking(schedulers):
    scheduler, engine = schedulers()
    handle = held_first_step(scheduler, engine, [10], 2)
    with pytest.raises(TimeoutError, match="did not finish within 0.01 s"):
        handle.result(0.01)
    with pytest.raises(TimeoutError, match="no event of request"):
        handle.next_event(0.01)
    engine.gate.set()
    assert [event.token_id for event in handle] == [11, 12]
    assert handle.next_event(0) is None


def test_bad_requests_and_options_are_refused_by_name(schedulers):
    scheduler, _ = schedulers()
    with pytest.raises(ValueError, match="prompt token 0 is 128, not below the vocabulary"):
        scheduler.submit([128], config(1))
    with pytest.raises(ValueError, match="at least one token"):
        scheduler.submit([], config(1))
    model = BigramModel(SUCCESSOR, 128, 8)
    with pytest.raises(ValueError, match="max_active_requests must be in \\[1,"):
        Scheduler(FullForwardEngine(model), ascii_tokenizer(), max_active_requests=0)
    with pytest.raises(ValueError, match="prefill_chunk_tokens must be in \\[1,"):
        Scheduler(FullForwardEngine(model), ascii_tokenizer(), prefill_chunk_tokens=0)
    with pytest.raises(ValueError, match="the tokenizer has 128 tokens but the model's "
                                         "vocabulary_size is 12"):
        Scheduler(FullForwardEngine(BigramModel({}, 12, 8)), ascii_tokenizer())
