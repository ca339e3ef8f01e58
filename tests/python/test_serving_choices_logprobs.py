"""OpenAI's ``n``, ``logprobs``/``top_logprobs`` and ``echo``: the log-probability helper,
choice seeds, per-token and prompt log-probabilities in generation, scheduler groups (queued,
admitted and cancelled together), and the HTTP answers, checked against a float64
log-softmax of one full forward of the model (``serving_fakes.full_forward_log_softmax``),
whole and streamed. Every wait is bounded."""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import random
import socket
import threading
from array import array
from types import SimpleNamespace

import pytest
from conftest import TINY_CONFIG
from serving_fakes import (
    BigramModel,
    PieceTokenizer,
    RecordingEngine,
    ascii_tokenizer,
    chain,
    full_forward_log_softmax,
    scheduler_factory,
    start_server,
    stop_server,
    wait_until,
)

from riftco_transformer import DecoderOnlyTransformer, Tokenizer
from riftco_transformer.native.decode import LogitsRow
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    ModelService,
    PlainChatTemplate,
    QueueFullError,
    RequestRejectedError,
    ServingConfig,
    TextGenerator,
)
from riftco_transformer.serving.chat import chat_prompt
from riftco_transformer.serving.generation import choice_seed
from riftco_transformer.serving._logprobs import log_probabilities

TIMEOUT = 10.0
CORPUS = "### User:\n### Assistant:\n### System:\nabcdefghijklmnopqrstuvwxyz .,!?'"
MODEL_NAME = "riftco-choices"
TOLERANCE = 1e-4  # served log-probabilities against the float64 full-forward oracle


def float64_log_softmax(values) -> list[float]:
    highest = max(values)
    total = math.fsum(math.exp(value - highest) for value in values)
    return [value - highest - math.log(total) for value in values]


# ---- the helper -------------------------------------------------------------------------------


@pytest.mark.parametrize("top_count", [1, 3, 7, 20])  # ids by index() scans, then by one pass
@pytest.mark.parametrize("kind", ["array", "logits_row", "tuple", "list"])
def test_log_probabilities_are_a_log_softmax_with_the_top_ids_most_likely_first(kind,
                                                                                top_count):
    generator = random.Random(3)
    values = array("f", [generator.gauss(0.0, 4.0) for _ in range(1000)])
    if kind == "logits_row":
        row = LogitsRow("f", values)
        row.argmax, row.all_finite = max(range(1000), key=values.__getitem__), True
        values = row
    elif kind == "tuple":
        values = tuple(values)
    elif kind == "list":
        values = list(values)
    expected = float64_log_softmax(values)
    logprob, top = log_probabilities(values, 17, top_count)
    assert logprob == pytest.approx(expected[17], abs=1e-9)
    ranked = sorted(range(1000), key=lambda token: (-expected[token], token))[:top_count]
    assert [token for token, _ in top] == ranked
    for token, value in top:
        assert value == pytest.approx(expected[token], abs=1e-9)
    assert log_probabilities(values, 17)[1] == ()  # no alternatives unless asked


def test_log_probabilities_rank_equal_logits_by_the_lower_id():
    values = array("f", [0.0, 2.0, 1.0, 2.0, 2.0, 1.0])
    logprob, top = log_probabilities(values, 5, 4)
    assert [token for token, _ in top] == [1, 3, 4, 2]
    for count in (1, 2, 3):  # the index() scans
        assert [token for token, _ in log_probabilities(values, 5, count)[1]] == [1, 3, 4][:count]
    assert [token for token, _ in log_probabilities([1.0, 3.0, 3.0, 2.0, 2.0], 0, 3)[1]] == [
        1, 2, 3]
    assert logprob == pytest.approx(float64_log_softmax(values)[5], abs=1e-12)
    # every id asked for: the whole ranking
    assert [token for token, _ in log_probabilities(values, 0, 6)[1]] == [1, 3, 4, 2, 5, 0]


def test_choice_zero_keeps_the_seed_and_the_others_derive_theirs_again():
    assert choice_seed(41, 0) == 41
    seeds = [choice_seed(41, index) for index in range(1, 6)]
    assert seeds == [choice_seed(41, index) for index in range(1, 6)]  # reproducible
    assert len(set(seeds) | {41}) == 6 and all(0 <= seed < 2**64 for seed in seeds)
    assert choice_seed(42, 1) != choice_seed(41, 1)


def test_the_config_validates_logprobs_and_prompt_logprobs():
    assert GenerationConfig().logprobs is None and not GenerationConfig().prompt_logprobs
    assert GenerationConfig(logprobs=20, prompt_logprobs=True).logprobs == 20
    with pytest.raises(ValueError, match="logprobs"):
        GenerationConfig(logprobs=21)
    with pytest.raises(ValueError, match="logprobs"):
        GenerationConfig(logprobs=-1)
    with pytest.raises(TypeError, match="logprobs"):
        GenerationConfig(logprobs=True)
    with pytest.raises(ValueError, match="prompt_logprobs needs logprobs"):
        GenerationConfig(prompt_logprobs=True)
    with pytest.raises(TypeError, match="prompt_logprobs"):
        GenerationConfig(logprobs=0, prompt_logprobs=1)


# ---- generation -------------------------------------------------------------------------------

BIGRAM_VOCABULARY = 128
ON = 1.0 - math.log(math.e + BIGRAM_VOCABULARY - 1)  # the bigram's favourite id
OFF = -math.log(math.e + BIGRAM_VOCABULARY - 1)  # any other id


def test_each_generated_token_gets_the_raw_log_softmax_of_its_row():
    model = BigramModel(chain(97, 98, 99, 100, 101, 102), BIGRAM_VOCABULARY, 32)
    generator = TextGenerator(FullForwardEngine(model), ascii_tokenizer())
    # greedy with a repetition penalty, and sampling at another temperature: the
    # log-probabilities are the model's own, before either
    for fields in ({"repetition_penalty": 3.0},
                   {"temperature": 0.3, "seed": 5, "top_k": 3, "presence_penalty": 1.0}):
        events = []
        result = generator.generate("a", max_new_tokens=4, logprobs=2, on_token=events.append,
                                    **fields)
        assert len(result.logprobs) == len(result.generated_token_ids) == 4
        assert [event.logprob for event in events] == list(result.logprobs)
        previous = (97, *result.generated_token_ids)
        for scored, token, before in zip(result.logprobs, result.generated_token_ids,
                                         previous, strict=False):
            favourite = model.table.get(before, 0)
            assert scored.token_id == token
            assert scored.logprob == pytest.approx(ON if token == favourite else OFF)
            assert scored.top[0] == (favourite, pytest.approx(ON))
            assert scored.top[1] == (0 if favourite else 1, pytest.approx(OFF))
        assert result.prompt_logprobs is None and events[0].prompt_logprobs is None
    plain = generator.generate("a", max_new_tokens=3)
    assert plain.logprobs is None and plain.prompt_logprobs is None
    assert plain.generated_text == "bcd"


@pytest.fixture
def schedulers():
    yield from scheduler_factory({token: (token + 1) % 128 for token in range(128)}, 32, TIMEOUT)


def test_prompt_logprobs_feed_the_prompt_one_token_per_step(schedulers):
    scheduler, engine = schedulers(prefill_chunk_tokens=64)
    events = []
    handle = scheduler.submit([10, 11, 30, 31], GenerationConfig(
        max_new_tokens=2, logprobs=1, prompt_logprobs=True), on_event=events.append)
    result = handle.result(TIMEOUT)
    assert [len(rows[0][1]) for rows in engine.steps] == [1, 1, 1, 1, 1]
    scores = result.prompt_logprobs
    assert scores[0] is None and [score.token_id for score in scores[1:]] == [11, 30, 31]
    # the bigram favours the successor: 11 after 10 is it, 30 after 11 and 31 after 30 not...
    assert [score.logprob for score in scores[1:]] == pytest.approx([ON, OFF, ON])
    assert all(score.top[0][0] == before + 1 for score, before in zip(scores[1:], [10, 11, 30],
                                                                      strict=True))
    assert events[0].prompt_logprobs == scores and events[1].prompt_logprobs is None
    assert result.generated_token_ids == (32, 33)
    assert [score.logprob for score in result.logprobs] == pytest.approx([ON, ON])


def test_prompt_logprobs_without_new_tokens_score_the_prompt_and_sample_nothing(schedulers):
    scheduler, engine = schedulers()
    scored = scheduler.submit([40, 41, 50], GenerationConfig(
        max_new_tokens=0, logprobs=0, prompt_logprobs=True)).result(TIMEOUT)
    assert [rows[0][1] for rows in engine.steps] == [[40], [41]]  # the last one predicts nothing
    assert scored.generated_token_ids == () and scored.finish_reason == "length"
    assert scored.prompt_logprobs[0] is None
    assert [score.logprob for score in scored.prompt_logprobs[1:]] == pytest.approx([ON, OFF])
    assert scored.logprobs == ()
    single = scheduler.submit([40], GenerationConfig(
        max_new_tokens=0, logprobs=0, prompt_logprobs=True)).result(TIMEOUT)
    assert single.prompt_logprobs == (None,) and len(engine.steps) == 2  # nothing to run


def test_prompt_logprobs_need_the_whole_prompt_in_the_context(schedulers):
    scheduler, _ = schedulers(maximum_context=4)
    with pytest.raises(ValueError, match="prompt_logprobs needs the whole prompt"):
        scheduler.submit([1, 2, 3, 4, 5], GenerationConfig(max_new_tokens=1, logprobs=0,
                                                           prompt_logprobs=True))
    generated = scheduler.submit([1, 2, 3, 4, 5], GenerationConfig(max_new_tokens=1))
    assert generated.result(TIMEOUT).generated_token_ids == (6,)


# ---- scheduler groups -------------------------------------------------------------------------


def test_a_group_is_admitted_together_and_batched_in_every_step(schedulers):
    scheduler, engine = schedulers()
    configs = [GenerationConfig(max_new_tokens=3, temperature=1.0, seed=choice_seed(9, index))
               for index in range(3)]
    handles = scheduler.submit_group([20, 21], configs)
    results = [handle.result(TIMEOUT) for handle in handles]
    assert all(result.prompt_token_ids == (20, 21) for result in results)
    assert [len(rows) for rows in engine.steps] == [3, 3, 3]  # prompts, then two decodes
    assert engine.capacity().open_stream_count == 0
    with pytest.raises(ValueError, match="at least one config"):
        scheduler.submit_group([20], [])
    with pytest.raises(ValueError, match="callbacks"):
        scheduler.submit_group([20], configs, on_event=[None])


def test_a_group_waits_until_every_member_fits_and_nothing_overtakes_it(schedulers):
    # blocks of 4 tokens, 5 of them: a budget of 5 tokens takes 2 blocks
    scheduler, engine = schedulers(engine_options={"block_size": 4, "block_count": 5})
    engine.gate.clear()
    running = scheduler.submit([10, 11], GenerationConfig(max_new_tokens=4))  # 2 blocks
    assert engine.entered.wait(TIMEOUT)
    group = scheduler.submit_group([30, 31], [GenerationConfig(max_new_tokens=4)] * 2)
    later = scheduler.submit([60], GenerationConfig(max_new_tokens=1))  # 1 block: fits now
    assert scheduler.stats().waiting_count == 3
    engine.gate.set()
    results = [handle.result(TIMEOUT) for handle in (running, *group, later)]
    assert all(result.finish_reason == "length" for result in results)
    numbers = {}
    for rows in engine.steps:
        for number, _ in rows:
            numbers.setdefault(number, len(numbers))
    first = {number: next(index for index, rows in enumerate(engine.steps)
                          if any(row[0] == number for row in rows)) for number in numbers}
    running_number, *group_numbers, later_number = sorted(first, key=first.get)
    assert first[group_numbers[0]] == first[group_numbers[1]]  # admitted in one pass
    assert first[group_numbers[0]] > max(index for index, rows in enumerate(engine.steps)
                                         if any(row[0] == running_number for row in rows))
    assert first[later_number] >= first[group_numbers[0]]  # it did not overtake the group


def test_a_group_that_can_never_run_at_once_is_rejected_naming_n(schedulers):
    scheduler, engine = schedulers(engine_options={"block_size": 4, "block_count": 3},
                                   max_active_requests=4)
    with pytest.raises(RequestRejectedError, match=r"n=2 choices can never run at once.*"
                                                   r"4 blocks.*pool of 3") as rejected:
        scheduler.submit_group([1, 2], [GenerationConfig(max_new_tokens=4)] * 2)
    assert rejected.value.param == "n"
    with pytest.raises(RequestRejectedError, match=r"n=5 .*max_active_requests") as rejected:
        scheduler.submit_group([1], [GenerationConfig(max_new_tokens=1)] * 5)
    assert rejected.value.param == "n"
    with pytest.raises(RequestRejectedError) as alone:  # one member alone: the old message
        scheduler.submit_group([1] * 12, [GenerationConfig(max_new_tokens=4)])
    assert alone.value.param is None and "never fit" in str(alone.value)
    assert scheduler.stats().waiting_count == 0 and not engine.steps
    fits = scheduler.submit_group([1, 2], [GenerationConfig(max_new_tokens=1)] * 3)
    assert [handle.result(TIMEOUT).generated_token_ids for handle in fits] == [(3,)] * 3


def test_a_group_is_queued_whole_or_not_at_all(schedulers):
    scheduler, engine = schedulers(max_active_requests=1, max_queued_requests=2)
    engine.gate.clear()
    scheduler.submit([10], GenerationConfig(max_new_tokens=2))
    assert engine.entered.wait(TIMEOUT)
    scheduler.submit([20], GenerationConfig(max_new_tokens=1))
    with pytest.raises(RequestRejectedError, match="max_active_requests"):
        scheduler.submit_group([30], [GenerationConfig(max_new_tokens=1)] * 2)
    scheduler.close(timeout=TIMEOUT)
    engine.gate.set()
    scheduler, engine = schedulers(max_active_requests=2, max_queued_requests=2)
    engine.gate.clear()
    scheduler.submit([10], GenerationConfig(max_new_tokens=2))
    assert engine.entered.wait(TIMEOUT)
    scheduler.submit([20], GenerationConfig(max_new_tokens=1))
    with pytest.raises(QueueFullError, match="2 more do not fit"):
        scheduler.submit_group([30], [GenerationConfig(max_new_tokens=1)] * 2)
    assert scheduler.stats().waiting_count == 1
    engine.gate.set()


def test_cancelling_the_members_of_a_group_frees_every_stream(schedulers):
    scheduler, engine = schedulers(engine_options={"step_delay": 0.005})
    handles = scheduler.submit_group([5], [GenerationConfig(max_new_tokens=25)] * 3)
    assert wait_until(lambda: scheduler.stats().active_count == 3, TIMEOUT)
    for handle in handles:
        handle.cancel()
    assert wait_until(lambda: scheduler.stats().cancelled_count == 3, TIMEOUT)
    assert wait_until(lambda: engine.capacity().open_stream_count == 0, TIMEOUT)


def test_done_callbacks_run_once_after_the_events(schedulers):
    scheduler, _ = schedulers()
    seen = []
    handle = scheduler.submit([65], GenerationConfig(max_new_tokens=3),
                              on_event=lambda event: seen.append(event.index))
    handle.add_done_callback(lambda done: seen.append(("done", done.result().generated_text)))
    handle.result(TIMEOUT)
    assert wait_until(lambda: len(seen) == 4, TIMEOUT)
    assert seen == [0, 1, 2, ("done", "BCD")]
    late = []
    handle.add_done_callback(late.append)  # already done: at once
    handle.add_done_callback(lambda _: 1 / 0)  # what a callback raises is ignored
    assert late == [handle]
    empty = scheduler.submit([65], GenerationConfig(max_new_tokens=0))
    empty.add_done_callback(late.append)
    assert late == [handle, empty]


# ---- over HTTP --------------------------------------------------------------------------------


def call(served, path: str, body: dict) -> tuple[int, dict | list]:
    """POST ``body``; the status and the JSON body, or the streamed chunks' list."""
    connection = http.client.HTTPConnection(served.host, served.port, timeout=TIMEOUT)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read().decode("utf-8")
    finally:
        connection.close()
    if not body.get("stream") or response.status != 200:
        return response.status, json.loads(data)
    chunks = [block[len("data: "):] for block in data.split("\n\n") if block.strip()]
    assert chunks[-1] == "[DONE]"
    return response.status, [json.loads(chunk) for chunk in chunks[:-1]]


def serve(model_or_engine, tokenizer, **config) -> SimpleNamespace:
    options = {"port": 0, "model_name": MODEL_NAME, "maximum_new_tokens": 16,
               "request_timeout_seconds": 5.0, **config}
    return start_server(ModelService(model_or_engine, tokenizer, ServingConfig(**options)))


stop = stop_server


@pytest.fixture(scope="module")
def served():
    """A tiny real model (context 64) behind the whole stack, and the means to check it."""
    tokenizer = Tokenizer(CORPUS)
    model = DecoderOnlyTransformer(dataclasses.replace(
        TINY_CONFIG, vocabulary_size=tokenizer.vocab_size, maximum_context=64))
    running = serve(model, tokenizer)
    running.model, running.tokenizer = model, tokenizer
    yield running
    stop(running)
    model.close()
    tokenizer.close()


def chat_ids(served, messages) -> list[int]:
    prompt = chat_prompt(PlainChatTemplate(), served.tokenizer, messages)
    if isinstance(prompt, str):
        return list(served.tokenizer.encode_bytes(prompt.encode("utf-8")))
    return list(prompt)


def token_id(served, data: bytes) -> int:
    ids = list(served.tokenizer.encode_bytes(data))
    assert len(ids) == 1, (data, ids)
    return ids[0]


def assert_chat_logprobs_match_the_oracle(served, prompt_ids, choice, top_count):
    """``choice``'s logprobs.content against the log-softmax of one full forward over the
    prompt and the generated tokens."""
    pytest.importorskip("numpy")
    content = choice["logprobs"]["content"]
    generated = [token_id(served, bytes(entry["bytes"])) for entry in content]
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    oracle = full_forward_log_softmax(served.model, prompt_ids + generated)
    for position, (entry, token) in enumerate(zip(content, generated, strict=True)):
        row = oracle[len(prompt_ids) - 1 + position]
        assert entry["token"] == bytes(entry["bytes"]).decode("utf-8")
        assert abs(entry["logprob"] - row[token]) <= TOLERANCE
        assert len(entry["top_logprobs"]) == top_count
        expected = sorted(range(len(row)), key=lambda t: -row[t])[:top_count]
        ids = [token_id(served, bytes(top["bytes"])) for top in entry["top_logprobs"]]
        assert ids == expected
        for top, alternative in zip(entry["top_logprobs"], ids, strict=True):
            assert abs(top["logprob"] - row[alternative]) <= TOLERANCE
    return generated


def test_n_choices_have_their_indexes_and_the_seed_reproduces_them(served):
    body = {"prompt": "hello", "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 123}
    status, first = call(served, "/v1/completions", body)
    assert status == 200
    assert [choice["index"] for choice in first["choices"]] == [0, 1, 2]
    texts = [choice["text"] for choice in first["choices"]]
    assert len(set(texts)) == 3  # three seeds, three samples
    assert call(served, "/v1/completions", body)[1]["choices"] == first["choices"]
    assert first["usage"] == {"prompt_tokens": 5, "completion_tokens": 24, "total_tokens": 29}
    alone = call(served, "/v1/completions", {**body, "n": 1})[1]  # choice 0 keeps the seed
    assert alone["choices"][0]["text"] == texts[0]
    messages = [{"role": "user", "content": "say hi"}]
    chat = {"messages": messages, "max_tokens": 6, "n": 2, "seed": 8}
    status, answer = call(served, "/v1/chat/completions", chat)
    assert status == 200 and [choice["index"] for choice in answer["choices"]] == [0, 1]
    assert call(served, "/v1/chat/completions", chat)[1]["choices"] == answer["choices"]
    assert answer["usage"]["prompt_tokens"] == len(chat_ids(served, messages))
    greedy = call(served, "/v1/chat/completions", {**chat, "temperature": 0, "n": 4})[1]
    contents = {choice["message"]["content"] for choice in greedy["choices"]}
    assert len(greedy["choices"]) == 4 and len(contents) == 1  # greedy choices are alike
    assert served.service.engine.capacity().open_stream_count == 0


def test_chat_logprobs_equal_a_log_softmax_of_the_full_forward(served):
    messages = [{"role": "user", "content": "tell me"}]
    body = {"messages": messages, "max_tokens": 8, "seed": 3, "logprobs": True,
            "top_logprobs": 5, "n": 2}
    status, answer = call(served, "/v1/chat/completions", body)
    assert status == 200
    for choice in answer["choices"]:
        assert_chat_logprobs_match_the_oracle(served, chat_ids(served, messages), choice, 5)
    bare = call(served, "/v1/chat/completions", {**body, "top_logprobs": None, "n": 1})[1]
    assert bare["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    assert bare["choices"][0]["logprobs"]["refusal"] is None
    assert bare["choices"][0]["message"] == answer["choices"][0]["message"]
    off = call(served, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert [choice["logprobs"] for choice in off[1]["choices"]] == [None, None]


def test_completion_logprobs_and_echo_equal_a_log_softmax_of_the_full_forward(served):
    numpy = pytest.importorskip("numpy")
    prompt = "a quick fox"
    prompt_ids = list(served.tokenizer.encode_bytes(prompt.encode()))
    body = {"prompt": prompt, "max_tokens": 6, "seed": 21, "logprobs": 3, "echo": True}
    status, answer = call(served, "/v1/completions", body)
    assert status == 200
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(prompt) and "".join(logprobs["tokens"]) == choice["text"]
    ids = [token_id(served, text.encode()) for text in logprobs["tokens"]]
    assert ids[: len(prompt_ids)] == prompt_ids
    oracle = full_forward_log_softmax(served.model, ids)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, len(ids)):
        row = oracle[position - 1]
        assert abs(logprobs["token_logprobs"][position] - row[ids[position]]) <= TOLERANCE
        top = logprobs["top_logprobs"][position]
        expected = {served.tokenizer.decode_bytes([t]).decode(): row[t]
                    for t in numpy.argsort(-row)[:3]}
        expected.setdefault(logprobs["tokens"][position], row[ids[position]])
        assert set(top) == set(expected)
        assert all(abs(top[text] - value) <= TOLERANCE for text, value in expected.items())
    assert logprobs["text_offset"] == list(range(len(ids)))  # one character per token
    plain = call(served, "/v1/completions", {**body, "echo": False})[1]["choices"][0]
    assert choice["text"] == prompt + plain["text"]
    assert plain["logprobs"]["tokens"] == logprobs["tokens"][len(prompt_ids):]
    assert plain["logprobs"]["text_offset"] == list(range(len(plain["text"])))
    assert numpy.allclose(plain["logprobs"]["token_logprobs"],
                          logprobs["token_logprobs"][len(prompt_ids):], atol=1e-6)
    echoed = call(served, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 2,
                                              "temperature": 0})[1]
    assert echoed["choices"][0]["logprobs"] is None
    assert echoed["choices"][0]["text"].startswith(prompt)
    scored = call(served, "/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 0,
                                              "logprobs": 0})[1]
    assert scored["choices"][0]["text"] == prompt
    assert scored["usage"]["completion_tokens"] == 0
    assert numpy.allclose(scored["choices"][0]["logprobs"]["token_logprobs"][1:],
                          logprobs["token_logprobs"][1:len(prompt_ids)], atol=1e-5)


def streamed_choices(chunks, chat: bool) -> dict:
    """A streamed answer reassembled per choice: text, logprobs entries, finish."""
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            state = choices.setdefault(choice["index"], {"text": "", "logprobs": [],
                                                         "finish": None, "chunks": 0})
            state["chunks"] += 1
            state["text"] += (choice["delta"].get("content") or "") if chat else choice["text"]
            if choice["logprobs"] is not None:
                state["logprobs"].append(choice["logprobs"])
            state["finish"] = choice["finish_reason"] or state["finish"]
    return choices


def test_streamed_choices_and_logprobs_agree_with_the_whole_answer(served):
    messages = [{"role": "user", "content": "what now"}]
    chat = {"messages": messages, "max_tokens": 7, "seed": 77, "n": 2, "logprobs": True,
            "top_logprobs": 4, "temperature": 0.9}
    whole = call(served, "/v1/chat/completions", chat)[1]
    status, chunks = call(served, "/v1/chat/completions",
                          {**chat, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and chunks[-1]["usage"] == whole["usage"]
    streamed = streamed_choices(chunks[:-1], chat=True)
    assert sorted(streamed) == [0, 1]
    for choice in whole["choices"]:
        state = streamed[choice["index"]]
        assert state["text"] == choice["message"]["content"]
        assert state["finish"] == choice["finish_reason"]
        content = [entry for part in state["logprobs"] for entry in part["content"]]
        assert [entry["token"] for entry in content] == [
            entry["token"] for entry in choice["logprobs"]["content"]]
        for mine, theirs in zip(content, choice["logprobs"]["content"], strict=True):
            assert abs(mine["logprob"] - theirs["logprob"]) <= 1e-6
            assert [top["token"] for top in mine["top_logprobs"]] == [
                top["token"] for top in theirs["top_logprobs"]]
    completion = {"prompt": "the end", "max_tokens": 5, "seed": 5, "n": 2, "logprobs": 2,
                  "echo": True}
    whole = call(served, "/v1/completions", completion)[1]
    streamed = streamed_choices(call(served, "/v1/completions",
                                     {**completion, "stream": True})[1], chat=False)
    for choice in whole["choices"]:
        state = streamed[choice["index"]]
        assert state["text"] == choice["text"] and state["finish"] == choice["finish_reason"]
        joined = {key: [value for part in state["logprobs"] for value in part[key]]
                  for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        assert joined["tokens"] == choice["logprobs"]["tokens"]
        assert joined["text_offset"] == choice["logprobs"]["text_offset"]
        for mine, theirs in zip(joined["token_logprobs"], choice["logprobs"]["token_logprobs"],
                                strict=True):
            assert (mine is None and theirs is None) or abs(mine - theirs) <= 1e-6
        assert [None if top is None else sorted(top) for top in joined["top_logprobs"]] == [
            None if top is None else sorted(top) for top in choice["logprobs"]["top_logprobs"]]
    # echo without events (max_tokens 0): the prompt still comes, then the finish
    streamed = streamed_choices(call(served, "/v1/completions", {
        "prompt": "abc", "max_tokens": 0, "echo": True, "stream": True, "n": 2})[1], chat=False)
    assert {index: (state["text"], state["finish"]) for index, state in streamed.items()} == {
        0: ("abc", "length"), 1: ("abc", "length")}


def test_the_end_token_is_neither_text_nor_a_listed_logprob():
    tokenizer = PieceTokenizer([bytes([value]) for value in range(128)])
    tokenizer.eos_id = 4
    engine = FullForwardEngine(BigramModel(chain(97, 98, 99, 4), BIGRAM_VOCABULARY, 32))
    running = serve(engine, tokenizer)
    try:
        body = {"prompt": "a", "max_tokens": 8, "temperature": 0, "logprobs": 1}
        choice = call(running, "/v1/completions", body)[1]["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == ("bc", "stop")
        assert choice["logprobs"]["tokens"] == ["b", "c"]
        assert choice["logprobs"]["token_logprobs"] == pytest.approx([ON, ON])
        streamed = streamed_choices(call(running, "/v1/completions", {**body, "stream": True})[1],
                                    chat=False)[0]
        assert [token for part in streamed["logprobs"] for token in part["tokens"]] == ["b", "c"]
        chat = call(running, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "a"}], "max_tokens": 8, "temperature": 0,
            "logprobs": True})[1]["choices"][0]
        assert len(chat["logprobs"]["content"]) == len(chat["message"]["content"])
    finally:
        stop(running)


CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/completions", {"prompt": "ab", "n": 0}, "n", ["at least 1", "0"]),
        ("/v1/completions", {"prompt": "ab", "n": 9}, "n", ["at most 8", "9"]),
        ("/v1/completions", {"prompt": "ab", "n": "2"}, "n", ["integer", "'2'"]),
        ("/v1/completions", {"prompt": "ab", "n": True}, "n", ["integer"]),
        ("/v1/chat/completions", {"messages": CHAT, "n": 9}, "n", ["at most 8", "9"]),
        ("/v1/chat/completions", {"messages": CHAT, "n": 1.5}, "n", ["integer"]),
        ("/v1/completions", {"prompt": "ab", "logprobs": 6}, "logprobs", ["at most 5", "6"]),
        ("/v1/completions", {"prompt": "ab", "logprobs": -1}, "logprobs", ["at least 0"]),
        ("/v1/completions", {"prompt": "ab", "logprobs": True}, "logprobs", ["integer"]),
        ("/v1/completions", {"prompt": "ab", "echo": 1}, "echo", ["true or false"]),
        ("/v1/completions", {"prompt": "ab", "n": 2, "best_of": 3}, "best_of",
         ["best_of=3", "n = 2"]),
        ("/v1/completions", {"prompt": "ab", "best_of": True}, "best_of", ["best_of=True"]),
        ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs",
         ["top_logprobs=2", "logprobs: true"]),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": False, "top_logprobs": 0},
         "top_logprobs", ["logprobs: true"]),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
         "top_logprobs", ["at most 20", "21"]),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": -1},
         "top_logprobs", ["at least 0"]),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": 1}, "logprobs",
         ["true or false"]),
    ],
)
def test_bad_choice_and_logprob_fields_are_400s_naming_the_field_and_value(served, path, body,
                                                                           param, words):
    status, answer = call(served, path, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == param and error["code"] in ("invalid_value", "unsupported_value")
    for word in words:
        assert word in error["message"], error["message"]


def test_best_of_equal_to_n_changes_nothing(served):
    body = {"prompt": "ab", "max_tokens": 3, "seed": 4, "n": 2}
    assert (call(served, "/v1/completions", {**body, "best_of": 2})[1]["choices"]
            == call(served, "/v1/completions", body)[1]["choices"])


def test_echo_with_logprobs_needs_the_prompt_in_the_context():
    tokenizer = Tokenizer(CORPUS)
    model = DecoderOnlyTransformer(dataclasses.replace(TINY_CONFIG,
                                                       vocabulary_size=tokenizer.vocab_size))
    running = serve(model, tokenizer)  # context 8; maximum_new_tokens lets prompts roll over
    try:
        status, answer = call(running, "/v1/completions", {
            "prompt": "abcdefghij", "echo": True, "logprobs": 1, "max_tokens": 2})
        assert status == 400 and answer["error"]["param"] == "echo"
        assert "context of 8 tokens" in answer["error"]["message"]
        assert "has 10" in answer["error"]["message"]
        status, answer = call(running, "/v1/completions", {
            "prompt": "abcdefghij", "echo": True, "max_tokens": 2})
        assert status == 200 and answer["choices"][0]["text"].startswith("abcdefghij")
    finally:
        stop(running)
        model.close()
        tokenizer.close()


def test_choices_whose_pages_can_never_fit_together_are_a_400_naming_n():
    model = BigramModel({token: (token + 1) % 128 for token in range(128)}, 128, 32)
    engine = FullForwardEngine(model, block_size=4, block_count=3)
    running = serve(engine, ascii_tokenizer())
    try:
        body = {"prompt": "ab", "max_tokens": 4, "temperature": 0}
        assert call(running, "/v1/completions", body)[0] == 200  # one: 2 of 3 blocks
        status, answer = call(running, "/v1/completions", {**body, "n": 2})
        assert status == 400 and answer["error"]["param"] == "n"
        assert answer["error"]["code"] == "request_too_large"
        assert "n=2" in answer["error"]["message"]
        assert call(running, "/v1/completions", {**body, "max_tokens": 1, "n": 3})[0] == 200
    finally:
        stop(running)


def test_a_client_that_leaves_a_streamed_n_request_cancels_every_choice():
    engine = RecordingEngine(BigramModel({t: (t + 1) % 128 for t in range(32, 128)}, 128, 64),
                             step_delay=0.01)
    running = serve(engine, ascii_tokenizer(), maximum_new_tokens=2000)
    try:
        body = json.dumps({"prompt": "a", "max_tokens": 1500, "n": 3, "stream": True,
                           "temperature": 0}).encode()
        connection = socket.create_connection((running.host, running.port), timeout=TIMEOUT)
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while received.count(b"data: ") < 4:
            received += connection.recv(4096)
        connection.close()
        scheduler = running.service.scheduler
        assert wait_until(lambda: scheduler.stats().cancelled_count == 3, TIMEOUT)
        assert wait_until(lambda: engine.capacity().open_stream_count == 0, TIMEOUT)
        assert len(engine.steps) < 1000
    finally:
        stop(running)


def test_concurrent_n_requests_each_get_their_own_choices(served):
    bodies = [{"prompt": prompt, "max_tokens": 5, "n": 2, "seed": index, "logprobs": 1}
              for index, prompt in enumerate(["a", "bc", "def", "ghij"])]
    expected = [call(served, "/v1/completions", body)[1]["choices"] for body in bodies]
    answers = [None] * len(bodies)

    def client(index: int) -> None:
        answers[index] = call(served, "/v1/completions", bodies[index])[1]["choices"]

    threads = [threading.Thread(target=client, args=(index,)) for index in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    for mine, theirs in zip(answers, expected, strict=True):
        assert [choice["text"] for choice in mine] == [choice["text"] for choice in theirs]
        for a, b in zip(mine, theirs, strict=True):  # batched differently: float rounding
            assert a["logprobs"]["token_logprobs"] == pytest.approx(
                b["logprobs"]["token_logprobs"], abs=1e-5)
