"""The HTTP API, driven over loopback sockets: every route, server-sent events, every error
status with its JSON body, concurrent clients, and cancellation by disconnecting. Every
socket has a timeout, so a stuck server fails a test instead of hanging it."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import re
import select
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import TINY_CONFIG
from serving_fakes import (
    BigramModel,
    RecordingEngine,
    ascii_tokenizer,
    start_server,
    stop_server,
    wait_until,
)

from riftco_transformer import DecoderOnlyTransformer, Tokenizer
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    ModelService,
    PlainChatTemplate,
    ServingConfig,
    TextGenerator,
    native_decode_available,
)

TIMEOUT = 10.0
CHAT_CORPUS = "### User:\n### Assistant:\n### System:\nabcdefghijklmnopqrstuvwxyz .,!?'"
MODEL_NAME = "riftco-test"
SECURITY_HEADERS = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}


start = start_server
stop = stop_server


@pytest.fixture(scope="module")
def served():
    """A tiny real model behind the full stack (module-wide: one server for many tests)."""
    tokenizer = Tokenizer(CHAT_CORPUS)
    model = DecoderOnlyTransformer(
        dataclasses.replace(TINY_CONFIG, vocabulary_size=tokenizer.vocab_size))
    config = ServingConfig(port=0, model_name=MODEL_NAME, maximum_new_tokens=24,
                           maximum_request_bytes=4096, request_timeout_seconds=2.0)
    running = start(ModelService(model, tokenizer, config))
    running.reference = TextGenerator(FullForwardEngine(model), tokenizer)
    running.tokenizer = tokenizer
    yield running
    stop(running)
    model.close()
    tokenizer.close()


@pytest.fixture
def slow_served():
    """A scripted engine that takes 10 ms per step, one active request and one waiting."""
    engine = RecordingEngine(BigramModel({t: (t + 1) % 128 for t in range(32, 128)}, 128, 64),
                             step_delay=0.01)
    config = ServingConfig(port=0, model_name=MODEL_NAME, maximum_new_tokens=2000,
                           max_active_requests=1, max_queued_requests=1,
                           request_timeout_seconds=2.0)
    running = start(ModelService(engine, ascii_tokenizer(), config))
    running.engine = engine
    yield running
    stop(running)


# ---- client helpers ------------------------------------------------------------------------


@dataclasses.dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def events(self) -> list[tuple[str | None, str]]:
        """The server-sent events as (event name or None, data)."""
        parsed = []
        for block in self.body.decode("utf-8").split("\n\n"):
            if not block.strip():
                continue
            name, data = None, []
            for line in block.split("\n"):
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    data.append(line[len("data: "):])
            parsed.append((name, "\n".join(data)))
        return parsed


def call(served, method: str, path: str, body=None, headers=None) -> Response:
    connection = http.client.HTTPConnection(served.host, served.port, timeout=TIMEOUT)
    try:
        headers = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
            headers.setdefault("Content-Type", "application/json")
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()},
                        response.read())
    finally:
        connection.close()


def raw_call(served, request: bytes, *, shut_write: bool = False) -> Response:
    """Send raw request bytes and parse whatever answer comes back."""
    with socket.create_connection((served.host, served.port), timeout=TIMEOUT) as connection:
        connection.sendall(request)
        if shut_write:
            connection.shutdown(socket.SHUT_WR)
        return read_answer(connection)


def read_answer(connection: socket.socket) -> Response:
    """Read until the server closes and parse the answer."""
    answer = b""
    while chunk := connection.recv(65536):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Response(int(lines[0].split()[1]), headers, body)


def assert_error(response: Response, status: int, code: str | None = None) -> dict:
    assert response.status == status, response.body
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def expected_chat(served, messages, **fields):
    template = PlainChatTemplate()
    config = GenerationConfig(stop=template.stop_sequences, **fields)
    return served.reference.generate(template.render(messages), config)


# ---- routes ---------------------------------------------------------------------------------


def test_health_reports_the_model_and_every_response_has_the_security_headers(served):
    for path in ("/health", "/v1/health"):
        response = call(served, "GET", path)
        assert response.status == 200
        for name, value in SECURITY_HEADERS.items():
            assert response.headers[name] == value
        assert response.headers["connection"] == "keep-alive"  # HTTP/1.1 persistent
        assert "default-src 'none'" in response.headers["content-security-policy"]
        health = response.json()
        assert health["status"] == "ok" and health["model"] == MODEL_NAME
        assert (health["vocabulary_size"], health["maximum_context"],
                health["maximum_new_tokens"], health["engine"]) == (
            served.tokenizer.vocab_size, 8, 24,
            "native" if native_decode_available() else "full_forward")


def test_models_are_listed_in_openai_form(served):
    listing = call(served, "GET", "/v1/models").json()
    assert listing["object"] == "list"
    assert [(m["id"], m["object"]) for m in listing["data"]] == [(MODEL_NAME, "model")]
    assert call(served, "GET", f"/v1/models/{MODEL_NAME}").json()["id"] == MODEL_NAME
    assert_error(call(served, "GET", "/v1/models/other"), 404, "model_not_found")


def test_the_chat_page_is_self_contained_under_a_nonce_policy(served):
    first, second = call(served, "GET", "/"), call(served, "GET", "/chat")
    assert first.status == 200 and first.headers["content-type"] == "text/html; charset=utf-8"
    policy = first.headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", policy).group(1)
    page = first.body.decode("utf-8")
    assert page.count(f'nonce="{nonce}"') == 2  # the one script and the one style
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and "'unsafe-inline'" not in policy
    assert not re.search(r"(src|href)=", page)  # no external (or any) resources
    assert "/v1/chat/completions" in page and "stream: true" in page
    assert second.headers["content-security-policy"] != policy  # a fresh nonce each time


def test_generate_answers_with_the_ids_and_text_of_the_generation(served):
    expected = served.reference.generate("hello", max_new_tokens=7)
    response = call(served, "POST", "/v1/generate", {"prompt": "hello", "max_new_tokens": 7})
    assert response.status == 200
    body = response.json()
    assert body["prompt"] == "hello" and body["model"] == MODEL_NAME
    assert body["generated_token_ids"] == list(expected.generated_token_ids)
    assert body["prompt_token_ids"] == list(expected.prompt_token_ids)
    assert body["token_ids"] == list(expected.token_ids)
    assert (body["text"], body["generated_text"]) == (expected.text, expected.generated_text)
    assert body["finish_reason"] == "length" and body["usage"] == {
        "prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


def test_generate_streams_token_events_then_the_result(served):
    config = GenerationConfig(max_new_tokens=9, temperature=0.9, top_k=6, seed=11)
    expected = served.reference.generate("abc", config)
    response = call(served, "POST", "/v1/generate", {
        "prompt": "abc", "max_new_tokens": 9, "temperature": 0.9, "top_k": 6, "seed": 11,
        "stream": True})
    assert response.status == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = response.events()
    tokens = [json.loads(data) for name, data in events if name == "token"]
    assert [event["token_id"] for event in tokens] == list(expected.generated_token_ids)
    assert "".join(event["text"] for event in tokens) == expected.generated_text
    assert tokens[-1]["finish_reason"] == "length"
    assert events[-1][0] == "result"
    assert json.loads(events[-1][1])["generated_text"] == expected.generated_text


def test_completions_answer_in_openai_form_with_usage_and_stop(served):
    expected = served.reference.generate("ab", max_new_tokens=10)
    body = call(served, "POST", "/v1/completions", {
        "model": MODEL_NAME, "prompt": "ab", "max_tokens": 10, "temperature": 0}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == MODEL_NAME and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert (choice["index"], choice["text"], choice["finish_reason"], choice["logprobs"]) == (
        0, expected.generated_text, "length", None)
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 10, "total_tokens": 12}
    stop = expected.generated_text[3:5]
    stopped = served.reference.generate("ab", max_new_tokens=10, stop=stop)
    body = call(served, "POST", "/v1/completions", {
        "prompt": ["ab"], "max_tokens": 10, "temperature": 0, "stop": [stop]}).json()
    assert body["choices"][0]["text"] == stopped.generated_text
    assert body["choices"][0]["finish_reason"] == "stop"


def test_streamed_completions_end_with_the_finish_usage_and_done(served):
    expected = served.reference.generate("ab", max_new_tokens=8)
    response = call(served, "POST", "/v1/completions", {
        "prompt": "ab", "max_tokens": 8, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    events = response.events()
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    texts = [chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"]]
    assert "".join(texts) == expected.generated_text
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def test_chat_completions_render_the_conversation_with_the_template(served):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "text", "text": "and "},
                                             {"type": "text", "text": "you?"}]}]
    expected = expected_chat(served, [*messages[:3], {"role": "user", "content": "and you?"}],
                             max_new_tokens=12)
    body = call(served, "POST", "/v1/chat/completions", {
        "model": MODEL_NAME, "messages": messages, "max_tokens": 12, "temperature": 0}).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": expected.generated_text}
    assert choice["finish_reason"] == {"length": "length"}.get(expected.finish_reason, "stop")
    assert body["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)


def test_streamed_chat_completions_send_the_role_then_deltas_then_done(served):
    messages = [{"role": "user", "content": "tell me"}]
    expected = expected_chat(served, messages, max_new_tokens=10)
    response = call(served, "POST", "/v1/chat/completions", {
        "messages": messages, "max_completion_tokens": 10, "temperature": 0, "stream": True})
    events = response.events()
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [chunk["choices"][0]["delta"].get("content", "") for chunk in chunks[1:]]
    assert "".join(deltas) == expected.generated_text
    assert all(delta for delta in deltas[:-1])  # no empty deltas in between
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


# ---- errors ---------------------------------------------------------------------------------

GOOD = {"prompt": "ab", "max_new_tokens": 2}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/nowhere", None, 404, "not_found"),
        ("GET", "/v1/generate", None, 405, "method_not_allowed"),
        ("POST", "/health", GOOD, 405, "method_not_allowed"),
        ("DELETE", "/v1/models", None, 405, "method_not_allowed"),
        ("POST", "/v1/generate", b"{not json", 400, "invalid_json"),
        ("POST", "/v1/generate", b"[1, 2]", 400, "invalid_json"),
        ("POST", "/v1/generate", b'{"prompt": "a", "prompt": "b"}', 400, "invalid_json"),
        ("POST", "/v1/generate", b'{"prompt": "a", "temperature": NaN}', 400, "invalid_json"),
        ("POST", "/v1/generate", b'{"prompt": "\xff"}', 400, "invalid_json"),
        ("POST", "/v1/generate", {**GOOD, "colour": "red"}, 400, "unknown_field"),
        ("POST", "/v1/generate", {"max_new_tokens": 2}, 400, "missing_field"),
        ("POST", "/v1/generate", {"prompt": 5}, 400, "invalid_value"),
        ("POST", "/v1/generate", {"prompt": ""}, 400, "invalid_value"),
        ("POST", "/v1/generate", {"prompt": "ABC"}, 400, "invalid_value"),  # not encodable
        ("POST", "/v1/generate", {**GOOD, "max_new_tokens": "2"}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "max_new_tokens": True}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "max_new_tokens": 2.0}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "max_new_tokens": 25}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "temperature": -1}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "top_k": 3}, 400, "invalid_value"),  # greedy
        ("POST", "/v1/generate", {**GOOD, "temperature": 1, "top_k": 999}, 400,
         "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "temperature": 1, "top_p": 0}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "stop": [""]}, 400, "invalid_value"),
        ("POST", "/v1/generate", {**GOOD, "stream": "yes"}, 400, "invalid_value"),
        ("POST", "/v1/completions", {"prompt": "ab", "n": 2, "best_of": 3}, 400,
         "unsupported_value"),
        ("POST", "/v1/completions", {"prompt": "ab", "best_of": 2}, 400, "unsupported_value"),
        ("POST", "/v1/completions", {"prompt": "ab", "suffix": "x"}, 400, "unsupported_value"),
        ("POST", "/v1/completions", {"prompt": "ab", "logit_bias": {"1": 2}}, 400,
         "unsupported_value"),
        ("POST", "/v1/completions", {"prompt": "ab", "echo": "yes"}, 400, "invalid_value"),
        ("POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, "invalid_value"),
        ("POST", "/v1/completions", {"prompt": "ab", "model": "gpt-x"}, 404,
         "model_not_found"),
        ("POST", "/v1/completions", {"prompt": "ab", "stream_options": {}}, 400,
         "invalid_value"),
        ("POST", "/v1/chat/completions", {"messages": []}, 400, "invalid_value"),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]},
         400, "invalid_value"),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user"}]}, 400,
         "invalid_value"),
        ("POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "a", "tool_calls": []}]}, 400,
         "invalid_value"),
        ("POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "a"}], "tools": []}, 400, "invalid_value"),
        ("POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "a"}], "functions": []}, 400,
         "unknown_field"),
    ],
)
def test_bad_requests_get_their_status_and_a_json_error(served, method, path, body, status,
                                                        code):
    response = call(served, method, path, body)
    error = assert_error(response, status, code)
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value
    if status == 405:
        assert response.headers["allow"] in ("GET", "POST")
    if code == "unknown_field":
        assert error["param"] in ("colour", "functions")


CHAT = [{"role": "user", "content": "a"}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}


@pytest.mark.parametrize(
    ("body", "param", "mention"),
    [
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {
                "age": {"type": "integer", "minimum": 0}}}}}},
         "response_format", "response_format.json_schema.schema.properties.age.minimum"),
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "required": ["age"]}}}},
         "response_format", "response_format.json_schema.schema.required"),
        ({"messages": CHAT, "response_format": {"type": "xml"}}, "response_format",
         "response_format.type"),
        ({"messages": CHAT, "response_format": "json"}, "response_format", "'json'"),
        ({"messages": CHAT, "response_format": {"type": "json_schema"}}, "response_format",
         "response_format.json_schema"),
        ({"messages": CHAT, "tools": WEATHER}, "tools", "no tool format"),
        ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]},
         "tools[0].function.name", "'a b'"),
        ({"messages": CHAT, "tools": "get_weather"}, "tools", "'get_weather'"),
        ({"messages": CHAT, "tools": WEATHER, "tool_choice": "sometimes"}, "tool_choice",
         "'sometimes'"),
        ({"messages": CHAT, "tools": WEATHER,
          "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
         "tool_choice.function.name", "'get_time'"),
        ({"messages": CHAT, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"messages": CHAT, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "'yes'"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}]},
         "messages[0].tool_calls[0].function.arguments", "JSON text"),
        ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "type": "code"}]}]},
         "messages[0].tool_calls[0].type", "'code'"),
        ({"messages": [{"role": "assistant", "tool_calls": []}]}, "messages[0].tool_calls",
         "nonempty list"),
        ({"messages": [{"role": "assistant", "tool_calls": ["get_weather"]}]},
         "messages[0].tool_calls[0]", "must be an object"),
        ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "index": 0}]}]},
         "messages[0].tool_calls[0].index", "does not accept index"),
        ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "id": 7}]}]},
         "messages[0].tool_calls[0].id", "must be a string"),
        ({"messages": [{"role": "assistant", "tool_calls": [{**CALL, "function": "f"}]}]},
         "messages[0].tool_calls[0].function", "name and arguments"),
        ({"messages": [{"role": "assistant", "tool_calls": [
            {**CALL, "function": {"name": "", "arguments": "{}"}}]}]},
         "messages[0].tool_calls[0].function.name", "nonempty string"),
        ({"messages": [{"role": "user", "content": "a", "tool_calls": [CALL]}]},
         "messages[0].tool_calls", "only an assistant message"),
        ({"messages": [{"role": "robot", "content": "a"}]}, "messages[0].role", "'robot'"),
        ({"messages": [{"role": "user", "content": "a", "tool_call_id": "call_1"}]},
         "messages[0].tool_call_id", "user message"),
        ({"messages": [{"role": "tool", "content": "21", "tool_call_id": 5}]},
         "messages[0].tool_call_id", "5"),
        ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content",
         "content must be"),
        ({"messages": [{"role": "tool", "content": "21", "tool_call_id": "call_1"}]},
         "messages", "plain chat format"),  # the plain template renders no tool results
    ],
)
def test_bad_tool_and_response_format_fields_name_their_param(served, body, param, mention):
    error = assert_error(call(served, "POST", "/v1/chat/completions", body), 400,
                         "invalid_value")
    assert error["param"] == param
    assert mention in error["message"], error


def test_a_body_needs_a_positive_complete_length_within_the_limit(served):
    base = b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    assert_error(raw_call(served, base + b"\r\n", shut_write=True), 411, "length_required")
    chunked = base + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    assert_error(raw_call(served, chunked), 411, "length_required")
    assert_error(raw_call(served, base + b"Content-Length: abc\r\n\r\n"), 400,
                 "bad_content_length")
    assert_error(raw_call(served, base + b"Content-Length: -5\r\n\r\n"), 400,
                 "bad_content_length")
    assert_error(raw_call(served, base + b"Content-Length: 0\r\n\r\n"), 400,
                 "bad_content_length")
    short = base + b"Content-Length: 100\r\n\r\n" + b'{"prompt": "ab"}'
    assert_error(raw_call(served, short, shut_write=True), 400, "incomplete_body")
    too_large = json.dumps({"prompt": "a" * 5000}).encode()
    assert_error(call(served, "POST", "/v1/generate", too_large), 413, "request_too_large")
    announced = base + b"Content-Length: 5000000\r\n\r\n"
    assert_error(raw_call(served, announced, shut_write=True), 413, "request_too_large")


def test_a_body_must_be_json_in_utf_8(served):
    body = json.dumps(GOOD).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "application/json; charset=latin-1"):
        response = call(served, "POST", "/v1/generate", body, {"Content-Type": content_type})
        assert_error(response, 415, "unsupported_media_type")
    response = call(served, "POST", "/v1/generate", body,
                    {"Content-Type": "Application/JSON; charset=UTF-8"})
    assert response.status == 200


def test_a_loopback_server_answers_only_for_loopback_host_names(served):
    port = served.port
    for host in ("evil.example", f"evil.example:{port}", "192.168.1.10", "[2001:db8::1]:80"):
        assert_error(call(served, "GET", "/health", headers={"Host": host}), 421,
                     "misdirected_request")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "127.5.6.7"):
        assert call(served, "GET", "/health", headers={"Host": host}).status == 200


def test_malformed_requests_get_json_errors_from_the_server_itself(served):
    assert_error(raw_call(served, b"BREW /health HTTP/1.1\r\nHost: localhost\r\n\r\n"), 501)
    long_header = b"X-Long: " + b"x" * 70000
    assert_error(raw_call(served, b"GET /health HTTP/1.1\r\n" + long_header + b"\r\n\r\n"), 431)


def test_remote_binding_needs_allow_remote():
    with pytest.raises(ValueError, match="'0.0.0.0' is not a loopback address; serving beyond "
                                         "this machine needs allow_remote=True"):
        ServingConfig(host="0.0.0.0")
    with pytest.raises(ValueError, match="not a loopback address"):
        ServingConfig(host="example.com")
    assert ServingConfig(host="0.0.0.0", allow_remote=True).allow_remote
    assert ServingConfig(host="::1").host == "::1"
    assert ServingConfig(host="localhost").host == "localhost"


# ---- concurrency and disconnects ------------------------------------------------------------


def test_concurrent_clients_each_get_their_own_correct_answer(served):
    prompts = ["a", "hello", "the quick brown fox", "zz", "what is it?", "b c d"]
    expected = {prompt: served.reference.generate(prompt, max_new_tokens=6) for prompt in prompts}

    def client(index: int) -> None:
        prompt = prompts[index % len(prompts)]
        result = expected[prompt]
        route = index % 3
        if route == 0:
            body = call(served, "POST", "/v1/generate",
                        {"prompt": prompt, "max_new_tokens": 6}).json()
            assert body["generated_token_ids"] == list(result.generated_token_ids)
        elif route == 1:
            response = call(served, "POST", "/v1/completions", {
                "prompt": prompt, "max_tokens": 6, "temperature": 0, "stream": True})
            chunks = [json.loads(data) for _, data in response.events()[:-1]]
            assert "".join(c["choices"][0]["text"] for c in chunks) == result.generated_text
        else:
            body = call(served, "POST", "/v1/completions", {
                "prompt": prompt, "max_tokens": 6, "temperature": 0}).json()
            assert body["choices"][0]["text"] == result.generated_text
        assert call(served, "GET", "/health").status == 200

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        for future in [pool.submit(client, index) for index in range(24)]:
            future.result(timeout=TIMEOUT * 3)
    assert time.monotonic() - started < TIMEOUT * 3


def open_stream_request(served, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    connection = socket.create_connection((served.host, served.port), timeout=TIMEOUT)
    connection.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: localhost\r\n"
                       b"Content-Type: application/json\r\n"
                       + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return connection


def test_a_client_that_disconnects_mid_stream_cancels_its_request(slow_served):
    connection = open_stream_request(slow_served, {"prompt": "a", "max_new_tokens": 1500,
                                                   "stream": True})
    received = b""
    while b"event: token" not in received:
        received += connection.recv(4096)
    assert received.startswith(b"HTTP/1.1 200")
    connection.close()
    scheduler, engine = slow_served.service.scheduler, slow_served.engine
    assert wait_until(lambda: scheduler.stats().cancelled_count == 1, TIMEOUT)
    assert wait_until(lambda: engine.capacity().open_stream_count == 0, TIMEOUT)
    assert len(engine.steps) < 1000


def test_a_client_that_disconnects_while_waiting_for_a_whole_answer_cancels_it(slow_served):
    connection = open_stream_request(slow_served, {"prompt": "a", "max_new_tokens": 1500})
    scheduler = slow_served.service.scheduler
    assert wait_until(lambda: scheduler.stats().active_count == 1, TIMEOUT)
    connection.close()
    assert wait_until(lambda: scheduler.stats().cancelled_count == 1, TIMEOUT)
    assert wait_until(lambda: slow_served.engine.capacity().open_stream_count == 0, TIMEOUT)


def test_a_full_queue_answers_503_and_the_queued_request_still_completes(slow_served):
    running = open_stream_request(slow_served, {"prompt": "a", "max_new_tokens": 1500,
                                                "stream": True})
    scheduler = slow_served.service.scheduler
    assert wait_until(lambda: scheduler.stats().active_count == 1, TIMEOUT)
    queued = {}
    waiter = threading.Thread(target=lambda: queued.update(response=call(
        slow_served, "POST", "/v1/generate", {"prompt": "b", "max_new_tokens": 3})))
    waiter.start()
    assert wait_until(lambda: scheduler.stats().waiting_count == 1, TIMEOUT)
    response = call(slow_served, "POST", "/v1/generate", {"prompt": "c", "max_new_tokens": 3})
    assert_error(response, 503, "server_busy")
    assert response.headers["retry-after"] == "1"
    running.close()  # frees the one active slot
    waiter.join(TIMEOUT)
    assert queued["response"].status == 200
    assert queued["response"].json()["generated_text"] == "cde"


def test_a_closed_service_answers_503(slow_served):
    slow_served.service.close()
    assert_error(call(slow_served, "GET", "/health"), 503, "unavailable")
    assert_error(call(slow_served, "POST", "/v1/generate", GOOD), 503, "unavailable")


# ---- limits against slow and abusive clients --------------------------------------------------


@contextlib.contextmanager
def limited_server(**fields):
    """A server over a scripted engine (``ab`` continues ``cd``...) with ``fields`` set."""
    engine = RecordingEngine(BigramModel({t: (t + 1) % 128 for t in range(32, 128)}, 128, 64))
    config = ServingConfig(port=0, model_name=MODEL_NAME, maximum_new_tokens=8, **fields)
    running = start(ModelService(engine, ascii_tokenizer(), config))
    try:
        yield running
    finally:
        stop(running)


def connect(served) -> socket.socket:
    return socket.create_connection((served.host, served.port), timeout=TIMEOUT)


def test_connections_over_the_cap_get_an_immediate_503_without_a_thread_each():
    with limited_server(max_connections=2, request_timeout_seconds=TIMEOUT) as running:
        held = [connect(running) for _ in range(2)]
        refused = []
        try:
            for connection in held:
                connection.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest
            assert wait_until(lambda: running.server.open_connections == 2)
            threads = threading.active_count()
            started = time.monotonic()
            for _ in range(20):  # all open at once, each with its request sent
                refused.append(connect(running))
                refused[-1].sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answers = [read_answer(connection) for connection in refused]
            assert time.monotonic() - started < 2.0
            assert threading.active_count() <= threads + 1  # one thread answers them all
            for response in answers:
                error = assert_error(response, 503, "server_busy")
                assert "max_connections" in error["message"]
                assert response.headers["retry-after"] == "1"
                for name, value in SECURITY_HEADERS.items():
                    assert response.headers[name] == value
                assert response.headers["connection"] == "close"
            assert running.server.open_connections == 2
        finally:
            for connection in held + refused:
                connection.close()
        assert wait_until(lambda: running.server.open_connections == 0)
        assert call(running, "GET", "/health").status == 200
        response = call(running, "POST", "/v1/generate", GOOD)
        assert response.status == 200 and response.json()["generated_text"] == "cd"


def test_a_request_trickled_past_its_deadline_is_cut_off_with_408():
    # Each byte comes well within the timeout; the whole request does not.
    with limited_server(request_timeout_seconds=0.5) as running:
        body = json.dumps(GOOD).encode() + b" " * 200
        slow_body, slow_headers = connect(running), connect(running)
        try:
            slow_body.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: localhost\r\n"
                              b"Content-Type: application/json\r\n"
                              + f"Content-Length: {len(body)}\r\n\r\n".encode())
            slow_headers.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
            trickles = {slow_body: iter(body), slow_headers: iter(b"X-Slow: " + b"x" * 200)}
            started = time.monotonic()
            answered = {}
            while len(answered) < 2 and time.monotonic() - started < TIMEOUT:
                for connection, rest in trickles.items():
                    if connection in answered:
                        continue
                    if select.select([connection], [], [], 0)[0]:
                        answered[connection] = time.monotonic() - started
                    elif (byte := next(rest, None)) is not None:
                        connection.sendall(bytes([byte]))
                time.sleep(0.02)
            assert len(answered) == 2
            for connection, elapsed in answered.items():
                assert 0.4 < elapsed < 2.0
                error = assert_error(read_answer(connection), 408, "request_timeout")
                assert "did not arrive within 0.5 s" in error["message"]
        finally:
            slow_body.close()
            slow_headers.close()
        assert call(running, "POST", "/v1/generate", GOOD).json()["generated_text"] == "cd"


def test_json_nested_too_deeply_to_parse_is_a_400():
    with limited_server() as running:
        bodies = (b"[" * 100000, b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                  b'{"a": ' * 50000 + b"1" + b"}" * 50000)
        for body in bodies:
            error = assert_error(call(running, "POST", "/v1/generate", body), 400,
                                 "invalid_json")
            assert "nests" in error["message"]
        assert call(running, "POST", "/v1/generate", GOOD).status == 200


def test_clients_that_reset_before_their_answer_cost_no_traceback(capsys, caplog):
    caplog.set_level(logging.DEBUG, logger="riftco_transformer.serving.http")
    generate = json.dumps(GOOD).encode()
    post = (b"POST /v1/generate HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(generate)}\r\n\r\n".encode())
    requests = [b"", b"GET /he", b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"GET /nowhere HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"BREW / HTTP/1.1\r\n\r\n", post + generate[:5], post + generate]
    with limited_server() as running:
        for request in requests * 3:
            connection = connect(running)
            if request:
                connection.sendall(request)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()  # a reset, not an orderly close
        # Connections are taken in order: once this one is answered, all were taken.
        assert call(running, "GET", "/health").status == 200
        assert wait_until(lambda: running.server.open_connections == 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err
    assert not [record for record in caplog.records
                if record.levelno >= logging.WARNING or record.exc_info]


def test_max_connections_must_be_a_positive_int_and_riftco_serve_sets_it():
    from riftco_transformer.cli import build_parser

    assert ServingConfig().max_connections == 128
    parser = build_parser()
    assert parser.parse_args(["serve", "--bundle", "m.rift"]).max_connections == 128
    assert parser.parse_args(["serve", "--bundle", "m.rift", "--max-connections", "3"]
                             ).max_connections == 3
    with pytest.raises(ValueError, match=r"max_connections must be in \[1, "):
        ServingConfig(max_connections=0)
    with pytest.raises(TypeError, match="max_connections must be an int, not bool"):
        ServingConfig(max_connections=True)
