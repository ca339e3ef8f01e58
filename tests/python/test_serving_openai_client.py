"""The official ``openai`` client against our server: completions, chat completions, both
streamed, the model list and error mapping.

The client is not a dependency of the package: it runs in a subprocess under the interpreter
named by ``$RIFTCO_TRANSFORMER_OPENAI_PYTHON`` (``.ci/run`` makes a venv with it). Without
one that can import ``openai`` the test is skipped."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
from conftest import TINY_CONFIG
from serving_fakes import full_forward_log_softmax

from riftco_transformer import DecoderOnlyTransformer, Tokenizer
from riftco_transformer.serving import (
    FullForwardEngine,
    GenerationConfig,
    ModelService,
    PlainChatTemplate,
    ServingConfig,
    TextGenerator,
    make_server,
)
from riftco_transformer.serving.chat import chat_prompt

OPENAI_PYTHON_VARIABLE = "RIFTCO_TRANSFORMER_OPENAI_PYTHON"
MODEL_NAME = "riftco-openai-test"

CLIENT = r"""
import json, sys
import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0,
                       timeout=30)
out = {"version": openai.__version__}
out["models"] = [model.id for model in client.models.list()]
completion = client.completions.create(model=sys.argv[2], prompt="hello", max_tokens=8,
                                       temperature=0)
out["completion"] = {"text": completion.choices[0].text,
                     "finish_reason": completion.choices[0].finish_reason,
                     "usage": [completion.usage.prompt_tokens,
                               completion.usage.completion_tokens,
                               completion.usage.total_tokens]}
messages = [{"role": "user", "content": "say hi"}]
chat = client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=8,
                                      temperature=0)
out["chat"] = {"content": chat.choices[0].message.content,
               "role": chat.choices[0].message.role,
               "finish_reason": chat.choices[0].finish_reason,
               "completion_tokens": chat.usage.completion_tokens}
deltas, usage, finish = [], None, None
for chunk in client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for choice in chunk.choices:
        if choice.delta.content:
            deltas.append(choice.delta.content)
        finish = choice.finish_reason or finish
out["chat_stream"] = {"deltas": deltas, "finish_reason": finish, "completion_tokens": usage}
texts = [chunk.choices[0].text for chunk in client.completions.create(
    model=sys.argv[2], prompt="hello", max_tokens=8, temperature=0, stream=True)
    if chunk.choices]
out["completion_stream"] = texts
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
except openai.NotFoundError as error:
    out["not_found"] = error.status_code
try:
    client.completions.create(model=sys.argv[2], prompt="x", max_tokens=1, best_of=3)
except openai.BadRequestError as error:
    out["bad_request"] = [error.status_code, error.body.get("code")]
print(json.dumps(out))
"""


def openai_python() -> str:
    interpreter = os.environ.get(OPENAI_PYTHON_VARIABLE)
    if not interpreter:
        pytest.skip(f"${OPENAI_PYTHON_VARIABLE} is not set (an interpreter with the openai "
                    "package; .ci/run creates one)")
    try:
        probe = subprocess.run([interpreter, "-c", "import openai"], capture_output=True,
                               text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"${OPENAI_PYTHON_VARIABLE}={interpreter} cannot run: {error}")
    if probe.returncode != 0:
        pytest.skip(f"${OPENAI_PYTHON_VARIABLE}={interpreter} cannot import openai: "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
    return interpreter


def test_the_official_openai_client_completes_chats_and_streams():
    interpreter = openai_python()
    tokenizer = Tokenizer("### User:\n### Assistant:\nabcdefghijklmnopqrstuvwxyz .,!?")
    model = DecoderOnlyTransformer(
        dataclasses.replace(TINY_CONFIG, vocabulary_size=tokenizer.vocab_size))
    config = ServingConfig(port=0, model_name=MODEL_NAME, maximum_new_tokens=16)
    with model, tokenizer, ModelService(model, tokenizer, config) as service:
        reference = TextGenerator(FullForwardEngine(model), tokenizer)
        completion = reference.generate("hello", max_new_tokens=8)
        template = PlainChatTemplate()
        chat = reference.generate(
            template.render([{"role": "user", "content": "say hi"}]),
            GenerationConfig(max_new_tokens=8, stop=template.stop_sequences))
        with make_server(service) as server:
            server.serve_in_thread()
            environment = {**os.environ, "NO_PROXY": "*", "no_proxy": "*"}
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                         "https_proxy", "all_proxy", "OPENAI_BASE_URL"):
                environment.pop(name, None)
            ran = subprocess.run([interpreter, "-c", CLIENT, server.url, MODEL_NAME],
                                 capture_output=True, text=True, timeout=60, env=environment)
            server.shutdown()
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["models"] == [MODEL_NAME]
    assert out["completion"] == {"text": completion.generated_text, "finish_reason": "length",
                                 "usage": [5, 8, 13]}
    finish = "length" if chat.finish_reason == "length" else "stop"
    assert out["chat"] == {"content": chat.generated_text, "role": "assistant",
                           "finish_reason": finish,
                           "completion_tokens": len(chat.generated_token_ids)}
    assert "".join(out["chat_stream"]["deltas"]) == chat.generated_text
    assert out["chat_stream"]["finish_reason"] == finish
    assert out["chat_stream"]["completion_tokens"] == len(chat.generated_token_ids)
    assert "".join(out["completion_stream"]) == completion.generated_text
    assert out["not_found"] == 404
    assert out["bad_request"] == [400, "unsupported_value"]


CHOICES_CLIENT = r"""
import json, sys
import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0,
                       timeout=30)
model = sys.argv[2]
messages = [{"role": "user", "content": "tell me"}]


def entry(item):
    return {"token": item.token, "logprob": item.logprob, "bytes": item.bytes}


def chat_choice(choice, content, finish):
    return {"index": choice.index, "content": content, "finish": finish, "logprobs": []}


def chat(**fields):
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                            **fields)
    return [{"index": c.index, "content": c.message.content, "finish": c.finish_reason,
             "logprobs": None if c.logprobs is None else [
                 {**entry(e), "top": [entry(t) for t in e.top_logprobs]}
                 for e in c.logprobs.content]} for c in answer.choices]


def chat_stream(**fields):
    choices = {}
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                                stream=True, **fields):
        for c in chunk.choices:
            state = choices.setdefault(c.index, {"index": c.index, "content": "",
                                                 "finish": None, "logprobs": []})
            state["content"] += c.delta.content or ""
            state["finish"] = c.finish_reason or state["finish"]
            if c.logprobs is not None and c.logprobs.content:
                state["logprobs"] += [{**entry(e), "top": [entry(t) for t in e.top_logprobs]}
                                      for e in c.logprobs.content]
    return [choices[index] for index in sorted(choices)]


def completion(**fields):
    answer = client.completions.create(model=model, prompt="a quick fox", max_tokens=6,
                                       **fields)
    return [{"index": c.index, "text": c.text, "finish": c.finish_reason,
             "logprobs": c.logprobs.model_dump()} for c in answer.choices]


def completion_stream(**fields):
    choices = {}
    for chunk in client.completions.create(model=model, prompt="a quick fox", max_tokens=6,
                                           stream=True, **fields):
        for c in chunk.choices:
            state = choices.setdefault(c.index, {"index": c.index, "text": "", "finish": None,
                                                 "logprobs": {"tokens": [],
                                                              "token_logprobs": [],
                                                              "top_logprobs": [],
                                                              "text_offset": []}})
            state["text"] += c.text
            state["finish"] = c.finish_reason or state["finish"]
            if c.logprobs is not None:
                for key, values in c.logprobs.model_dump().items():
                    state["logprobs"][key] += values or []
    return [choices[index] for index in sorted(choices)]


out = {
    "n2": chat(n=2, seed=11, temperature=1),
    "n2_again": chat(n=2, seed=11, temperature=1),
    "greedy": chat(n=2, temperature=0),
    "logprobs": chat(n=2, seed=5, logprobs=True, top_logprobs=5),
    "logprobs_stream": chat_stream(n=2, seed=5, logprobs=True, top_logprobs=5),
    "completion": completion(n=2, seed=9, logprobs=5, echo=True),
    "completion_stream": completion_stream(n=2, seed=9, logprobs=5, echo=True),
}
print(json.dumps(out))
"""


def test_the_official_client_gets_n_choices_logprobs_and_echo_streamed_or_not():
    """Issue 32's acceptance: ``n=2`` returns two choices (a seed reproduces them),
    ``top_logprobs=5`` equals a float64 log-softmax of one full forward within 1e-4 (the
    oracle runs the model here, independently of the server), and streamed answers list the
    same choices and log-probabilities as whole ones."""
    interpreter = openai_python()
    pytest.importorskip("numpy")
    tokenizer = Tokenizer("### User:\n### Assistant:\nabcdefghijklmnopqrstuvwxyz .,!?")
    model = DecoderOnlyTransformer(dataclasses.replace(
        TINY_CONFIG, vocabulary_size=tokenizer.vocab_size, maximum_context=64))
    config = ServingConfig(port=0, model_name=MODEL_NAME, maximum_new_tokens=16)
    with model, tokenizer, ModelService(model, tokenizer, config) as service:
        with make_server(service) as server:
            server.serve_in_thread()
            environment = {**os.environ, "NO_PROXY": "*", "no_proxy": "*"}
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                         "https_proxy", "all_proxy", "OPENAI_BASE_URL"):
                environment.pop(name, None)
            ran = subprocess.run([interpreter, "-c", CHOICES_CLIENT, server.url, MODEL_NAME],
                                 capture_output=True, text=True, timeout=120, env=environment)
            server.shutdown()
        assert ran.returncode == 0, ran.stderr
        out = json.loads(ran.stdout.strip().splitlines()[-1])

        def single_id(data: bytes) -> int:
            ids = list(tokenizer.encode_bytes(data))
            assert len(ids) == 1, (data, ids)
            return ids[0]

        assert [choice["index"] for choice in out["n2"]] == [0, 1]
        assert out["n2_again"] == out["n2"]
        assert out["n2"][0]["content"] != out["n2"][1]["content"]
        assert out["greedy"][0]["content"] == out["greedy"][1]["content"]

        prompt = chat_prompt(PlainChatTemplate(), tokenizer, [{"role": "user",
                                                              "content": "tell me"}])
        prompt_ids = (list(tokenizer.encode_bytes(prompt.encode("utf-8")))
                      if isinstance(prompt, str) else list(prompt))
        assert [choice["index"] for choice in out["logprobs"]] == [0, 1]
        for choice in out["logprobs"]:
            generated = [single_id(bytes(entry["bytes"])) for entry in choice["logprobs"]]
            assert "".join(entry["token"] for entry in choice["logprobs"]) == choice["content"]
            oracle = full_forward_log_softmax(model, prompt_ids + generated)
            for position, (entry, token) in enumerate(zip(choice["logprobs"], generated,
                                                          strict=True)):
                row = oracle[len(prompt_ids) - 1 + position]
                assert abs(entry["logprob"] - row[token]) <= 1e-4
                ranked = sorted(range(len(row)), key=lambda t: -row[t])[:5]
                assert [single_id(bytes(top["bytes"])) for top in entry["top"]] == ranked
                for top, alternative in zip(entry["top"], ranked, strict=True):
                    assert abs(top["logprob"] - row[alternative]) <= 1e-4

        for whole, streamed in zip(out["logprobs"], out["logprobs_stream"], strict=True):
            assert (streamed["index"], streamed["content"], streamed["finish"]) == (
                whole["index"], whole["content"], whole["finish"])
            assert [entry["token"] for entry in streamed["logprobs"]] == [
                entry["token"] for entry in whole["logprobs"]]
            for mine, theirs in zip(streamed["logprobs"], whole["logprobs"], strict=True):
                assert abs(mine["logprob"] - theirs["logprob"]) <= 1e-6

        prompt_ids = list(tokenizer.encode_bytes(b"a quick fox"))
        assert [choice["index"] for choice in out["completion"]] == [0, 1]
        for whole, streamed in zip(out["completion"], out["completion_stream"], strict=True):
            logprobs = whole["logprobs"]
            assert whole["text"].startswith("a quick fox") and streamed["text"] == whole["text"]
            assert streamed["finish"] == whole["finish"]
            ids = [single_id(text.encode("utf-8")) for text in logprobs["tokens"]]
            assert ids[: len(prompt_ids)] == prompt_ids
            oracle = full_forward_log_softmax(model, ids)
            assert logprobs["token_logprobs"][0] is None
            for position in range(1, len(ids)):
                row = oracle[position - 1]
                assert abs(logprobs["token_logprobs"][position] - row[ids[position]]) <= 1e-4
                for text, value in logprobs["top_logprobs"][position].items():
                    assert abs(value - row[single_id(text.encode("utf-8"))]) <= 1e-4
            assert streamed["logprobs"]["tokens"] == logprobs["tokens"]
            assert streamed["logprobs"]["text_offset"] == logprobs["text_offset"]
            assert [None if top is None else sorted(top)
                    for top in streamed["logprobs"]["top_logprobs"]] == [
                None if top is None else sorted(top) for top in logprobs["top_logprobs"]]
            for mine, theirs in zip(streamed["logprobs"]["token_logprobs"],
                                    logprobs["token_logprobs"], strict=True):
                assert (mine is None and theirs is None) or abs(mine - theirs) <= 1e-6
