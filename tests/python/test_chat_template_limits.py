"""Chat templates against hostile template text (issue 27).

A chat template comes with a model file, so its text is untrusted. These tests hold the
probe's findings about it shut:

* recognising a template is linear in its length, and a text over
  ``TemplateLimits.template_chars`` is refused with the limit and the size;
* jinja2 renders under limits (output, any single value, everything built, steps, CPU
  time), nothing of a template runs at load, and every failure is a ChatTemplateError
  naming the template: a 400 from ``/v1/chat/completions``, never a 500.

Tests that render with jinja2 skip without it (the built-in renderers need no limits).
"""

from __future__ import annotations

import dataclasses
import http.client
import importlib.util
import json
import re
import sys
import time

import pytest
from conftest import REPOSITORY
from serving_fakes import BigramModel, RecordingEngine
from test_chat_templates import TEMPLATES

from riftco_transformer.native.pretrained_tokenizer import PretrainedTokenizer
from riftco_transformer.serving import ModelService, ServingConfig, make_server
from riftco_transformer.serving.chat_templates import (
    ChatTemplateError,
    PretrainedChatTemplate,
    TemplateLimits,
    _default_chatml_system,
)

sys.path.insert(0, str(REPOSITORY / "tools" / "fuzz"))
import gguf_seeds  # noqa: E402  (tools/fuzz/gguf_seeds.py: struct-only GGUF writer)

HAS_JINJA = importlib.util.find_spec("jinja2") is not None
needs_jinja = pytest.mark.skipif(not HAS_JINJA, reason="jinja2 is not importable: the "
                                                        "built-in renderers need no limits")
RENDERERS = [False, pytest.param(True, marks=needs_jinja)]

SOURCE = "hostile.gguf (tokenizer.chat_template)"


def timed(call):
    """``(what call() returned or raised, seconds it took)``."""
    start = time.perf_counter()
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - the caller asserts on it
        result = error
    return result, time.perf_counter() - start


# ---- 1. recognition is linear; the text has a size limit ----------------------------------------

def _old_default_system(template: str):
    """The regular expression the ChatML default-system search was before (quadratic: it
    rescanned the rest of the text from every "<|im_start|>system")."""
    match = re.search(r"<\|im_start\|>system(?:\\n|\n)(.*?)<\|im_end\|>", template, re.DOTALL)
    if match is None or "messages[0]['role'] != 'system'" not in template.replace('"', "'"):
        return None
    text = match.group(1)
    if "{{" in text or "{%" in text:
        return None
    return text.replace("\\n", "\n")


@pytest.mark.parametrize("template", [
    TEMPLATES["chatml"][0],
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\\nBe brief.<|im_end|>",
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system<|im_start|>system\nA<|im_end|>",
    "{% if messages[0][\"role\"] != \"system\" %}<|im_start|>systemX<|im_start|>system\nB"
    "<|im_end|><|im_start|>system\nC<|im_end|>",
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n{{ x }}<|im_end|>",
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nno end",
    "<|im_start|>system\nNot conditional<|im_end|>",
    "",
])
def test_the_default_system_search_finds_what_the_old_expression_found(template):
    assert _default_chatml_system(template) == _old_default_system(template)


def test_recognising_a_template_is_linear_in_its_length():
    # The probe's template: 20,000 "<|im_start|>system\n" (380 KB) took 33 s to load. With
    # the condition that makes the loader look for a default system message, and 1 MiB.
    condition = "{% if messages[0]['role'] != 'system' %}"
    limits = TemplateLimits(template_chars=1 << 21)
    for text in (condition + "<|im_start|>system\n" * 20_000,
                 condition + "<|im_start|>system\n" * ((1 << 20) // 19)):
        template, seconds = timed(lambda: PretrainedChatTemplate.from_text(
            text, use_jinja=False, limits=limits))
        assert isinstance(template, PretrainedChatTemplate), template
        assert template.family == "chatml" and seconds < 1.0, seconds


def test_a_template_over_the_size_limit_is_refused_naming_the_limit_and_the_size():
    limit = TemplateLimits().template_chars
    text = "<|im_start|>system\n" * (limit // 19 + 1)
    for use_jinja in (False, None):
        with pytest.raises(ChatTemplateError) as caught:
            PretrainedChatTemplate.from_text(text, use_jinja=use_jinja, source=SOURCE)
        message = str(caught.value)
        assert SOURCE in message and "TemplateLimits.template_chars" in message
        assert f"{len(text):,} characters" in message and f"limit {limit:,}" in message
    with pytest.raises(ChatTemplateError, match="template_chars"):
        PretrainedChatTemplate("chatml", text=text, use_jinja=False)
    assert isinstance(ChatTemplateError("x"), ValueError)
    # At the limit it loads.
    PretrainedChatTemplate.from_text(text[:limit], use_jinja=False)


def test_limits_are_checked():
    with pytest.raises(ValueError, match="steps"):
        TemplateLimits(steps=0)
    with pytest.raises(ValueError, match="cpu_seconds"):
        TemplateLimits(cpu_seconds=float("nan"))
    with pytest.raises(TypeError, match="limits"):
        PretrainedChatTemplate.for_family("chatml", limits={"steps": 1})


# ---- 3. jinja2 rendering under limits ----------------------------------------------------------

def hostile(text: str, **limits) -> PretrainedChatTemplate:
    return PretrainedChatTemplate.from_text("<|im_start|>" + text, use_jinja=True,
                                            source=SOURCE, limits=TemplateLimits(**limits))


def render_failure(template: PretrainedChatTemplate) -> tuple[str, float]:
    error, seconds = timed(lambda: template.render([{"role": "user", "content": "hi"}]))
    assert isinstance(error, ChatTemplateError), error
    assert SOURCE in str(error)
    return str(error), seconds


@needs_jinja
def test_the_probes_nested_loops_stop_within_the_default_limits():
    # Ran 18.8 s and ended in a 3 GiB MemoryError.
    for body in ("{% for a in range(100000) %}{% for b in range(100000) %}xxxxxxxxxxxxxxxx"
                 "{% endfor %}{% endfor %}",
                 "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
                 "{% endfor %}"):
        message, seconds = render_failure(hostile(body))
        assert "TemplateLimits.steps" in message and seconds < 2.0


@needs_jinja
def test_the_step_limit_grows_with_the_conversation():
    template = hostile("{% for message in messages %}{{ message['content'] }}{% endfor %}"
                       "{% for i in range(300) %}.{% endfor %}", steps=200, steps_per_message=10)
    with pytest.raises(ChatTemplateError, match="more than 210 steps"):
        template.render([{"role": "user", "content": "hi"}])
    assert template.render([{"role": "user", "content": "hi"}] * 100).endswith("." * 300)


@needs_jinja
def test_the_output_limit_counts_the_rendered_text():
    template = hostile("{% for i in range(1000) %}0123456789{% endfor %}", output_chars=5000)
    message, seconds = render_failure(template)
    assert "more than 5,000 characters (TemplateLimits.output_chars)" in message
    assert seconds < 1.0
    assert len(hostile("{% for i in range(400) %}0123456789{% endfor %}",
                       output_chars=5000).render([{"role": "user", "content": "x"}])) == 4012


@needs_jinja
@pytest.mark.parametrize("body, fragment", [
    ("{{ 'a' * 1000000000 }}", "the result of *"),
    ("{{ [[[[0] * 1000] * 1000] * 1000] | length }}", "the result of *"),
    ("{{ 7 ** 100000000 }}", "bits"),
    ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}"
     "{% endfor %}", "bits"),
    ("{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}"
     "{% endfor %}", "a ~ concatenation"),
    ("{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}"
     "{% endfor %}", "the result of +"),
    ("{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(40) %}"
     "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}"
     "{{ ns.x == ns.y }}", "a literal"),
    ("{{ 'a' | center(1000000000) }}", "filter center"),
    ("{{ 'a'.ljust(1000000000) }}", "str.ljust"),
    ("{{ '%1000000000s' % 'a' }}", "the result of %"),
    ("{{ '{:>1000000000}'.format('a') }}", "str.format"),
    ("{% set s = 'a' * 10000 %}{{ s.replace('a', s) }}", "str.replace"),
    ("{{ ('\\t' * 100000).expandtabs(100000) }}", "str.expandtabs"),
    ("{{ ('a\\n' * 100000) | indent(1000) }}", "filter indent"),
    ("{% set s = 'x' * 1000000 %}{{ ([s] * 8) | join(s) }}", "filter join"),
    ("{{ [1] | slice(100000000) | list }}", "filter slice"),
])
def test_a_value_too_big_for_the_output_limit_is_refused_before_it_is_built(body, fragment):
    message, seconds = render_failure(hostile(body))
    assert fragment in message
    assert "TemplateLimits.output_chars" in message or "bits" in message
    assert seconds < 1.0


@needs_jinja
@pytest.mark.parametrize("body", [
    # Each value is within the output limit; together they are not.
    "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
    "{% set ns.l = ns.l + [('x' * 400000) ~ i] %}{% endfor %}",
    "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set t %}{{ ns.x }}{{ ns.x }}"
    "{% endset %}{% set ns.x = t[:3000000] %}{% endfor %}",
    "{% set t %}{% for i in range(100000) %}" + "x" * 1000 + "{% endfor %}{% endset %}",
])
def test_everything_one_rendering_builds_is_bounded(body):
    message, seconds = render_failure(hostile(body, produced_chars=1 << 24))
    assert "TemplateLimits.produced_chars" in message and seconds < 2.0


@needs_jinja
def test_the_cpu_time_limit_stops_expensive_steps():
    # Few steps, each scanning a megabyte.
    template = hostile("{% set s = 'x' * 1000000 %}{% for i in range(50000) %}"
                       "{% if s.count('y') %}{% endif %}{% endfor %}", cpu_seconds=0.2)
    message, seconds = render_failure(template)
    assert "0.2 s of CPU time (TemplateLimits.cpu_seconds)" in message and seconds < 1.5


@needs_jinja
def test_nothing_of_a_template_runs_at_load():
    # jinja2 folds constant expressions when it compiles: these would build a gigabyte.
    for body in ("{{ 'a' * 1000000000 }}", "{{ ('a' * 100000) ~ ('b' * 100000) }}",
                 "{{ 'abc'[0:2] * 1000000000 }}", "{{ 'a' | center(1000000000) }}"):
        template, seconds = timed(lambda: hostile(body))
        assert isinstance(template, PretrainedChatTemplate), template
        assert seconds < 0.5
    with pytest.raises(ChatTemplateError):
        hostile("{{ 'a' * 1000000000 }}").render([{"role": "user", "content": "x"}])


@needs_jinja
@pytest.mark.parametrize("body, fragment", [
    ("{{ ''.__class__.__mro__ }}", "failed: SecurityError"),
    ("{{ undefined_function() }}", "failed: UndefinedError"),
    ("{{ raise_exception('roles must alternate') }}", ": roles must alternate"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "failed: RecursionError"),
    ("{{ 1 / 0 }}", "failed: ZeroDivisionError"),
    ("{% set ns = namespace(x=1) %}{{ ns }}", "namespace"),
    ("{{ lipsum(100000) }}", "'lipsum' is undefined"),
])
def test_a_failing_rendering_is_a_chat_template_error_naming_the_template(body, fragment):
    message, seconds = render_failure(hostile(body))
    assert fragment in message and seconds < 1.0
    assert message.startswith(f"chat template {SOURCE}")


@needs_jinja
@pytest.mark.parametrize("body", ["{% for %}", "{{ x | striptags }}", "{% if %}" * 3000])
def test_a_template_that_does_not_compile_is_refused_at_load(body):
    with pytest.raises(ChatTemplateError) as caught:
        hostile(body)
    assert str(caught.value).startswith(f"chat template {SOURCE} does not compile")


@needs_jinja
@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_limits_leave_real_templates_and_long_conversations_alone(family):
    # 5,000 turns render as without limits (the built-in renderer is the reference).
    text, bos, eos = TEMPLATES[family]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20}
                for i in range(5000)]
    limited = PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos,
                                               use_jinja=True)
    built_in = PretrainedChatTemplate.from_text(text, bos_token=bos, eos_token=eos,
                                                use_jinja=False)
    rendered, seconds = timed(lambda: limited.render(messages))
    assert rendered == built_in.render(messages) and seconds < 1.5


# ---- over HTTP: a failing template is a 400 ------------------------------------------------------

def byte_tokenizer() -> PretrainedTokenizer:
    """GPT-2-style byte-level BPE with ChatML's control tokens."""
    tokens, types, merges = gguf_seeds.byte_level_vocabulary()
    return PretrainedTokenizer.from_vocabulary(tokens, token_types=types, merges=merges)


@pytest.fixture(scope="module")
def tokenizer():
    with byte_tokenizer() as made:
        yield made


# ---- 2 and 3 over HTTP ----------------------------------------------------------------------------

@dataclasses.dataclass
class Served:
    server: object
    thread: object
    service: ModelService
    engine: RecordingEngine
    tokenizer: PretrainedTokenizer

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        host, port = self.server.server_address[:2]
        connection = http.client.HTTPConnection(host, port, timeout=10)
        try:
            connection.request("POST", path, body=json.dumps(body).encode("utf-8"),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def prompt_of_last_request(self) -> list[int]:
        """The tokens the engine was fed for the newest stream (the prompt comes first)."""
        newest = max(stream for step in self.engine.steps for stream, _ in step)
        return [token for step in self.engine.steps for stream, row in step
                if stream == newest for token in row]


def serve_template(tokenizer, template) -> Served:
    engine = RecordingEngine(BigramModel({}, tokenizer.vocabulary_size, 2048))
    config = ServingConfig(port=0, maximum_new_tokens=2, request_timeout_seconds=5.0)
    service = ModelService(engine, tokenizer, config, chat_template=template)
    server = make_server(service)
    return Served(server, server.serve_in_thread(), service, engine, tokenizer)


def stop(served: Served) -> None:
    served.server.shutdown()
    served.server.server_close()
    served.thread.join(10)
    served.service.close()


def test_chat_completions_answer_a_template_refusal_with_400(tokenizer):
    served = serve_template(tokenizer,
                            PretrainedChatTemplate.for_family("mistral"))
    try:
        status, body = served.post("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
        assert status == 400, body
        assert body["error"]["param"] == "messages" and "alternate" in body["error"]["message"]
    finally:
        stop(served)


HOSTILE_LOOPS = ("{% for message in messages %}<|im_start|>{{ message['content'] }}"
                 "{% endfor %}{% for a in range(100000) %}{% for b in range(100000) %}"
                 "{{ a }}{{ b }}{% endfor %}{% endfor %}")


@needs_jinja
@pytest.mark.parametrize("text, fragment", [
    (HOSTILE_LOOPS, "TemplateLimits.steps"),
    ("<|im_start|>{{ raise_exception('Conversation roles must alternate') }}",
     "roles must alternate"),
    ("<|im_start|>{{ ''.__class__.__mro__ }}", "SecurityError"),
])
def test_chat_completions_answer_a_failing_template_with_400(tokenizer, text, fragment):
    template = PretrainedChatTemplate.from_text(text, use_jinja=True, source=SOURCE)
    served = serve_template(tokenizer, template)
    try:
        (status, body), seconds = timed(lambda: served.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}]}))
        assert status == 400, body
        error = body["error"]
        assert error["code"] == "chat_template_error" and error["param"] == "messages"
        assert SOURCE in error["message"] and fragment in error["message"]
        assert seconds < 2.0
    finally:
        stop(served)
