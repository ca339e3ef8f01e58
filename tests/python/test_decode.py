"""KV-cached decoding from Python: DecodeSession, KvCachePool and decode_batch against the full
forward (torch-free: the model's own full-sequence forward is the oracle), the transaction and
pinning rules, and argument errors."""

from __future__ import annotations

import copy
import pickle
from array import array

import pytest
from support import native_error

from riftco_transformer import (
    STATUS_INVALID_ARGUMENT,
    STATUS_OUT_OF_RANGE,
    STATUS_RUNTIME_ERROR,
    Adam,
    DecodeSession,
    DecoderOnlyTransformer,
    KvCachePool,
    LoraConfig,
    decode_batch,
)

SEQUENCE = [3, 1, 4, 1, 5, 9, 2, 6]  # TINY_CONFIG: V=32, C=8


def full_logits(model, tokens):
    flat = model(tokens).tolist()  # row-major [1, T, V]
    vocabulary = model.config.vocabulary_size
    return [tuple(flat[t * vocabulary : (t + 1) * vocabulary]) for t in range(len(tokens))]


def assert_close(actual, expected, tolerance=1e-5):
    assert len(actual) == len(expected)
    worst = max(abs(a - b) for a, b in zip(actual, expected))
    assert worst <= tolerance, worst


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
def test_steps_equal_the_full_forward_at_every_position(model, cache):
    expected = full_logits(model, SEQUENCE)
    with model.decode_session(cache=cache, block_size=3) as session:
        assert session.capacity == 8
        assert session.cache_kind == cache == session.cache
        assert session.block_size == (3 if cache == "paged" else 8)
        for position, token in enumerate(SEQUENCE):
            logits = session.step(token)
            # array('f'): no V Python float objects per step (that cost more than the step)
            assert isinstance(logits, array) and logits.typecode == "f" and len(logits) == 32
            assert_close(logits, expected[position])
            assert session.size == position + 1


def test_paged_and_contiguous_are_identical_and_prefill_matches_steps(model):
    paged = model.decode_session("paged", 2)
    contiguous = model.decode_session("contiguous")
    stepped = [paged.step(token) for token in SEQUENCE]
    assert stepped == [contiguous.step(token) for token in SEQUENCE]
    prefilled = model.decode_session()
    assert_close(prefilled.prefill(SEQUENCE[:5]), stepped[4])
    assert_close(prefilled.prefill(SEQUENCE[5:]), stepped[7])  # a second chunk continues
    for session in (paged, contiguous, prefilled):
        session.close()


def test_full_sessions_never_roll_over_and_reset_replays(model):
    session = model.decode_session()
    session.prefill(SEQUENCE)
    error = native_error(lambda: session.step(1))
    assert error.status == STATUS_OUT_OF_RANGE and "never rolls over" in error.detail
    assert session.size == 8
    session.reset()
    assert session.size == 0
    window = SEQUENCE[2:] + [7, 7]
    assert_close(session.prefill(window), full_logits(model, window)[-1])


def test_pool_sessions_batch_like_separate_sessions_and_exhaustion_changes_nothing(model):
    pool = model.kv_cache_pool(block_size=2, block_count=5)
    assert isinstance(pool, KvCachePool)
    assert (pool.block_size, pool.block_count, pool.blocks_per_full_cache) == (2, 5, 4)
    a, b = pool.session(), pool.session()
    assert a.pool is pool and model.decode_session().pool is None
    first = decode_batch([a, b], [SEQUENCE[:3], SEQUENCE[:4]])
    assert all(isinstance(row, array) and row.typecode == "f" and len(row) == 32 for row in first)
    for row in first:  # the library's argmax (first maximum) and finiteness ride along
        assert row.argmax == list(row).index(max(row)) and row.all_finite is True
    expected = full_logits(model, SEQUENCE)
    assert_close(first[0], expected[2])
    assert_close(first[1], expected[3])
    assert pool.leased_block_count == 4 and pool.free_block_count == 1
    # a needs one more page (position 3 stays in page 1; 4 needs page 2), b needs one: 1 free.
    error = native_error(lambda: decode_batch([b, a], [SEQUENCE[4:6], SEQUENCE[3:5]]))
    assert error.status == STATUS_RUNTIME_ERROR and "pool exhausted" in error.detail
    assert (a.size, b.size, pool.free_block_count) == (3, 4, 1)
    step = decode_batch([a, b], [[SEQUENCE[3]], [SEQUENCE[4]]])
    assert_close(step[0], expected[3])
    assert_close(step[1], expected[4])
    b.close()
    assert pool.free_block_count == 3
    a.close()
    assert pool.leased_block_count == 0


def test_decode_batch_argument_rules(model):
    pool = model.kv_cache_pool(block_size=4)
    a = pool.session()
    with pytest.raises(ValueError, match="at least one session"):
        decode_batch([], [])
    with pytest.raises(ValueError, match="2 token lists"):
        decode_batch([a], [[1], [2]])
    with pytest.raises(TypeError, match="sessions\\[0\\] must be a DecodeSession"):
        decode_batch([object()], [[1]])
    with pytest.raises(ValueError, match="at least one token"):
        decode_batch([a], [[]])
    with pytest.raises(ValueError):
        decode_batch([a], [[-1]])
    assert native_error(lambda: decode_batch([a, a], [[1], [2]])).status == STATUS_INVALID_ARGUMENT
    # A private (contiguous) cache batches with the pool's session.
    private = model.decode_session(cache="contiguous")
    mixed = decode_batch([private, a], [SEQUENCE[:2], SEQUENCE[:3]])
    expected = full_logits(model, SEQUENCE)
    assert_close(mixed[0], expected[1])
    assert_close(mixed[1], expected[2])
    a.reset()
    with DecoderOnlyTransformer(model.config) as other:
        with pytest.raises(ValueError, match="same model"):
            decode_batch([a, other.decode_session()], [[1], [2]])
    error = native_error(lambda: decode_batch([a], [[32]]))
    assert error.status == STATUS_OUT_OF_RANGE
    assert a.size == 0
    a.close()
    with pytest.raises(RuntimeError, match="closed"):
        decode_batch([a], [[1]])


def test_session_argument_errors(model):
    with pytest.raises(ValueError, match="cache must be one of"):
        model.decode_session(cache="ring")
    with pytest.raises(TypeError):
        model.decode_session(cache=1)
    with pytest.raises(ValueError):
        model.decode_session(block_size=0)
    with pytest.raises(TypeError):
        model.decode_session(block_size=True)
    error = native_error(lambda: model.kv_cache_pool(block_size=4, block_count=1))
    assert error.status == STATUS_INVALID_ARGUMENT and "block_count 1" in error.detail
    session = model.decode_session()
    with pytest.raises(TypeError):
        session.step(1.5)
    with pytest.raises(ValueError):
        session.step(-1)
    assert native_error(lambda: session.step(32)).status == STATUS_OUT_OF_RANGE
    with pytest.raises(ValueError, match="one flat row"):
        session.prefill([[1, 2]])
    with pytest.raises(ValueError, match="at least one"):
        session.prefill([])
    assert session.size == 0
    with pytest.raises(TypeError):
        copy.copy(session)
    with pytest.raises(TypeError):
        pickle.dumps(session)
    session.close()
    with pytest.raises(RuntimeError, match="DecodeSession is closed"):
        session.step(1)
    assert "closed" in repr(session)


def test_sessions_pin_the_model_and_outlive_its_handle(tiny_config):
    model = DecoderOnlyTransformer(tiny_config)
    parameters = model.parameters()
    adam = Adam(parameters)
    session = model.decode_session()
    for change in (
        lambda: model.to("cpu"),
        lambda: model.quantize_nf4(block_size=64),
        lambda: model.attach_lora(LoraConfig()),
        lambda: adam.step(),
        lambda: parameters.load_flat_values(parameters.flat_values()),
    ):
        error = native_error(change)
        assert error.status == STATUS_RUNTIME_ERROR and "decode session" in error.detail
    expected = full_logits(model, SEQUENCE[:2])
    model.close()
    session.step(SEQUENCE[0])
    assert_close(session.step(SEQUENCE[1]), expected[1])
    session.close()
    adam.close()
    parameters.close()


def test_packed_nf4_models_decode_like_their_forward(tiny_config):
    with DecoderOnlyTransformer(tiny_config) as model:
        model.quantize_nf4(block_size=32)
        expected = full_logits(model, SEQUENCE)
        with model.decode_session() as session:
            for position, token in enumerate(SEQUENCE):
                assert_close(session.step(token), expected[position])
        assert model.quantized_linear_weights


def test_repr_and_types(model):
    session = model.decode_session(block_size=4)
    assert isinstance(session, DecodeSession)
    assert repr(session) == "<DecodeSession paged size=0 capacity=8 block_size=4>"
    pool = model.kv_cache_pool(block_size=4)
    assert repr(pool) == "<KvCachePool block_size=4 blocks=2 free=2>"
    session.close()
    pool.close()


def test_prefix_caching_shares_pages_and_gives_the_cold_logits(model):
    expected = full_logits(model, SEQUENCE)
    pool = model.kv_cache_pool(block_size=2, block_count=8, prefix_caching=True)
    assert pool.prefix_caching and pool.cached_block_count == 0
    with pool.session() as cold:
        assert cold.reuse_prefix(SEQUENCE) == 0  # nothing cached yet
        cold.prefill(SEQUENCE[:5])  # pages 0 and 1 full and published, page 2 not
    assert (pool.cached_block_count, pool.free_block_count) == (2, 8)
    warm = pool.session()
    assert warm.reuse_prefix(SEQUENCE) == 4
    assert warm.size == 4 and pool.cached_block_count == 0 and pool.leased_block_count == 2
    assert_close(warm.prefill(SEQUENCE[4:7]), expected[6])
    assert_close(warm.step(SEQUENCE[7]), expected[7])
    # Only an empty session adopts; bad ids are named; nothing changes.
    error = native_error(lambda: warm.reuse_prefix(SEQUENCE))
    assert error.status == STATUS_RUNTIME_ERROR and "empty session" in error.detail
    other = pool.session()
    error = native_error(lambda: other.reuse_prefix([1, 2, 32]))
    assert error.status == STATUS_OUT_OF_RANGE and "prompt[2] = 32" in error.detail
    with pytest.raises(ValueError, match="one flat row"):
        other.reuse_prefix([[1, 2]])
    assert other.size == 0
    warm.close()
    pool.clear_prefix_cache()
    assert pool.cached_block_count == 0
    assert other.reuse_prefix(SEQUENCE) == 0
    # Without prefix caching nothing is published or adopted.
    plain = model.kv_cache_pool(block_size=2, block_count=8)
    assert not plain.prefix_caching
    with plain.session() as session:
        session.prefill(SEQUENCE)
    assert plain.cached_block_count == 0
    assert plain.session().reuse_prefix(SEQUENCE) == 0
    assert model.decode_session().reuse_prefix(SEQUENCE) == 0
    with pytest.raises(TypeError, match="prefix_caching must be a bool"):
        model.kv_cache_pool(prefix_caching=1)


def test_prefix_caching_never_adopts_pages_of_old_parameter_values(model):
    pool = model.kv_cache_pool(block_size=2, block_count=8, prefix_caching=True)
    with pool.session() as session:
        session.prefill(SEQUENCE)
    with pool.session() as session:
        assert session.reuse_prefix(SEQUENCE) == 6
    adam = Adam(model.parameters())
    adam.step()  # allowed: no session lives; the parameter epoch moves on
    with pool.session() as session:
        assert session.reuse_prefix(SEQUENCE) == 0
        logits = session.prefill(SEQUENCE)
    assert_close(logits, full_logits(model, SEQUENCE)[-1])


def test_reserved_sessions_make_the_pool_the_page_ledger(model):
    pool = model.kv_cache_pool(block_size=2, block_count=6)  # one context is 4 pages
    assert pool.admission(100) == "admit"  # capped at the context: 4 pages
    reserved = pool.session(token_budget=8)
    assert reserved.reserved_block_count == 4 and pool.reserved_block_count == 4
    assert pool.available_block_count == 2 and pool.admission(5) == "wait"
    error = native_error(lambda: pool.session(token_budget=5))
    assert error.status == STATUS_RUNTIME_ERROR and "pool full" in error.detail
    assert pool.reserved_block_count == 4
    with pytest.raises(ValueError):
        pool.session(token_budget=0)
    with pytest.raises(ValueError):
        pool.admission(0)
    plain = pool.session()
    assert plain.reserved_block_count == 0
    plain.prefill(SEQUENCE[:4])  # the 2 pages nobody was promised
    error = native_error(lambda: plain.step(SEQUENCE[4]))
    assert error.status == STATUS_RUNTIME_ERROR and "promised" in error.detail
    assert_close(reserved.prefill(SEQUENCE), full_logits(model, SEQUENCE)[-1])
    reserved.close()
    plain.close()
    assert (pool.reserved_block_count, pool.available_block_count) == (0, 6)
