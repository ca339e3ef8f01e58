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
    client.completions.create(model=sys.argv[2], prompt="x", max_tokens=1, n=2)
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
