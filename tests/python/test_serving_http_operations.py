"""Issue 32's HTTP-layer gaps, over loopback sockets: end tokens on both OpenAI routes,
``max_tokens`` against the context, persistent connections, the request log line,
``/metrics``, the API key, and the presence/frequency penalties, ``min_p`` and ``seed``
(hand-computed in test_serving_sampling-style unit checks and through the routes)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import re
import socket

import pytest
from serving_fakes import BigramModel, PieceTokenizer, RecordingEngine, wait_until

from riftco_transformer.serving import GenerationConfig, ModelService, ServingConfig, make_server
from riftco_transformer.serving.chat_templates import PretrainedChatTemplate
from riftco_transformer.serving.sampling import Greedy, TemperatureSampler, apply_penalties

TIMEOUT = 10.0
MODEL_NAME = "riftco-ops"
IM_START, IM_END, EOS = 128, 129, 130


class ControlTokenizer(PieceTokenizer):
    """ASCII (ids 0-127), then ``<|im_start|>``, ``<|im_end|>`` and the end token ``</s>``
    as control tokens."""

    def __init__(self) -> None:
        super().__init__([bytes([value]) for value in range(128)]
                         + [b"<|im_start|>", b"<|im_end|>", b"</s>"])
        self.eos_id = EOS

    def control_tokens(self) -> dict[str, int]:
        return {"<|im_start|>": IM_START, "<|im_end|>": IM_END, "</s>": EOS}


@contextlib.contextmanager
def running(table: dict[int, int], **fields):
    """A chatml server over a scripted bigram engine (context 64) with ``fields`` set."""
    engine = RecordingEngine(BigramModel(table, 131, 64))
    fields.setdefault("maximum_new_tokens", None)
    config = ServingConfig(port=0, model_name=MODEL_NAME, request_timeout_seconds=2.0,
                           **fields)
    service = ModelService(engine, ControlTokenizer(), config,
                           chat_template=PretrainedChatTemplate.for_family(
                               "chatml", eos_token="</s>"))
    server = make_server(service)
    thread = server.serve_in_thread()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)
        service.close()


def call(server, method: str, path: str, body=None, headers=None, connection=None):
    """(status, headers, body bytes); over ``connection`` when given (left open)."""
    own = connection is None
    if own:
        host, port = server.server_address[:2]
        connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        headers = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        if own:
            connection.close()


def error_of(answer, status: int) -> dict:
    code, headers, body = answer
    assert code == status, body
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ---- 1. end tokens ------------------------------------------------------------------------

CD_THEN_END = {98: 99, 99: 100, 100: IM_END, 10: 99, 120: 121, 121: EOS}


def test_completions_and_chat_stop_at_the_end_tokens_without_their_text():
    with running(CD_THEN_END) as server:
        for prompt, text in (("ab", "cd"), ("x", "y")):  # <|im_end|>, then the tokenizer's </s>
            status, _, body = call(server, "POST", "/v1/completions",
                                   {"prompt": prompt, "max_tokens": 10, "temperature": 0})
            choice = json.loads(body)["choices"][0]
            assert (status, choice["text"], choice["finish_reason"]) == (200, text, "stop")
            assert json.loads(body)["usage"]["completion_tokens"] == len(text) + 1
        status, _, body = call(server, "POST", "/v1/completions", {
            "prompt": "ab", "max_tokens": 10, "temperature": 0, "stream": True})
        events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
        chunks = [json.loads(data) for data in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == "cd"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        status, _, body = call(server, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
            "temperature": 0})
        choice = json.loads(body)["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == ("cd", "stop")


# ---- 2. max_tokens -------------------------------------------------------------------------


def test_max_tokens_defaults_to_the_rest_of_the_context_and_more_is_a_400():
    with running({}) as server:  # every token continues with id 0: never an end
        status, _, body = call(server, "POST", "/v1/completions",
                               {"prompt": "ab", "temperature": 0})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 62
        error = error_of(call(server, "POST", "/v1/completions",
                              {"prompt": "ab", "max_tokens": 63}), 400)
        assert error["param"] == "max_tokens"
        assert "max_tokens" in error["message"] and "63" in error["message"]
        assert "62" in error["message"] and "max_new_tokens" not in error["message"]
        chat = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
        status, _, body = call(server, "POST", "/v1/chat/completions", chat)
        usage = json.loads(body)["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 64
        error = error_of(call(server, "POST", "/v1/chat/completions",
                              {**chat, "max_tokens": 60}), 400)
        assert error["param"] == "max_tokens" and "60" in error["message"]
        error = error_of(call(server, "POST", "/v1/completions",
                              {"prompt": "a" * 64}), 400)
        assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"


def test_a_server_limit_on_new_tokens_is_named_without_internal_parameters():
    with running({}, maximum_new_tokens=5) as server:
        status, _, body = call(server, "POST", "/v1/completions",
                               {"prompt": "ab", "temperature": 0})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 5
        error = error_of(call(server, "POST", "/v1/completions",
                              {"prompt": "ab", "max_tokens": 6}), 400)
        assert error["param"] == "max_tokens" and "6" in error["message"]
        assert "5" in error["message"] and "max_new_tokens" not in error["message"]


# ---- 3. keep-alive -------------------------------------------------------------------------


def test_requests_share_one_persistent_connection_until_the_client_closes_it():
    with running(CD_THEN_END) as server:
        host, port = server.server_address[:2]
        connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        try:
            first = call(server, "GET", "/v1/models", connection=connection)
            sock = connection.sock
            second = call(server, "POST", "/v1/completions",
                          {"prompt": "ab", "max_tokens": 4, "temperature": 0},
                          connection=connection)
            assert connection.sock is sock  # http.client reconnects when the server closes
            assert first[0] == second[0] == 200
            for _, headers, body in (first, second):
                assert headers["connection"] == "keep-alive"
                assert headers["content-length"] == str(len(body))
            assert server.open_connections == 1
            third = call(server, "GET", "/health", headers={"Connection": "close"},
                         connection=connection)
            assert third[0] == 200 and third[1]["connection"] == "close"
            assert connection.sock is None  # http.client closes on the server's word
            assert wait_until(lambda: server.open_connections == 0)  # and so did the server
        finally:
            connection.close()


def test_two_raw_requests_on_one_socket_get_two_answers():
    with running(CD_THEN_END) as server, socket.create_connection(
            server.server_address[:2], timeout=TIMEOUT) as connection:
        request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
        connection.sendall(request + request[:-2] + b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2
        assert b"Connection: keep-alive" in answer and b"Connection: close" in answer


# ---- 4. the log line -----------------------------------------------------------------------


def test_each_request_is_one_log_line_with_status_duration_and_tokens(caplog):
    caplog.set_level(logging.INFO, logger="riftco_transformer.serving.http")
    with running(CD_THEN_END) as server:
        call(server, "POST", "/v1/completions", {"prompt": "ab", "max_tokens": 10,
                                                 "temperature": 0})
        call(server, "GET", "/nowhere")
    lines = [record.getMessage() for record in caplog.records
             if record.name == "riftco_transformer.serving.http"]
    completions = [line for line in lines if "/v1/completions" in line]
    assert len(completions) == 1, lines
    assert re.search(r"POST /v1/completions 200 \d+\.\dms prompt_tokens=2 "
                     r"completion_tokens=3$", completions[0])
    assert [line for line in lines if re.search(r"GET /nowhere 404 \d+\.\dms$", line)]


# ---- 5. /metrics ---------------------------------------------------------------------------


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_metrics_are_prometheus_text_and_count_requests_and_tokens():
    with running(CD_THEN_END) as server:
        status, headers, body = call(server, "GET", "/metrics")
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        before = body.decode()
        for name, kind in (("riftco_http_requests_total", "counter"),
                           ("riftco_prompt_tokens_total", "counter"),
                           ("riftco_completion_tokens_total", "counter"),
                           ("riftco_http_request_duration_seconds", "histogram"),
                           ("riftco_http_requests_in_flight", "gauge")):
            assert f"# HELP {name} " in before and f"# TYPE {name} {kind}\n" in before
        assert metric(before, "riftco_http_requests_in_flight") == 1  # this one
        call(server, "POST", "/v1/completions", {"prompt": "ab", "max_tokens": 10,
                                                 "temperature": 0})
        error_of(call(server, "POST", "/v1/completions", {"prompt": 5}), 400)
        after = call(server, "GET", "/metrics")[2].decode()
        ok = 'riftco_http_requests_total{route="/v1/completions",method="POST",code="200"}'
        bad = 'riftco_http_requests_total{route="/v1/completions",method="POST",code="400"}'
        assert (metric(before, ok), metric(after, ok)) == (0, 1)
        assert metric(after, bad) == 1
        assert metric(after, "riftco_prompt_tokens_total") == 2
        assert metric(after, "riftco_completion_tokens_total") == 3
        count = "riftco_http_request_duration_seconds_count"
        assert metric(after, count) == metric(before, count) + 3
        assert metric(after, 'riftco_http_request_duration_seconds_bucket{le="+Inf"}') == (
            metric(after, count))
        for line in after.splitlines():  # every sample line: name{labels} value
            assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? \S+", line)
        # The engine's figures: steps, prefill sources, requests, and the KV pool by state.
        stats = server.service.scheduler.stats()
        capacity = server.service.engine.capacity()
        for name, kind in (("riftco_engine_steps_total", "counter"),
                           ("riftco_prefill_tokens_total", "counter"),
                           ("riftco_requests", "gauge")):
            assert f"# HELP {name} " in after and f"# TYPE {name} {kind}\n" in after
        final = call(server, "GET", "/metrics")[2].decode()
        assert metric(final, 'riftco_engine_steps_total{sampling="any"}') == stats.step_count > 0
        assert metric(final, 'riftco_prefill_tokens_total{source="computed"}') == (
            stats.prefill_token_count)
        assert metric(final, 'riftco_requests{state="running"}') == 0
        if capacity.block_count is not None:
            assert metric(final, 'riftco_kv_blocks{state="total"}') == capacity.block_count
            assert metric(final, 'riftco_kv_blocks{state="reserved"}') == 0


# ---- 6. the API key ------------------------------------------------------------------------


def test_an_api_key_guards_the_api_and_metrics_but_not_the_page_or_health():
    with running(CD_THEN_END, api_key="s3cret") as server:
        for path in ("/v1/models", "/metrics", "/v1/health"):
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": "Basic s3cret"}):
                error = error_of(call(server, "GET", path, headers=headers), 401)
                assert error["code"] == "invalid_api_key" and "s3cret" not in error["message"]
            assert call(server, "GET", path,
                        headers={"Authorization": "Bearer s3cret"})[0] == 200
        error_of(call(server, "POST", "/v1/completions", {"prompt": "ab"}), 401)
        status, _, body = call(server, "POST", "/v1/completions",
                               {"prompt": "ab", "max_tokens": 2, "temperature": 0},
                               headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and json.loads(body)["choices"][0]["text"] == "cd"
        assert call(server, "GET", "/health")[0] == 200
        assert call(server, "GET", "/")[0] == 200
    assert "s3cret" not in repr(ServingConfig(api_key="s3cret"))


def test_riftco_serve_takes_the_api_key_from_the_flag():
    from riftco_transformer.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "--bundle", "m.rift"]).api_key is None
    assert parser.parse_args(["serve", "--bundle", "m.rift", "--api-key", "k"]).api_key == "k"
    assert parser.parse_args(["serve", "--bundle", "m.rift"]).max_new_tokens is None


# ---- 7. penalties, min_p, seed -------------------------------------------------------------


def test_presence_and_frequency_penalties_count_only_the_generated_tokens():
    # generated ids (after a prompt of one id 0): 0, 0, 1 -> counts {0: 2, 1: 1}
    values = apply_penalties([2.0, 1.8, 0.0], (0, 0, 0, 1), presence_penalty=1.0,
                             frequency_penalty=0.5, prompt_length=1)
    assert values == pytest.approx([2.0 - (1.0 + 0.5 * 2), 1.8 - (1.0 + 0.5 * 1), 0.0])
    greedy = Greedy(presence_penalty=1.0, frequency_penalty=0.5)
    assert greedy.sample([2.0, 1.8, 0.0], (0, 0, 0, 1), prompt_length=1) == 1
    assert Greedy().sample([2.0, 1.8, 0.0], (0, 0, 0, 1)) == 0
    # a negative penalty favours repeating: 0.5 + 1.0 * 1 beats 1.2
    assert Greedy(frequency_penalty=-1.0).sample([0.5, 1.2], (1, 0), prompt_length=1) == 0


def test_min_p_keeps_ids_with_at_least_min_p_of_the_top_probability():
    logits = [0.0, math_log(0.6), math_log(0.4)]  # probabilities in the ratio 1 : 0.6 : 0.4
    u = random.Random(0).random()  # 0.844...: the draw of seed 0
    # without min_p: threshold u * 2.0 = 1.69 falls in id 2's share (1.6, 2.0]
    assert u * 2.0 > 1.6 and TemperatureSampler(1.0, seed=0).sample(logits) == 2
    # min_p 0.5 drops id 2 (0.4 < 0.5 * 1): threshold u * 1.6 = 1.35 falls in id 1's share
    assert 1.0 < u * 1.6 <= 1.6
    assert TemperatureSampler(1.0, seed=0, min_p=0.5).sample(logits) == 1
    assert TemperatureSampler(1.0, seed=0, min_p=0.6).sample(logits) == 1  # 0.6 >= 0.6
    assert {TemperatureSampler(1.0, seed=s, min_p=0.7).sample(logits) for s in range(20)} == {0}
    with pytest.raises(ValueError, match="min_p"):
        GenerationConfig(min_p=0.5)  # greedy decoding takes no min_p


def math_log(value: float) -> float:
    import math

    return math.log(value)


def test_the_routes_apply_penalties_and_min_p_and_validate_their_ranges():
    with running({99: 99}) as server:  # c continues with c
        body = {"prompt": "ac", "max_new_tokens": 3}
        plain = json.loads(call(server, "POST", "/v1/generate", body)[2])
        assert plain["generated_token_ids"] == [99, 99, 99]
        # c (1.0 - 1.5 = -0.5) loses to id 0 (0.0); then id 0 (1.0 - 1.5) and c (0.0 - 1.5)
        # lose to id 1 (0.0)
        penalised = json.loads(call(server, "POST", "/v1/generate",
                                    {**body, "presence_penalty": 1.5})[2])
        assert penalised["generated_token_ids"] == [99, 0, 1]
        status, _, answer = call(server, "POST", "/v1/completions", {
            "prompt": "ac", "max_tokens": 3, "temperature": 0, "frequency_penalty": 1.5})
        assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 3
        assert json.loads(answer)["choices"][0]["text"] == "c\x00\x01"
        status, _, answer = call(server, "POST", "/v1/completions", {
            "prompt": "ac", "max_tokens": 5, "temperature": 0.01, "min_p": 0.5, "seed": 3})
        assert json.loads(answer)["choices"][0]["text"] == "ccccc"  # only c is near the top
        for route, extra in (("/v1/completions", {"prompt": "ac"}),
                             ("/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}]}),
                             ("/v1/generate", {"prompt": "ac", "temperature": 1})):
            for field, value in (("presence_penalty", 2.5), ("frequency_penalty", -2.01),
                                 ("min_p", 1.5), ("min_p", -0.1), ("presence_penalty", "1")):
                error = error_of(call(server, "POST", route, {**extra, field: value}), 400)
                assert error["param"] == field and field in error["message"]


def test_the_same_seed_samples_the_same_completion():
    with running({}) as server:
        def text(seed: int, route: str = "/v1/completions") -> str:
            if route == "/v1/completions":
                body = {"prompt": "ab", "max_tokens": 12, "temperature": 1.0, "seed": seed}
            else:
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
                        "temperature": 1.0, "seed": seed}
            answer = json.loads(call(server, "POST", route, body)[2])
            choice = answer["choices"][0]
            return choice.get("text", choice.get("message", {}).get("content"))

        assert text(7) == text(7) and text(8) == text(8)
        assert text(7) != text(8)
        chat = "/v1/chat/completions"
        assert text(7, chat) == text(7, chat)
