"""The scheduler and the service over NativeEngine.

Each test runs twice: over the stand-in of the decode-session API (serving_fakes; it runs
everywhere and pins down what NativeEngine asks of the API), and over the library's own
sessions, which is skipped until the binding has them."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from serving_fakes import FakeNativeModel, fake_decode_batch, wait_until

import riftco_transformer
from riftco_transformer import DecoderOnlyTransformer, Tokenizer
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    ModelService,
    NativeEngine,
    RequestCancelledError,
    Scheduler,
    ServingConfig,
    TextGenerator,
)

TIMEOUT = 10.0
NATIVE_SESSIONS = hasattr(DecoderOnlyTransformer, "kv_cache_pool")


@pytest.fixture(params=["stand-in", "library"])
def native_setup(request, tiny_config, monkeypatch):
    """(model with decode sessions, the plain model, a byte tokenizer of its vocabulary)."""
    if request.param == "library" and not NATIVE_SESSIONS:
        pytest.skip("the library binding has no KV-cache decode sessions yet")
    tokenizer = Tokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
    model = DecoderOnlyTransformer(
        dataclasses.replace(tiny_config, vocabulary_size=tokenizer.vocab_size))
    if request.param == "stand-in":
        monkeypatch.setattr(riftco_transformer, "decode_batch", fake_decode_batch,
                            raising=False)
        native = FakeNativeModel(model)
    else:
        native = model
    yield native, model, tokenizer
    model.close()
    tokenizer.close()


REQUESTS = [
    ("hello there", GenerationConfig(max_new_tokens=6)),
    ("a", GenerationConfig(max_new_tokens=12, temperature=1.0, seed=5)),
    ("the quick brown fox jumps", GenerationConfig(max_new_tokens=9)),  # rolls over
    ("zz", GenerationConfig(max_new_tokens=4, stop="q")),
]


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_the_scheduler_over_native_sessions_matches_the_full_forward_generator(
    native_setup, kv_cache
):
    native, model, tokenizer = native_setup
    generator = TextGenerator(FullForwardEngine(model), tokenizer)
    expected = [generator.generate(prompt, config) for prompt, config in REQUESTS]
    block_count = 4 * 2 if kv_cache == "paged" else 0  # four full contexts of 2 blocks
    engine = NativeEngine(native, kv_cache=kv_cache, block_size=4, block_count=block_count)
    with Scheduler(engine, tokenizer, prefill_chunk_tokens=3, close_engine=True) as scheduler:
        handles = [scheduler.submit(tokenizer.encode(prompt), config)
                   for prompt, config in REQUESTS]
        results = [handle.result(TIMEOUT) for handle in handles]
        assert [r.generated_token_ids for r in results] == [
            e.generated_token_ids for e in expected]
        assert results == expected
        stats = scheduler.stats()
        # The library's engine chooses tokens inside its step (no logits come back); the
        # stand-in has no such step.
        library = hasattr(native, "kv_cache_pool") and not isinstance(native, FakeNativeModel)
        assert (stats.library_sampled_step_count == stats.step_count) == library
        capacity = engine.capacity()
        assert (capacity.open_stream_count, capacity.reserved_block_count,
                capacity.leased_block_count) == (0, 0, 0)


def test_a_paged_pool_of_one_context_serves_requests_one_after_another(native_setup):
    native, model, tokenizer = native_setup
    generator = TextGenerator(FullForwardEngine(model), tokenizer)
    expected = [generator.generate(prompt, config) for prompt, config in REQUESTS]
    engine = NativeEngine(native, block_size=4, block_count=0)  # exactly one full context
    with Scheduler(engine, tokenizer, close_engine=True) as scheduler:
        handles = [scheduler.submit(tokenizer.encode(prompt), config)
                   for prompt, config in REQUESTS]
        assert [handle.result(TIMEOUT) for handle in handles] == expected


def test_cancelling_returns_a_native_requests_pages_to_the_pool(native_setup):
    native, _, tokenizer = native_setup
    engine = NativeEngine(native, block_size=2, block_count=8)
    with Scheduler(engine, tokenizer, close_engine=True) as scheduler:
        handle = scheduler.submit(tokenizer.encode("abcdef"),
                                  GenerationConfig(max_new_tokens=200))
        assert handle.next_event(TIMEOUT) is not None
        # Reserved for the whole request (leased pages drop to 0 for a moment at each
        # rollover reset, so they are no steady witness).
        assert engine.capacity().reserved_block_count == 4
        handle.cancel()
        with pytest.raises(RequestCancelledError):
            handle.result(TIMEOUT)
        assert wait_until(lambda: engine.capacity().leased_block_count == 0, TIMEOUT)
        assert engine.capacity().reserved_block_count == 0


def test_the_text_generator_uses_native_sessions_for_a_native_model(native_setup):
    native, model, tokenizer = native_setup
    reference = TextGenerator(FullForwardEngine(model), tokenizer)
    expected = reference.generate("hello", max_new_tokens=10)
    for kv_cache in ("paged", "contiguous"):
        with TextGenerator(native, tokenizer, kv_cache=kv_cache, kv_cache_block_size=4) as g:
            assert isinstance(g.engine, NativeEngine)
            assert g.generate("hello", max_new_tokens=10) == expected


def test_the_service_sizes_its_pool_for_its_active_requests(native_setup):
    native, _, tokenizer = native_setup
    config = ServingConfig(kv_cache_block_size=4, max_active_requests=3)
    with ModelService(native, tokenizer, config) as service:
        health = service.health()
        assert (health["engine"], health["kv_cache"], health["kv_cache_block_size"],
                health["kv_cache_block_count"]) == ("native", "paged", 4, 3 * 2)
        assert health["kv_cache_free_block_count"] == 6
        assert service.generate("abc", max_new_tokens=3).finish_reason == "length"
        health = service.health()
        # "abc" and 2 fed tokens fill one page of 4, which stays cached (and counts as free)
        # with the library's prefix-caching pool; the stand-in caches nothing.
        cached = 0 if isinstance(native, FakeNativeModel) else 1
        assert (health["kv_cache_free_block_count"],
                health["kv_cache_cached_block_count"]) == (6, cached)


def test_prompts_sharing_a_prefix_adopt_its_cached_pages_and_generate_the_same(native_setup):
    native, model, tokenizer = native_setup
    prompts = ["kind hi", "kind yo", "kind hi"]  # 7 tokens each: the tiny context holds 8
    config = GenerationConfig(max_new_tokens=1)
    generator = TextGenerator(FullForwardEngine(model), tokenizer)
    expected = [generator.generate(prompt, config) for prompt in prompts]
    engine = NativeEngine(native, block_size=2, block_count=8)
    with Scheduler(engine, tokenizer, close_engine=True) as scheduler:
        results = []
        for prompt in prompts:  # one after another: each finds the pages of those before
            results.append(scheduler.submit(tokenizer.encode(prompt), config).result(TIMEOUT))
        assert results == expected
        caching = engine.prefix_caching
        # Whole pages of prompt[:-1] (6 tokens, 3 pages of 2): "kind" (4) for the second,
        # all 6 for the third.
        assert scheduler.stats().prefix_reused_token_count == (10 if caching else 0)
        assert engine.prefix_reused_tokens == (10 if caching else 0)
        assert engine.capacity().leased_block_count == 0  # cached pages count as free


def test_choices_of_a_group_share_the_first_ones_prompt_pages(native_setup):
    native, model, tokenizer = native_setup
    prompt = tokenizer.encode("one pro")  # 7 tokens
    configs = [GenerationConfig(max_new_tokens=3, temperature=1.0, seed=seed)
               for seed in (1, 2, 3)]
    generator = TextGenerator(FullForwardEngine(model), tokenizer)
    expected = [generator.generate(prompt, config) for config in configs]
    engine = NativeEngine(native, block_size=2, block_count=12)
    with Scheduler(engine, tokenizer, close_engine=True) as scheduler:
        handles = scheduler.submit_group(prompt, configs)
        assert [handle.result(TIMEOUT) for handle in handles] == expected
        caching = engine.prefix_caching
        # The first choice prefills; the other two adopt its 3 full pages (6 positions).
        assert scheduler.stats().prefix_reused_token_count == (12 if caching else 0)


def test_without_prefix_caching_every_prompt_token_is_fed(native_setup):
    native, _, tokenizer = native_setup
    engine = NativeEngine(native, block_size=2, block_count=8, prefix_caching=False)
    with Scheduler(engine, tokenizer, close_engine=True) as scheduler:
        for _ in range(2):
            scheduler.submit(tokenizer.encode("kind hi"),
                             GenerationConfig(max_new_tokens=1)).result(TIMEOUT)
        assert scheduler.stats().prefix_reused_token_count == 0
        assert scheduler.stats().prefill_token_count == 14
    with pytest.raises(TypeError, match="prefix_caching must be a bool"):
        NativeEngine(native, prefix_caching="yes")


class AdmissionGate:
    """An engine whose first admission (open_stream) waits until ``open`` is set."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.open = threading.Event()

    def open_stream(self, *args, **kwargs):
        assert self.open.wait(TIMEOUT), "the admission gate was never opened"
        return self._engine.open_stream(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_tokens_chosen_inside_the_library_step_equal_the_python_path(tiny_config):
    """The fused step (engine.step_sample) against the plain step plus the Python-side
    samplers: the same ids, texts and log-probabilities for every sampling rule."""
    if not NATIVE_SESSIONS:
        pytest.skip("the library binding has no KV-cache decode sessions")
    tokenizer = Tokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
    model = DecoderOnlyTransformer(
        dataclasses.replace(tiny_config, vocabulary_size=tokenizer.vocab_size + 3))  # padded
    configs = [
        GenerationConfig(max_new_tokens=9, logprobs=3),
        GenerationConfig(max_new_tokens=9, temperature=0.8, top_p=0.9, seed=3, logprobs=0),
        GenerationConfig(max_new_tokens=9, temperature=1.2, top_k=5, min_p=0.05, seed=4),
        GenerationConfig(max_new_tokens=9, temperature=1.0, seed=5, presence_penalty=1.5,
                         frequency_penalty=0.5, repetition_penalty=1.3),
        GenerationConfig(max_new_tokens=9, repetition_penalty=1.5, frequency_penalty=-1.0),
    ]
    results = {}
    for library in (True, False):
        engine = NativeEngine(model, block_size=2, block_count=24)
        engine.library_sampling = library
        # Every request is queued before the first is admitted, so both runs batch the same
        # rows in the same steps: a row's logits may differ in their last bits with the
        # batch's composition, and this test compares the samplers, not the schedules.
        gated = AdmissionGate(engine)
        with Scheduler(gated, tokenizer, close_engine=True) as scheduler:
            handles = [scheduler.submit(tokenizer.encode("hello there"), config)
                       for config in configs]
            handles += scheduler.submit_group(tokenizer.encode("abc"), configs[1:3])
            gated.open.set()
            results[library] = [handle.result(TIMEOUT) for handle in handles]
            sampled = scheduler.stats().library_sampled_step_count
            assert (sampled > 0) == library
    assert results[True] == results[False]
    assert all(len(result.generated_token_ids) == 9 for result in results[True])
    model.close()
    tokenizer.close()


def test_metrics_report_the_pool_by_state_and_the_prefix_cache(native_setup):
    from riftco_transformer.serving.http import ServerMetrics

    native, _, tokenizer = native_setup
    config = ServingConfig(kv_cache_block_size=2, max_active_requests=2)
    with ModelService(native, tokenizer, config) as service:
        for _ in range(2):
            service.generate("kind hi", max_new_tokens=1)
        text = ServerMetrics().exposition(service)
        capacity = service.engine.capacity()
        stats = service.scheduler.stats()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert int(lines['riftco_kv_blocks{state="total"}']) == capacity.block_count == 8
    assert int(lines['riftco_kv_blocks{state="reserved"}']) == 0
    assert int(lines['riftco_kv_blocks{state="available"}']) == 8
    assert int(lines['riftco_kv_blocks{state="cached"}']) == capacity.cached_block_count
    reused = int(lines['riftco_prefill_tokens_total{source="prefix_cache"}'])
    assert reused == stats.prefix_reused_token_count == (
        0 if isinstance(native, FakeNativeModel) else 6)
    assert int(lines['riftco_engine_steps_total{sampling="any"}']) == stats.step_count


def test_a_failed_library_step_falls_back_and_bad_rows_fail_their_request(tiny_config):
    """The fused step changes nothing when it fails, so the plain path runs the same step;
    a row whose logits were not finite fails its request, naming the cause."""
    if not NATIVE_SESSIONS:
        pytest.skip("the library binding has no KV-cache decode sessions")
    from riftco_transformer.native.sampling import SampledRow
    from riftco_transformer.serving.generation import GenerationProgress

    tokenizer = Tokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
    model = DecoderOnlyTransformer(
        dataclasses.replace(tiny_config, vocabulary_size=tokenizer.vocab_size))
    config = GenerationConfig(max_new_tokens=5, temperature=0.9, seed=2)
    expected = TextGenerator(FullForwardEngine(model), tokenizer).generate("hello", config)
    engine = NativeEngine(model, block_size=2, block_count=8)

    def refuse(batch, plans):
        raise RuntimeError("the library step failed")

    engine.step_sample = refuse
    with Scheduler(engine, tokenizer, close_engine=True) as scheduler:
        assert scheduler.submit(tokenizer.encode("hello"), config).result(TIMEOUT) == expected
        assert scheduler.stats().library_sampled_step_count == 0
    with pytest.raises(ValueError, match="step_sample got 1 rows but 0 plans"):
        _plans_mismatch(model)
    progress = GenerationProgress([1, 2], config, config.make_sampler(), maximum_context=8,
                                  vocabulary_size=32, token_bytes=lambda token: b"x")
    progress.commit_chunk(1)
    with pytest.raises(ValueError, match="not all finite"):
        progress.feed_sampled(1, SampledRow("not_finite"))
    model.close()
    tokenizer.close()


def _plans_mismatch(model):
    engine = NativeEngine(model)
    stream = engine.open_stream(4)
    try:
        engine.step_sample([(stream, [1])], [])
    finally:
        engine.close()
