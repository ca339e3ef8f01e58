"""The HTTP API's request bodies and response bodies (transport lives in ``serving.http``).

Three generation routes share one parsed form, :class:`ApiRequest`:

* ``POST /v1/generate``: ``{prompt, max_new_tokens=32, temperature=0, top_k, top_p, min_p,
  seed=0, stop, repetition_penalty=1, presence_penalty=0, frequency_penalty=0,
  stream=false}``; the response (docs/ARCHITECTURE.md, 'HTTP API') echoes the prompt and
  lists the token ids.
* ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request and response
  shapes, with OpenAI's defaults (``temperature`` 1, ``top_p`` 1, penalties 0, a random seed
  unless one is given: the same request with the same ``seed`` samples the same text).
  ``max_tokens`` defaults to what the model's context leaves after the prompt (at most the
  server's ``maximum_new_tokens`` when it sets one); more than the limit is a 400 naming
  ``max_tokens``, the value and the limit. Both routes end at the end tokens
  (``ModelService.end_token_ids``: the tokenizer's end token and the chat template's
  end-of-turn token) with ``finish_reason`` ``"stop"``, the end token's text left out.
  ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]) are OpenAI's; ``top_k``,
  ``min_p`` (in [0, 1]) and ``repetition_penalty`` are accepted as extensions (the order of
  the rules: ``serving.sampling``). Fields OpenAI defines but this server cannot honour are
  accepted only at their neutral value (no ``logit_bias``, no ``suffix``, ``best_of`` null
  or ``n``...).

*Choices* (``n``, 1 by default, at most the server's ``max_active_requests``): ``n`` requests
over the one prompt, submitted as a scheduler group (admitted together; a group that can
never run at once is a 400 naming ``n``). Choice ``i`` samples with the seed
``generation.choice_seed(seed, i)``: choice 0 with ``seed`` itself, so the same request with
the same ``seed`` answers the same choices; greedy choices are all alike. ``usage`` counts
the prompt once and every choice's completion tokens. Streamed chunks carry their choice's
``index``; each choice ends with its own finish chunk.

*Log-probabilities* are the model's raw ones (the log-softmax of the logits before
penalties, temperature and truncation, as OpenAI reports them; ``serving.generation``), for
every generated token but an end token (whose text is left out too). Chat:
``logprobs: true`` and ``top_logprobs`` (0 to 20, only with ``logprobs: true``) give
``choices[i].logprobs.content``: ``{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}`` per token, ``token`` its bytes decoded as UTF-8 with replacement characters,
``bytes`` the exact bytes. Completions: ``logprobs`` (0 to 5) gives ``{tokens,
token_logprobs, top_logprobs, text_offset}``: ``top_logprobs`` maps the ``logprobs`` most
likely tokens' texts, and the chosen one's, to their log-probabilities; ``text_offset`` is
each token's offset in the choice's ``text``. ``echo: true`` puts the prompt before each
choice's text (streamed: in the choice's first chunk); with ``logprobs`` it scores the prompt
tokens too (the first one's log-probability and alternatives are null), which feeds the
prompt one token per step, and needs the prompt to fit the context (a 400 naming ``echo``
otherwise). Streamed chunks carry the log-probabilities of their tokens, so a streamed
answer lists what the answer would list whole.

*Structured output* (chat): ``response_format`` ``{"type": "text"}`` (the default),
``{"type": "json_object"}`` (any JSON object) or ``{"type": "json_schema", "json_schema":
{"name", "schema", "strict"?, "description"?}}`` constrains decoding to JSON that validates
against the schema (``serving.structured_output``: the supported subset; the mask is applied
before sampling, incrementally, one matcher per choice; the answer ends with ``"stop"`` once
the value is complete). A schema outside the subset is a 400 (param ``response_format``,
code ``invalid_value``) whose message names the keyword's JSON path
(``response_format.json_schema.schema.properties.age.minimum: ...``). Log-probabilities stay
the model's raw ones, masked tokens included.

*Tools* (chat, ``serving.tool_calls``): ``tools`` (OpenAI's function list),
``tool_choice`` (``"none"``, ``"auto"``: the default with tools, ``"required"`` or
``{"type": "function", "function": {"name"}}``) and ``parallel_tool_calls`` (a boolean,
accepted; a constrained call is always one call). The tools are rendered by the chat
template in its family's tool format (a template without one, e.g. the plain format, makes
``tools`` a 400); ``"none"`` renders none. ``"required"`` or a named function constrains the
answer to one call of the chosen function(s) whose arguments match its ``parameters`` schema
(with ``response_format`` also constraining, a 400 naming ``tool_choice``). Unless the
choice is ``"none"``, the finished answer is read for calls in the template's format (then
the others): when there are any, the message is ``{"role": "assistant", "content": <the text
left around them, or null>, "tool_calls": [{"id", "type": "function", "function": {"name",
"arguments": <JSON text>}}]}`` with ``finish_reason`` ``"tool_calls"``; an answer with a
malformed call stays plain content. Streamed with tools active, each choice's answer is held
back until it ends, then sent as its role chunk, one content delta (when there is content),
one ``tool_calls`` delta (each call with its ``index``) and the finish chunk, so that a
streamed answer says what the whole one says. Messages may be ``tool`` results (with
``tool_call_id``) and assistant turns with ``tool_calls`` (``content`` null or absent).
Errors in these fields name the field (``tools[0].function.parameters.properties.x.type``,
``tool_choice.function.name``, ``messages[2].tool_calls[0].function.arguments``).

Any other field is a 400, as is a value of the wrong JSON type or outside its domain.
"""

from __future__ import annotations

import codecs
import math
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..native._errors import RiftcoTransformerError
from ..native._validation import describe_value
from ._text import lenient_utf8
from .chat import chat_prompt
from .chat_templates import ChatTemplateError
from .generation import (
    MAXIMUM_TOP_LOGPROBS,
    GenerationConfig,
    GenerationResult,
    TokenEvent,
    TokenLogprob,
    choice_seed,
)
from .structured_output import Grammar, SchemaError, response_format_grammar
from .tool_calls import (
    ToolError,
    ToolSpec,
    parse_tool_calls,
    parse_tool_choice,
    parse_tools,
    template_tools,
    tool_call_grammar,
)

OPENAI_FINISH_REASONS = {"length": "length", "stop": "stop", "end_token": "stop",
                         "tool_calls": "tool_calls"}
MAXIMUM_STOP_SEQUENCES = 16
MAXIMUM_COMPLETION_LOGPROBS = 5  # OpenAI's bound on /v1/completions' logprobs


class ApiError(Exception):
    """An HTTP error answer: ``status`` and an OpenAI-style error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class ApiRequest:
    """A generation request of any route, validated."""

    route: str  # "generate", "completion" or "chat"
    # The text to encode; a chat request's token ids (chat_prompt: control tokens come from
    # the chat template only, never from what a message says), or its rendered text when the
    # tokenizer has no control tokens.
    prompt: str | tuple[int, ...]
    config: GenerationConfig
    stream: bool
    include_usage: bool = False
    # The prompt's token ids when parsing counted them (for the max_tokens limit).
    prompt_ids: tuple[int, ...] | None = None
    n: int = 1  # choices
    echo: bool = False  # completions: the prompt before each choice's text
    # Chat with tools: the functions offered, tool_choice ("none", "auto", "required" or
    # "function:NAME") and the chat template's tool format (how calls are read back).
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "none"
    tool_format: str | None = None

    @property
    def reads_tool_calls(self) -> bool:
        """Whether answers are read for tool calls (tools offered, tool_choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"

    def choice_configs(self) -> list[GenerationConfig]:
        """One config per choice: choice ``i`` samples with ``choice_seed(seed, i)``."""
        return [self.config.replace(seed=choice_seed(self.config.seed, index))
                for index in range(self.n)]


# ---- JSON field rules -------------------------------------------------------------------------


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _reject_unknown(body: Mapping, allowed: frozenset[str], route: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"{route} does not accept the field(s) {', '.join(unknown)}",
                       param=unknown[0], code="unknown_field")


def _integer(body: Mapping, name: str, default, minimum: int = 0):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"{name} must be an integer, got {describe_value(value)}")
    if value < minimum:
        raise _bad(name, f"{name} must be at least {minimum}, got {value}")
    return value


def _number(body: Mapping, name: str, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, f"{name} must be a number, got {describe_value(value)}")
    return float(value)


def _boolean(body: Mapping, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"{name} must be true or false, got {describe_value(value)}")
    return value


def _string(body: Mapping, name: str, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"{name} is required", param=name, code="missing_field")
        return None
    if not isinstance(value, str):
        raise _bad(name, f"{name} must be a string, got {describe_value(value)}")
    return value


def _stop(body: Mapping) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    sequences = [value] if isinstance(value, str) else value
    if not isinstance(sequences, list) or not all(isinstance(s, str) and s for s in sequences):
        raise _bad("stop", "stop must be a nonempty string or a list of nonempty strings")
    if len(sequences) > MAXIMUM_STOP_SEQUENCES:
        raise _bad("stop", f"stop holds {len(sequences)} sequences; at most "
                           f"{MAXIMUM_STOP_SEQUENCES} are allowed")
    return tuple(sequences)


def _neutral_only(body: Mapping, neutral: Mapping[str, tuple]) -> None:
    """Fields this server does not implement, accepted only at values that change nothing."""
    for name, accepted in neutral.items():
        if name in body and body[name] not in accepted:
            raise ApiError(
                400, f"{name}={describe_value(body[name])} is not supported by this server "
                     f"(accepted: {', '.join(map(repr, accepted))})",
                param=name, code="unsupported_value")


def _check_model(body: Mapping, service) -> None:
    model = _string(body, "model", required=False)
    if model is not None and model != service.model_name:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves "
                            f"{service.model_name!r}", param="model", code="model_not_found")


def _stream_options(body: Mapping, stream: bool) -> bool:
    """Whether a streamed answer ends with a usage chunk (``stream_options.include_usage``)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise _bad("stream_options", "stream_options is only allowed with stream: true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise _bad("stream_options", "stream_options must be an object with include_usage")
    return _boolean(options, "include_usage", False)


def _penalties(body: Mapping) -> dict:
    """``presence_penalty`` and ``frequency_penalty`` (in [-2, 2], OpenAI's range) and
    ``min_p`` (in [0, 1]), each a 400 naming the field outside its range."""
    fields = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(body, name, 0.0)
        if not -2.0 <= value <= 2.0:
            raise _bad(name, f"{name} must be between -2 and 2, got {value!r}")
        fields[name] = value
    min_p = _number(body, "min_p", None)
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise _bad("min_p", f"min_p must be between 0 and 1, got {min_p!r}")
    fields["min_p"] = min_p or None  # 0: no filter
    return fields


def _config(service, *, max_new_tokens, temperature, top_k, top_p, seed, stop,
            repetition_penalty, **penalties) -> GenerationConfig:
    """The service's GenerationConfig; its ValueError/TypeError become 400 answers."""
    if temperature is not None and not math.isfinite(temperature):
        raise _bad("temperature", f"temperature must be finite, got {temperature!r}")
    try:
        return service.generation_config(
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, stop=stop, repetition_penalty=repetition_penalty, **penalties,
        )
    except (TypeError, ValueError) as error:
        message = str(error)  # the config's messages start with the field they concern
        field = message.split(" ", 1)[0].split("[", 1)[0]
        param = field if field in _CONFIG_FIELDS else None
        raise ApiError(400, message, param=param, code="invalid_value") from None


_CONFIG_FIELDS = frozenset({"max_new_tokens", "temperature", "top_k", "top_p",
                            "repetition_penalty", "seed", "stop", "presence_penalty",
                            "frequency_penalty", "min_p"})


def _random_seed() -> int:
    return secrets.randbits(63)


# ---- the three routes -------------------------------------------------------------------------

_GENERATE_FIELDS = frozenset({"prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                              "seed", "stop", "stream", "repetition_penalty",
                              "presence_penalty", "frequency_penalty", "min_p"})


def parse_generate(body: Mapping, service) -> ApiRequest:
    _reject_unknown(body, _GENERATE_FIELDS, "/v1/generate")
    prompt = _string(body, "prompt", required=True)
    stream = _boolean(body, "stream", False)
    config = _config(
        service,
        max_new_tokens=_integer(body, "max_new_tokens", 32),
        temperature=_number(body, "temperature", 0.0),
        top_k=_integer(body, "top_k", None, 1),
        top_p=_number(body, "top_p", None),
        seed=_integer(body, "seed", 0),
        stop=_stop(body),
        repetition_penalty=_number(body, "repetition_penalty", 1.0),
        **_penalties(body),
    )
    return ApiRequest("generate", prompt, config, stream)


_OPENAI_SAMPLING_FIELDS = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k",
                                     "n", "stream", "stream_options", "stop", "seed", "user",
                                     "presence_penalty", "frequency_penalty", "logit_bias",
                                     "repetition_penalty", "min_p"})
_COMPLETION_FIELDS = _OPENAI_SAMPLING_FIELDS | {"prompt", "echo", "logprobs", "best_of",
                                                "suffix"}
_CHAT_FIELDS = _OPENAI_SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs",
                                          "top_logprobs", "response_format", "tools",
                                          "tool_choice", "parallel_tool_calls"}
_NEUTRAL_SAMPLING = {"logit_bias": (None, {})}


def _encode(service, prompt, param: str) -> tuple[int, ...]:
    try:
        return tuple(service.encode(prompt))
    except (TypeError, ValueError) as error:
        raise ApiError(400, str(error), param=param, code="invalid_value") from None


def _max_tokens(service, requested: int | None, prompt_tokens: int, param: str) -> int:
    """A request's ``max_tokens``: ``requested`` (None: the default) within the limit, which
    is what the context leaves after the prompt, or the server's ``maximum_new_tokens``
    when it sets one (a stream then rolls over past the context)."""
    context = service.maximum_context
    remaining = context - prompt_tokens
    cap = service.config.maximum_new_tokens
    if cap is None:
        if remaining < 1:
            raise ApiError(400, f"the prompt has {prompt_tokens} tokens, which leaves no "
                                f"room in the model's context of {context} tokens",
                           param=param, code="context_length_exceeded")
        limit, why = remaining, (f"the model's context holds {context} tokens and the prompt "
                                 f"takes {prompt_tokens}")
    else:
        limit, why = cap, "this server's limit per request"
    if requested is None:
        return min(limit, remaining) if remaining > 0 else limit
    if requested > limit:
        raise ApiError(400, f"max_tokens is {requested}, but at most {limit} tokens can be "
                            f"generated for this prompt ({why})",
                       param="max_tokens", code="invalid_value")
    return requested


def _openai_config(body: Mapping, service, max_tokens: int) -> GenerationConfig:
    temperature = _number(body, "temperature", 1.0)
    top_p = _number(body, "top_p", None)
    if top_p == 1.0:
        top_p = None  # OpenAI's default: no nucleus truncation
    seed = _integer(body, "seed", None)
    config = _config(
        service, max_new_tokens=max_tokens, temperature=temperature,
        top_k=_integer(body, "top_k", None, 1), top_p=top_p,
        seed=_random_seed() if seed is None else seed, stop=_stop(body),
        repetition_penalty=_number(body, "repetition_penalty", 1.0),
        **_penalties(body),
    )
    return config.replace(end_token_ids=service.end_token_ids)


def _choice_count(body: Mapping, service) -> int:
    """``n``: at least 1, at most ``max_active_requests`` (the choices run at once)."""
    count = _integer(body, "n", 1, 1)
    limit = service.config.max_active_requests
    if count > limit:
        raise _bad("n", f"n must be at most {limit} here (a request's choices run at once, "
                        f"and this server runs at most {limit} requests at once: "
                        f"max_active_requests), got {count}")
    return count


def _best_of(body: Mapping, count: int) -> None:
    """``best_of`` is accepted only where it changes nothing: null, or equal to ``n``."""
    value = body.get("best_of")
    if value is None or (isinstance(value, int) and not isinstance(value, bool)
                         and value == count):
        return
    raise ApiError(400, f"best_of={describe_value(value)} is not supported by this server "
                        f"(accepted: null, or n = {count})",
                   param="best_of", code="unsupported_value")


def _completion_logprobs(body: Mapping) -> int | None:
    count = _integer(body, "logprobs", None)
    if count is not None and count > MAXIMUM_COMPLETION_LOGPROBS:
        raise _bad("logprobs", f"logprobs must be at most {MAXIMUM_COMPLETION_LOGPROBS}, got "
                               f"{count}")
    return count


def _chat_logprobs(body: Mapping) -> int | None:
    """The count of alternatives per token (``top_logprobs``, 0 by default) when
    ``logprobs`` is true, else None."""
    wanted = _boolean(body, "logprobs", False)
    top = _integer(body, "top_logprobs", None)
    if top is not None and not wanted:
        raise _bad("top_logprobs", f"top_logprobs={top} needs logprobs: true")
    if top is not None and top > MAXIMUM_TOP_LOGPROBS:
        raise _bad("top_logprobs", f"top_logprobs must be at most {MAXIMUM_TOP_LOGPROBS}, "
                                   f"got {top}")
    return (top or 0) if wanted else None


def parse_completion(body: Mapping, service) -> ApiRequest:
    _reject_unknown(body, _COMPLETION_FIELDS, "/v1/completions")
    _check_model(body, service)
    _neutral_only(body, {**_NEUTRAL_SAMPLING, "suffix": (None,)})
    count = _choice_count(body, service)
    _best_of(body, count)
    logprobs = _completion_logprobs(body)
    echo = _boolean(body, "echo", False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("prompt", "prompt must be a string (or a list of exactly one string)")
    stream = _boolean(body, "stream", False)
    include_usage = _stream_options(body, stream)
    _string(body, "user", required=False)
    requested = _integer(body, "max_tokens", None)
    prompt_ids = _encode(service, prompt, "prompt")
    max_tokens = _max_tokens(service, requested, len(prompt_ids), "prompt")
    scores_prompt = echo and logprobs is not None
    if scores_prompt and len(prompt_ids) > service.maximum_context:
        raise _bad("echo", f"echo with logprobs scores every prompt token, so the prompt must "
                           f"fit the model's context of {service.maximum_context} tokens; it "
                           f"has {len(prompt_ids)}")
    config = _openai_config(body, service, max_tokens).replace(
        logprobs=logprobs, prompt_logprobs=scores_prompt)
    return ApiRequest("completion", prompt, config, stream, include_usage, prompt_ids,
                      count, echo)


def _message_content(message: Mapping, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str) and set(part) <= {"type", "text"}):
                raise _bad(f"messages[{index}].content",
                           "content parts must be {\"type\": \"text\", \"text\": ...} objects")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{index}].content",
               "content must be a string or a list of text parts")


def _message_tool_calls(value: object, where: str) -> list[dict]:
    """An assistant message's ``tool_calls``: a nonempty list of ``{"id", "type":
    "function", "function": {"name", "arguments"}}`` (``arguments`` the call's JSON text)."""
    if not isinstance(value, list) or not value:
        raise _bad(where, f"{where} must be a nonempty list of tool calls, got "
                          f"{describe_value(value)}")
    calls = []
    for index, call in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(call, dict):
            raise _bad(at, f"{at} must be an object, got {describe_value(call)}")
        unknown = sorted(set(call) - {"id", "type", "function"})
        if unknown:
            raise _bad(f"{at}.{unknown[0]}", f"{at} does not accept {', '.join(unknown)}")
        if call.get("type", "function") != "function":
            raise _bad(f"{at}.type", f"{at}.type must be 'function', got "
                                     f"{describe_value(call.get('type'))}")
        identifier = call.get("id", "")
        if not isinstance(identifier, str):
            raise _bad(f"{at}.id", f"{at}.id must be a string, got {describe_value(identifier)}")
        function = call.get("function")
        if not isinstance(function, dict) or set(function) - {"name", "arguments"}:
            raise _bad(f"{at}.function", f"{at}.function must be an object with name and "
                                         f"arguments, got {describe_value(function)}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{at}.function.name", f"{at}.function.name must be a nonempty string, "
                                              f"got {describe_value(name)}")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise _bad(f"{at}.function.arguments", f"{at}.function.arguments must be a string "
                                                   f"(the arguments as JSON text), got "
                                                   f"{describe_value(arguments)}")
        calls.append({"id": identifier, "type": "function",
                      "function": {"name": name, "arguments": arguments}})
    return calls


def parse_chat_messages(messages) -> list[dict]:
    """OpenAI chat messages as ``[{role, content}]`` (``developer`` counts as ``system``),
    with an assistant's ``tool_calls`` (its ``content`` may then be null or absent) and a
    tool result's ``tool_call_id``."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "messages must be a nonempty list of message objects")
    parsed = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _bad(where, "each message must be an object")
        unknown = sorted(set(message) - {"role", "content", "name", "tool_calls",
                                         "tool_call_id"})
        if unknown:
            raise _bad(where, f"{where} does not accept {', '.join(unknown)}")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise _bad(f"{where}.role", f"role must be system, developer, user, assistant or "
                                        f"tool, got {describe_value(role)}")
        entry: dict = {"role": role}
        if "tool_calls" in message:
            if role != "assistant":
                raise _bad(f"{where}.tool_calls", f"only an assistant message has tool_calls, "
                                                  f"not a {role} message")
            entry["tool_calls"] = _message_tool_calls(message["tool_calls"],
                                                      f"{where}.tool_calls")
        if "tool_call_id" in message:
            identifier = message["tool_call_id"]
            if role != "tool":
                raise _bad(f"{where}.tool_call_id", f"only a tool message has a tool_call_id, "
                                                    f"not a {role} message")
            if not isinstance(identifier, str):
                raise _bad(f"{where}.tool_call_id", f"{where}.tool_call_id must be a string, "
                                                    f"got {describe_value(identifier)}")
            entry["tool_call_id"] = identifier
        if "tool_calls" in entry and message.get("content") is None:
            entry["content"] = ""
        else:
            entry["content"] = _message_content(message, index)
        parsed.append(entry)
    return parsed


def _response_format(body: Mapping) -> Grammar | None:
    """``response_format``'s grammar (None: plain text); a 400 naming the JSON path of what
    cannot be compiled."""
    try:
        return response_format_grammar(body.get("response_format"))
    except SchemaError as error:
        raise _bad("response_format", str(error)) from None


def _tools(body: Mapping, service) -> tuple[tuple[ToolSpec, ...], str, str | None]:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls``: the tools offered, the choice
    (``"none"``, ``"auto"``, ``"required"`` or ``"function:NAME"``) and the chat template's
    tool format (None when no tools are offered)."""
    _boolean(body, "parallel_tool_calls", True)
    try:
        specs = parse_tools(body["tools"]) if body.get("tools") is not None else ()
        choice = parse_tool_choice(body.get("tool_choice"), specs)
    except ToolError as error:
        raise _bad(error.param, str(error)) from None
    if not specs:
        return (), choice, None
    tool_format = getattr(service.chat_template, "tool_format", None)
    if tool_format is None:
        raise _bad("tools", f"this server's chat template ({type(service.chat_template).__name__}) "
                            f"has no tool format, so it cannot offer tools to the model")
    return specs, choice, tool_format


def parse_chat(body: Mapping, service) -> ApiRequest:
    _reject_unknown(body, _CHAT_FIELDS, "/v1/chat/completions")
    _check_model(body, service)
    _neutral_only(body, _NEUTRAL_SAMPLING)
    count = _choice_count(body, service)
    logprobs = _chat_logprobs(body)
    messages = parse_chat_messages(body.get("messages"))
    stream = _boolean(body, "stream", False)
    include_usage = _stream_options(body, stream)
    _string(body, "user", required=False)
    grammar = _response_format(body)
    specs, choice, tool_format = _tools(body, service)
    if choice == "required" or choice.startswith("function:"):
        if grammar is not None:
            raise _bad("tool_choice", f"tool_choice {describe_value(body.get('tool_choice'))} "
                                      f"constrains the answer to a tool call, and "
                                      f"response_format to its JSON: both cannot hold; drop "
                                      f"one of them")
        try:
            grammar = tool_call_grammar(specs, choice, tool_format)
        except ToolError as error:
            raise _bad(error.param, str(error)) from None
    requested = _integer(body, "max_completion_tokens", None)
    if requested is None:
        requested = _integer(body, "max_tokens", None)
    prompt = _chat_prompt(service, messages, template_tools(specs, choice))
    prompt_ids = prompt if isinstance(prompt, tuple) else _encode(service, prompt, "messages")
    max_tokens = _max_tokens(service, requested, len(prompt_ids), "messages")
    config = service.chat_config(_openai_config(body, service, max_tokens)).replace(
        logprobs=logprobs, grammar=grammar)
    return ApiRequest("chat", prompt, config, stream, include_usage, prompt_ids, count,
                      tools=specs, tool_choice=choice, tool_format=tool_format)


def _chat_prompt(service, messages: list[dict], tools: list[dict] | None = None
                 ) -> str | tuple[int, ...]:
    """A chat request's prompt in the service's chat template, through
    :func:`~.chat.chat_prompt`: token ids in which a message's content (and every string of
    the tools and tool calls) is always plain text (or the rendered text, for a tokenizer
    without control tokens). What the template or the tokenizer refuses is a 400 naming
    ``messages``; a ChatTemplateError (the template's ``raise_exception``, a limit of its
    rendering, an error of its code) has the code ``chat_template_error``."""
    try:
        prompt = chat_prompt(service.chat_template, service.tokenizer, messages, tools=tools)
    except ChatTemplateError as error:
        raise ApiError(400, str(error), param="messages", code="chat_template_error") from None
    except RiftcoTransformerError as error:
        raise _bad("messages", f"the tokenizer cannot encode the conversation "
                               f"({error.detail})") from None
    except (TypeError, ValueError) as error:
        raise _bad("messages", str(error)) from None
    return prompt if isinstance(prompt, str) else tuple(prompt)


# ---- responses ---------------------------------------------------------------------------------


def usage(result: GenerationResult) -> dict:
    return choices_usage([result])


def choices_usage(results: list[GenerationResult]) -> dict:
    """The prompt counted once, every choice's generated tokens summed."""
    prompt = len(results[0].prompt_token_ids)
    completion = sum(len(result.generated_token_ids) for result in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def generate_response(service, request: ApiRequest, result: GenerationResult) -> dict:
    return {
        "model": service.model_name,
        "artifact_id": None,
        "prompt": request.prompt,
        "text": result.text,
        "generated_text": result.generated_text,
        "prompt_token_ids": list(result.prompt_token_ids),
        "generated_token_ids": list(result.generated_token_ids),
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "stop_sequence": result.stop_sequence,
        "usage": usage(result),
    }


def _shown_logprobs(result: GenerationResult) -> tuple[TokenLogprob, ...]:
    """The generated tokens' log-probabilities an answer lists: all but an end token's."""
    scored = result.logprobs or ()
    return scored[:-1] if result.finish_reason == "end_token" else scored


class _CompletionLogprobs:
    """OpenAI's legacy logprobs object for one choice, built in token order: a streamed
    choice's chunks continue the text offsets of its earlier ones."""

    def __init__(self, service) -> None:
        self._service = service
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._offset = 0

    def _text(self, token_id: int) -> str:
        return lenient_utf8(self._service.token_bytes(token_id))

    def add(self, tokens: list[tuple[int, TokenLogprob | None]]) -> dict:
        """The object for ``(token id, its log-probability or None)`` pairs."""
        texts, logprobs, tops, offsets = [], [], [], []
        for token_id, scored in tokens:
            data = self._service.token_bytes(token_id)
            texts.append(lenient_utf8(data))
            offsets.append(self._offset)
            self._offset += len(self._decoder.decode(data))
            if scored is None:
                logprobs.append(None)
                tops.append(None)
                continue
            logprobs.append(scored.logprob)
            top: dict[str, float] = {}
            for alternative, logprob in scored.top:
                top.setdefault(self._text(alternative), logprob)
            top.setdefault(texts[-1], scored.logprob)
            tops.append(top)
        return {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops,
                "text_offset": offsets}


class OpenAIStream:
    """The identity of one OpenAI answer (id, creation time, model) and its bodies, whole or
    streamed (the chunks of each choice, in the order its events come)."""

    def __init__(self, service, request: ApiRequest) -> None:
        self.chat = request.route == "chat"
        prefix = "chatcmpl" if self.chat else "cmpl"
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model = service.model_name
        self._service = service
        self._request = request
        self._logprobs = request.config.logprobs is not None
        self._echo_pending: set[int] = set(range(request.n)) if request.echo else set()
        self._builders: dict[int, _CompletionLogprobs] = {}
        # Streamed chat with tools: each choice's answer is held back until it ends.
        self._holds_answers = self.chat and request.reads_tool_calls

    def _envelope(self, object_name: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created,
                "model": self.model, "choices": choices, **extra}

    # ---- log-probabilities ----------------------------------------------------------------

    def _chat_token(self, token_id: int, logprob: float) -> dict:
        data = self._service.token_bytes(token_id)
        return {"token": lenient_utf8(data), "logprob": logprob, "bytes": list(data)}

    def _chat_logprobs(self, scored) -> dict:
        return {"content": [
            {**self._chat_token(entry.token_id, entry.logprob),
             "top_logprobs": [self._chat_token(token, logprob) for token, logprob in entry.top]}
            for entry in scored], "refusal": None}

    def _builder(self, index: int) -> _CompletionLogprobs:
        if index not in self._builders:
            self._builders[index] = _CompletionLogprobs(self._service)
        return self._builders[index]

    def _prompt_text(self) -> str:
        return self._service.prompt_text(self._request.prompt_ids)

    def _prompt_pairs(self, scores) -> list[tuple[int, TokenLogprob | None]]:
        ids = self._request.prompt_ids
        return list(zip(ids, scores or (None,) * len(ids), strict=True))

    # ---- tool calls -------------------------------------------------------------------------

    def _answer(self, result: GenerationResult) -> tuple[str | None, tuple[dict, ...], str]:
        """A chat choice's ``content``, ``tool_calls`` and OpenAI ``finish_reason``: the calls
        read out of the answer when tools are active and it has any (``"tool_calls"``)."""
        request = self._request
        if request.reads_tool_calls:
            parsed = parse_tool_calls(result.generated_text, request.tools,
                                      request.tool_format or "hermes")
            if parsed.tool_calls:
                return parsed.content, parsed.tool_calls, "tool_calls"
        return result.generated_text, (), OPENAI_FINISH_REASONS[result.finish_reason]

    # ---- whole answers ----------------------------------------------------------------------

    def response(self, results: list[GenerationResult] | GenerationResult) -> dict:
        if isinstance(results, GenerationResult):
            results = [results]
        choices = []
        for index, result in enumerate(results):
            finish = OPENAI_FINISH_REASONS[result.finish_reason]
            if self.chat:
                logprobs = (self._chat_logprobs(_shown_logprobs(result)) if self._logprobs
                            else None)
                content, calls, finish = self._answer(result)
                message = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = list(calls)
                choices.append({"index": index, "message": message, "logprobs": logprobs,
                                "finish_reason": finish})
                continue
            text, logprobs = result.generated_text, None
            if self._request.echo:
                text = result.prompt_text + text
            if self._logprobs:
                pairs = self._prompt_pairs(result.prompt_logprobs) if self._request.echo else []
                pairs += [(entry.token_id, entry) for entry in _shown_logprobs(result)]
                logprobs = _CompletionLogprobs(self._service).add(pairs)
            choices.append({"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": finish})
        object_name = "chat.completion" if self.chat else "text_completion"
        return self._envelope(object_name, choices, usage=choices_usage(results))

    # ---- streamed answers -------------------------------------------------------------------

    def chunk(self, text: str | None, finish_reason: str | None = None, *,
              role: bool = False, index: int = 0, logprobs: dict | None = None,
              tool_calls: tuple[dict, ...] = ()) -> dict:
        """One streamed chunk of choice ``index``: a text delta (with its tokens'
        ``logprobs`` object), the opening role (chat), the tool calls (chat: each with its
        ``index``), or the finish."""
        finish = None if finish_reason is None else OPENAI_FINISH_REASONS[finish_reason]
        if self.chat:
            delta = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": position, **call}
                                       for position, call in enumerate(tool_calls)]
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": finish}
        return self._envelope("text_completion", [choice])

    def opening_chunks(self) -> list[dict]:
        """What a streamed answer starts with: each chat choice's role (when answers are
        held back, each choice's role comes with its answer)."""
        if not self.chat or self._holds_answers:
            return []
        return [self.chunk("", role=True, index=index) for index in range(self._request.n)]

    def _echo_chunks(self, index: int, prompt_scores) -> list[dict]:
        if index not in self._echo_pending:
            return []
        self._echo_pending.discard(index)
        logprobs = (self._builder(index).add(self._prompt_pairs(prompt_scores))
                    if self._logprobs else None)
        return [self.chunk(self._prompt_text(), index=index, logprobs=logprobs)]

    def event_chunks(self, index: int, event: TokenEvent) -> list[dict]:
        """The chunks of choice ``index``'s token event (none when it releases no text and
        carries no log-probability to list, or while answers are held back)."""
        if self._holds_answers:
            return []
        chunks = self._echo_chunks(index, event.prompt_logprobs)
        shown = self._logprobs and event.logprob is not None and (
            event.finish_reason != "end_token")
        if not (event.text or shown):
            return chunks
        logprobs = None
        if shown and self.chat:
            logprobs = self._chat_logprobs([event.logprob])
        elif shown:
            logprobs = self._builder(index).add([(event.token_id, event.logprob)])
        chunks.append(self.chunk(event.text, index=index, logprobs=logprobs))
        return chunks

    def finish_chunks(self, index: int, result: GenerationResult) -> list[dict]:
        """Choice ``index``'s last chunks (its echo first, when no event brought it); a held
        back answer whole: its role, its content (when any), its tool calls (when any), then
        the finish, the log-probabilities with the first delta after the role."""
        if self._holds_answers:
            return self._held_answer_chunks(index, result)
        return [*self._echo_chunks(index, result.prompt_logprobs),
                self.chunk(None, result.finish_reason, index=index)]

    def _held_answer_chunks(self, index: int, result: GenerationResult) -> list[dict]:
        content, calls, finish = self._answer(result)
        logprobs = self._chat_logprobs(_shown_logprobs(result)) if self._logprobs else None
        chunks = [self.chunk("", role=True, index=index)]
        if content:
            chunks.append(self.chunk(content, index=index, logprobs=logprobs))
            logprobs = None
        if calls:
            chunks.append(self.chunk(None, index=index, logprobs=logprobs, tool_calls=calls))
            logprobs = None
        if logprobs is not None and logprobs["content"]:
            chunks[0]["choices"][0]["logprobs"] = logprobs
        chunks.append(self.chunk(None, finish, index=index))  # an OpenAI reason maps to itself
        return chunks

    def usage_chunk(self, results: list[GenerationResult] | GenerationResult) -> dict:
        if isinstance(results, GenerationResult):
            results = [results]
        object_name = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(object_name, [], usage=choices_usage(results))
