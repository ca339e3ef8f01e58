"""The engine interface: FullForwardEngine's batched steps and checks, block accounting and
admission, make_engine's choice, and NativeEngine (over a stand-in of the decode-session API
today; over the library's own sessions once they exist)."""

from __future__ import annotations

import pytest
from serving_fakes import BigramModel, FakeNativeModel, fake_decode_batch

import riftco_transformer
from riftco_transformer import DecoderOnlyTransformer, RiftcoTransformerError
from riftco_transformer.serving import (
    Admission,
    FullForwardEngine,
    NativeEngine,
    PoolFullError,
    RequestRejectedError,
    make_engine,
    native_decode_available,
)

NATIVE_SESSIONS = hasattr(DecoderOnlyTransformer, "kv_cache_pool")
needs_native_sessions = pytest.mark.skipif(
    not NATIVE_SESSIONS, reason="the library binding has no KV-cache decode sessions yet")


def last_logits(model, tokens: list[int]) -> list[float]:
    vocabulary = model.config.vocabulary_size
    with model(tokens) as logits:
        return logits.tolist()[(len(tokens) - 1) * vocabulary :]


def assert_close(actual, expected, tolerance=1e-5):
    assert len(actual) == len(expected)
    assert max(abs(a - b) for a, b in zip(actual, expected)) <= tolerance


# ---- FullForwardEngine -----------------------------------------------------------------------


def test_one_batched_step_gives_each_row_the_logits_of_its_own_forward(model):
    engine = FullForwardEngine(model)
    streams = [engine.open_stream(8) for _ in range(3)]
    engine.step([(streams[0], [1, 2, 3]), (streams[1], [4])])
    rows = [(streams[0], [5]), (streams[1], [6, 7, 8, 9]), (streams[2], [10, 11])]
    logits = engine.step(rows)
    for actual, expected in zip(logits, ([1, 2, 3, 5], [4, 6, 7, 8, 9], [10, 11])):
        assert_close(actual, last_logits(model, expected), 1e-6)
    assert [stream.size for stream in streams] == [4, 5, 2]


def test_a_model_without_batching_gets_one_forward_per_row():
    model = BigramModel({1: 2, 3: 4}, vocabulary_size=5, maximum_context=4)
    engine = FullForwardEngine(model)
    first, second = engine.open_stream(4), engine.open_stream(4)
    logits = engine.step([(first, [0, 1]), (second, [3])])
    assert [row.index(1.0) for row in logits] == [2, 4]
    assert model.calls == 2


def test_a_failing_batch_changes_no_stream(model):
    engine = FullForwardEngine(model)
    first, second = engine.open_stream(8), engine.open_stream(8)
    engine.step([(first, [1, 2])])
    cases = [
        ([(first, [3]), (second, [32])], ValueError,
         r"batch\[1\] tokens\[0\] = 32 is not below the vocabulary size 32"),
        ([(first, [3]), (second, [])], ValueError, r"batch\[1\] tokens must hold at least one"),
        ([(first, [3]), (first, [4])], ValueError, r"batch\[1\] names a stream an earlier row"),
        ([(first, [1] * 7)], IndexError,
         r"batch\[0\]: the stream holds 2 tokens; 7 more would pass its capacity of 8"),
        ([(first, ["a"])], TypeError, r"batch\[0\] tokens\[0\] must be an int, not str"),
        ([(first, 3)], TypeError, r"batch\[0\] tokens must be a sequence of token ids"),
        ([first], TypeError, r"batch\[0\] must be a \(stream, tokens\) pair"),
    ]
    for batch, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            engine.step(batch)
        assert (first.size, second.size) == (2, 0)
    assert engine.step([]) == []


def test_streams_reset_close_and_belong_to_their_engine(model):
    engine, other = FullForwardEngine(model), FullForwardEngine(model)
    stream = engine.open_stream(8)
    engine.step([(stream, [1, 2, 3])])
    engine.reset_stream(stream)
    assert stream.size == 0
    with pytest.raises(ValueError, match="is not a stream of it"):
        other.step([(stream, [1])])
    engine.close_stream(stream)
    engine.close_stream(stream)  # idempotent
    assert stream.closed
    with pytest.raises(ValueError, match="batch\\[0\\] stream is closed"):
        engine.step([(stream, [1])])
    engine.close()
    with pytest.raises(RuntimeError, match="FullForwardEngine is closed"):
        engine.open_stream(4)


def test_block_accounting_admits_waits_and_rejects(model):
    # C = 8, blocks of 4 tokens, 3 blocks: a full context needs 2.
    engine = FullForwardEngine(model, block_size=4, block_count=3)
    assert engine.admission(100) is Admission.ADMIT  # a budget counts at most C tokens
    first = engine.open_stream(8)
    assert engine.capacity().reserved_block_count == 2
    assert engine.admission(5) is Admission.WAIT
    assert engine.admission(4) is Admission.ADMIT
    with pytest.raises(PoolFullError, match="needs 2 KV blocks; only 1 of 3 are unreserved"):
        engine.open_stream(5)
    second = engine.open_stream(3)
    engine.step([(first, [1, 2, 3, 4, 5])])
    capacity = engine.capacity()
    assert (capacity.kv_cache, capacity.block_size, capacity.block_count) == ("none", 4, 3)
    assert (capacity.reserved_block_count, capacity.leased_block_count,
            capacity.open_stream_count, capacity.blocks_per_full_cache) == (3, 2, 2, 2)
    engine.close_stream(first)
    engine.close_stream(second)
    assert engine.capacity().reserved_block_count == 0

    small = FullForwardEngine(model, block_size=4, block_count=1)
    assert small.admission(5) is Admission.REJECT
    with pytest.raises(RequestRejectedError, match="needs 2 KV blocks of 4 tokens, more than "
                                                   "the whole pool of 1"):
        small.open_stream(5)
    with pytest.raises(ValueError, match="token_budget must be in \\[1,"):
        small.admission(0)


def test_make_engine_picks_by_what_the_model_offers(model):
    engine = FullForwardEngine(model)
    assert make_engine(engine) is engine
    chosen = make_engine(BigramModel({}, 4, 4))
    assert isinstance(chosen, FullForwardEngine)
    expected = NativeEngine if NATIVE_SESSIONS else FullForwardEngine
    assert isinstance(make_engine(model), expected)
    with pytest.raises(ValueError, match="kv_cache must be one of 'paged', 'contiguous'"):
        make_engine(BigramModel({}, 4, 4), kv_cache="ring")
    with pytest.raises(TypeError, match="model must be callable"):
        FullForwardEngine(object())


@pytest.mark.skipif(NATIVE_SESSIONS, reason="the library binding has decode sessions")
def test_native_engine_explains_that_decode_sessions_are_missing(model):
    assert not native_decode_available()
    with pytest.raises(RuntimeError, match="NativeEngine needs KV-cache decode sessions"):
        NativeEngine(model)


# ---- NativeEngine over the stand-in API --------------------------------------------------------


@pytest.fixture
def fake_native(model, monkeypatch):
    """A FakeNativeModel, with riftco_transformer.decode_batch the stand-in's."""
    monkeypatch.setattr(riftco_transformer, "decode_batch", fake_decode_batch, raising=False)
    return FakeNativeModel(model)


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_native_engine_steps_sessions_with_one_decode_batch(fake_native, model, kv_cache):
    assert native_decode_available(fake_native)
    block_count = 4 if kv_cache == "paged" else 0  # two full contexts of 2 blocks
    engine = make_engine(fake_native, kv_cache=kv_cache, block_size=4, block_count=block_count)
    assert isinstance(engine, NativeEngine) and engine.kind == "native"
    first, second = engine.open_stream(8), engine.open_stream(3)
    logits = engine.step([(first, [1, 2, 3]), (second, [4])])
    assert_close(logits[0], last_logits(model, [1, 2, 3]), 1e-6)
    assert_close(logits[1], last_logits(model, [4]), 1e-6)
    engine.reset_stream(first)
    assert first.size == 0
    capacity = engine.capacity()
    assert capacity.kv_cache == kv_cache and capacity.open_stream_count == 2
    engine.close()
    assert first.closed and second.closed


def test_a_paged_native_engine_reserves_against_its_pool(fake_native):
    # block_count 0: one full context (8 tokens = 2 blocks of 4).
    engine = NativeEngine(fake_native, block_size=4, block_count=0)
    pool = fake_native.pools[-1]
    assert engine.admission(8) is Admission.ADMIT
    stream = engine.open_stream(8)
    assert engine.admission(1) is Admission.WAIT
    engine.step([(stream, [1, 2, 3, 4, 5])])
    capacity = engine.capacity()
    assert (capacity.block_count, capacity.reserved_block_count,
            capacity.leased_block_count) == (2, 2, pool.leased_block_count)
    assert pool.leased_block_count == 2
    engine.close_stream(stream)
    assert pool.leased_block_count == 0 and engine.admission(8) is Admission.ADMIT
    engine.close()
    assert pool.closed


def test_a_contiguous_native_engine_takes_no_block_count(fake_native):
    with pytest.raises(ValueError, match="block_count applies to the paged cache only"):
        NativeEngine(fake_native, kv_cache="contiguous", block_count=4)


# ---- the library's own decode sessions ------------------------------------------------------


@needs_native_sessions
@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_native_sessions_match_full_forwards_through_rollover(model, kv_cache):
    native = NativeEngine(model, kv_cache=kv_cache, block_size=4, block_count=0)
    reference = FullForwardEngine(model)
    stream, expected_stream = native.open_stream(8), reference.open_stream(8)
    feeds = [[1, 2, 3], [4], [5, 6], [7], [8]]
    for tokens in feeds:
        actual = native.step([(stream, tokens)])[0]
        expected = reference.step([(expected_stream, tokens)])[0]
        assert_close(actual, expected, 1e-4)
    native.reset_stream(stream)
    reference.reset_stream(expected_stream)
    assert_close(native.step([(stream, [9, 10])])[0],
                 reference.step([(expected_stream, [9, 10])])[0], 1e-4)
    native.close()


@needs_native_sessions
def test_native_decode_batch_failures_change_no_session(model):
    pool = model.kv_cache_pool(block_size=4, block_count=0)  # 2 pages: one context
    first, second = pool.session(), pool.session()
    first.prefill([1, 2, 3, 4, 5])  # both pages
    assert pool.leased_block_count == 2
    error = pytest.raises(RiftcoTransformerError, riftco_transformer.decode_batch,
                          [first, second], [[6], [7]]).value
    assert error.status_name == "runtime_error" and "pool exhausted" in error.detail
    assert (first.size, second.size) == (5, 0)
    first.prefill([6, 7, 8])
    error = pytest.raises(RiftcoTransformerError, riftco_transformer.decode_batch,
                          [first], [[9]]).value
    assert error.status_name == "out_of_range" and first.size == 8
    first.close()
    second.close()
    assert pool.leased_block_count == 0
    pool.close()


@needs_native_sessions
def test_native_sessions_report_their_cache(model):
    with model.decode_session(cache="contiguous") as session:
        assert (session.cache_kind, session.capacity, session.size) == (
            "contiguous", model.config.maximum_context, 0)
    pool = model.kv_cache_pool(block_size=4, block_count=6)
    assert (pool.block_size, pool.block_count, pool.blocks_per_full_cache,
            pool.free_block_count, pool.leased_block_count) == (4, 6, 2, 6, 0)
    pool.close()


def test_the_stand_in_matches_the_documented_failures(fake_native):
    """The stand-in honours the contract the native tests above check for real."""
    pool = fake_native.kv_cache_pool(block_size=4, block_count=0)
    first, second = pool.session(), pool.session()
    first.prefill([1, 2, 3, 4, 5])
    with pytest.raises(RiftcoTransformerError) as caught:
        fake_decode_batch([first, second], [[6], [7]])
    assert caught.value.status_name == "runtime_error" and "pool exhausted" in caught.value.detail
    assert (first.size, second.size) == (5, 0)


def test_engine_dimensions_come_from_the_model_config():
    engine = FullForwardEngine(BigramModel({}, vocabulary_size=7, maximum_context=3))
    assert (engine.vocabulary_size, engine.maximum_context, engine.kind) == (
        7, 3, "full_forward")
