"""Function calling: OpenAI's ``tools`` and ``tool_choice`` into a chat template, and the
model's tool calls out of its text.

* :func:`parse_tools` and :func:`parse_tool_choice` validate the request's fields (a
  :class:`ToolError`, a ValueError naming the field, e.g. ``tools[0].function.name``);
  :func:`template_tools` is the list a chat template renders (``chat_prompt(...,
  tools=...)``); ``tool_choice`` ``"none"`` renders no tools.
* Each family's tool format (:data:`TOOL_FORMATS`), which the family's chat template
  (:attr:`~.chat_templates.PretrainedChatTemplate.tool_format`) announces:

  - ``"hermes"`` (ChatML: Qwen 2/2.5/3, Hermes, SmolLM; and the families without a
    format of their own, Llama 2, Gemma, Phi-3, whose built-in renderers describe the tools
    in the system text): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
    one block per call; results come back in ``<tool_response>`` blocks of a user turn;
  - ``"llama3"`` (Llama 3.1+): the whole answer is ``{"name": ..., "parameters": {...}}``
    (a list of them, or a leading ``<|python_tag|>``, accepted too); results in turns of
    the role ``ipython``;
  - ``"mistral"`` (Mistral v0.3+): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``
    (the bare list accepted too); results in ``[TOOL_RESULTS]`` blocks.

* :func:`parse_tool_calls` reads a finished answer: OpenAI ``tool_calls`` entries (``id``
  ``call_`` and 24 random letters and digits, 9 of them for the Mistral format, whose
  templates require that; ``type`` function; ``function.name``; ``function.arguments`` as
  JSON text) and the content left around them. The family's format is tried first, then
  the others. An answer in which any call is not JSON, names a function not in ``tools``,
  or has arguments that are not a JSON object has no tool calls: its whole text stays the
  content (nothing half-parsed).
* With ``tool_choice`` ``"required"`` or a named function, :func:`tool_call_grammar`
  constrains decoding (:mod:`.structured_output`) to one call in the family's format whose
  arguments match the function's ``parameters`` schema; :func:`tool_call_schema` is that
  call's JSON schema.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..native._validation import describe_value
from .chat import ChatMessage
from .structured_output import Grammar, SchemaError, compile_schema

TOOL_FORMATS = ("hermes", "llama3", "mistral")
FAMILY_TOOL_FORMATS = {"chatml": "hermes", "llama2": "hermes", "llama3": "llama3",
                       "mistral": "mistral", "gemma": "hermes", "phi3": "hermes"}
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_ALPHANUMERIC = string.ascii_letters + string.digits


class ToolError(ValueError):
    """A ``tools`` or ``tool_choice`` field this server refuses; ``param`` names it
    (``tools[1].function.parameters.properties.x.type``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.detail = message


@dataclass(frozen=True)
class ToolSpec:
    """One function a request offers: ``name``, ``description`` (may be None) and its
    ``parameters`` schema (None: no parameters); ``index`` is its place in ``tools``."""

    name: str
    description: str | None
    parameters: Mapping | None
    index: int

    def as_tool(self) -> dict:
        """The OpenAI form a chat template renders."""
        function: dict = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = (copy.deepcopy(dict(self.parameters))
                                  if self.parameters is not None
                                  else {"type": "object", "properties": {}})
        return {"type": "function", "function": function}


def parse_tools(tools: object) -> tuple[ToolSpec, ...]:
    """OpenAI's ``tools``: a nonempty list of ``{"type": "function", "function": {"name",
    "description"?, "parameters"?, "strict"?}}`` with distinct names of 1 to 64 letters,
    digits, ``_`` or ``-``. Errors name the field."""
    if not isinstance(tools, list) or not tools:
        raise ToolError("tools", f"must be a nonempty list of tools, not {describe_value(tools)}")
    specs = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise ToolError(where, f"must be an object, not {describe_value(tool)}")
        unknown = sorted(set(tool) - {"type", "function"})
        if unknown:
            raise ToolError(f"{where}.{unknown[0]}", "is not a field of a tool")
        if tool.get("type") != "function":
            raise ToolError(f"{where}.type", f"must be 'function', not "
                                             f"{describe_value(tool.get('type'))}")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ToolError(f"{where}.function", f"must be an object, not "
                                                 f"{describe_value(function)}")
        unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError(f"{where}.function.{unknown[0]}", "is not a field of a function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolError(f"{where}.function.name", f"must be 1 to 64 letters, digits, _ or "
                                                      f"-, not {describe_value(name)}")
        if any(spec.name == name for spec in specs):
            raise ToolError(f"{where}.function.name", f"{name!r} names two tools")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ToolError(f"{where}.function.description",
                            f"must be a string, not {describe_value(description)}")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ToolError(f"{where}.function.parameters",
                            f"must be a JSON schema object, not {describe_value(parameters)}")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolError(f"{where}.function.strict",
                            f"must be true or false, not {describe_value(strict)}")
        specs.append(ToolSpec(name, description, parameters, index))
    return tuple(specs)


def parse_tool_choice(choice: object, tools: Sequence[ToolSpec]) -> str:
    """OpenAI's ``tool_choice``: ``"none"``, ``"auto"``, ``"required"`` or ``{"type":
    "function", "function": {"name": ...}}`` naming one of ``tools``; absent (None):
    ``"auto"`` with tools, ``"none"`` without. Returns ``"none"``, ``"auto"``,
    ``"required"`` or the function's name prefixed ``"function:"``."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ToolError("tool_choice", f"must be 'none', 'auto', 'required' or a function, "
                                           f"not {describe_value(choice)}")
        if choice != "none" and not tools:
            raise ToolError("tool_choice", f"{choice!r} needs tools")
        return choice
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or set(choice) != {
            "type", "function"}:
        raise ToolError("tool_choice", f"must be 'none', 'auto', 'required' or {{\"type\": "
                                       f"\"function\", \"function\": {{\"name\": ...}}}}, not "
                                       f"{describe_value(choice)}")
    function = choice["function"]
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(function, Mapping) or set(function) != {"name"}:
        raise ToolError("tool_choice.function", f"must be {{\"name\": ...}}, not "
                                                f"{describe_value(function)}")
    if not any(spec.name == name for spec in tools):
        raise ToolError("tool_choice.function.name", f"{describe_value(name)} is not one of "
                                                     f"the tools")
    return f"function:{name}"


def template_tools(tools: Sequence[ToolSpec], choice: str = "auto") -> list[dict] | None:
    """The ``tools`` a chat template renders (None when ``choice`` is ``"none"``)."""
    if choice == "none" or not tools:
        return None
    return [spec.as_tool() for spec in tools]


def new_call_id(tool_format: str = "hermes") -> str:
    """A fresh tool-call id: ``call_`` and 24 random letters and digits; 9 of them (no
    prefix) for the Mistral format, whose templates refuse other ids."""
    count = 9 if tool_format == "mistral" else 24
    letters = "".join(secrets.choice(_ALPHANUMERIC) for _ in range(count))
    return letters if tool_format == "mistral" else f"call_{letters}"


# ---- rendering: the built-in renderers' tool formats ------------------------------------------


def _tool_json(tool: Mapping, indent: int | None = None) -> str:
    return json.dumps(tool, ensure_ascii=False, indent=indent)


def _arguments_text(arguments: str) -> str:
    """A call's arguments as the JSON a transcript shows (as given when not JSON)."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def hermes_tools_text(tools: Sequence[Mapping]) -> str:
    """The system text describing ``tools`` in the ``<tool_call>`` format."""
    lines = "\n".join(_tool_json(tool) for tool in tools)
    return ("# Tools\n\nThese functions are available, each described by a JSON Schema "
            "signature between <tools> and </tools>:\n<tools>\n" + lines + "\n</tools>\n\n"
            "To call a function, answer with a JSON object of its name and arguments between "
            "<tool_call> and </tool_call>:\n<tool_call>\n{\"name\": <function name>, "
            "\"arguments\": <arguments as a JSON object>}\n</tool_call>")


def hermes_call_text(call) -> str:
    return (f'<tool_call>\n{{"name": {json.dumps(call.name, ensure_ascii=False)}, '
            f'"arguments": {_arguments_text(call.arguments)}}}\n</tool_call>')


def hermes_turns(turns: Sequence[ChatMessage], tools: Sequence[Mapping] | None,
                 default_system: str | None = None) -> list[ChatMessage]:
    """``turns`` in the ``<tool_call>`` format as plain system/user/assistant turns: the
    tools described at the end of the system message (one is made when there is none,
    holding ``default_system`` first when given), each assistant's calls after its content,
    and consecutive tool results as one user turn of ``<tool_response>`` blocks."""
    out: list[ChatMessage] = []
    rest = list(turns)
    if tools:
        if rest and rest[0].role == "system":
            system = rest.pop(0).content
        else:
            system = default_system or ""
        described = hermes_tools_text(tools)
        out.append(ChatMessage("system", f"{system}\n\n{described}" if system else described))
    responses: list[str] = []
    for message in rest:
        if message.role == "tool":
            responses.append(f"<tool_response>\n{message.content}\n</tool_response>")
            continue
        if responses:
            out.append(ChatMessage("user", "\n".join(responses)))
            responses = []
        if message.tool_calls:
            calls = "\n".join(hermes_call_text(call) for call in message.tool_calls)
            content = f"{message.content}\n{calls}" if message.content else calls
            out.append(ChatMessage("assistant", content))
        else:
            out.append(ChatMessage(message.role, message.content))
    if responses:
        out.append(ChatMessage("user", "\n".join(responses)))
    return out


def llama3_tools_text(tools: Sequence[Mapping]) -> str:
    described = "\n\n".join(_tool_json(tool, indent=4) for tool in tools)
    return ("These functions are available, each described by a JSON Schema signature:\n\n"
            + described + "\n\nTo call one, answer with only a JSON object "
            '{"name": <function name>, "parameters": <arguments as a JSON object>}.\n\n')


def llama3_call_text(call) -> str:
    return (f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, '
            f'"parameters": {_arguments_text(call.arguments)}}}')


def llama3_turns(turns: Sequence[ChatMessage], tools: Sequence[Mapping] | None
                 ) -> list[tuple[str, str]]:
    """``(role, content)`` turns in the Llama 3.1 JSON format: the tools described before the
    first user message's content (or after the system message when there is no user
    message), each assistant's call as its content, tool results as ``ipython`` turns."""
    out = []
    described = llama3_tools_text(tools) if tools else ""
    for message in turns:
        if message.role == "tool":
            out.append(("ipython", message.content))
        elif message.tool_calls:
            calls = [llama3_call_text(call) for call in message.tool_calls]
            call_text = calls[0] if len(calls) == 1 else "[" + ", ".join(calls) + "]"
            out.append(("assistant", call_text))
        elif message.role == "user" and described:
            out.append(("user", described + message.content))
            described = ""
        else:
            out.append((message.role, message.content))
    if described:
        out.append(("user", described.rstrip("\n")))
    return out


def mistral_call_text(calls) -> str:
    items = []
    for call in calls:
        item = (f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": '
                f'{_arguments_text(call.arguments)}')
        if call.id:
            item += f', "id": {json.dumps(call.id, ensure_ascii=False)}'
        items.append(item + "}")
    return "[TOOL_CALLS] [" + ", ".join(items) + "]"


def mistral_render(turns: Sequence[ChatMessage], tools: Sequence[Mapping] | None,
                   bos: str, eos: str) -> str:
    """The Mistral v0.3 layout: the tools in ``[AVAILABLE_TOOLS]`` before the last user
    message, the system message before the first user message's content, calls as
    ``[TOOL_CALLS] [...]``, results as ``[TOOL_RESULTS] {...}[/TOOL_RESULTS]``."""
    system = turns[0].content if turns and turns[0].role == "system" else None
    rest = list(turns[1:] if system is not None else turns)
    last_user = max((index for index, message in enumerate(rest) if message.role == "user"),
                    default=-1)
    first_user = next((index for index, message in enumerate(rest) if message.role == "user"),
                      -1)
    parts = [bos]
    for index, message in enumerate(rest):
        if message.role == "user":
            if tools and index == last_user:
                listed = json.dumps(list(tools), ensure_ascii=False)
                parts.append(f"[AVAILABLE_TOOLS] {listed}[/AVAILABLE_TOOLS]")
            content = message.content
            if index == first_user and system is not None:
                content = f"{system}\n\n{content}"
            parts.append(f"[INST] {content} [/INST]")
        elif message.role == "tool":
            result = {"content": message.content}
            if message.tool_call_id:
                result["call_id"] = message.tool_call_id
            parts.append(f"[TOOL_RESULTS] {json.dumps(result, ensure_ascii=False)}"
                         f"[/TOOL_RESULTS]")
        elif message.tool_calls:
            parts.append(mistral_call_text(message.tool_calls) + eos)
        elif message.role == "assistant":
            parts.append(f"{message.content}{eos}")
        else:
            raise ValueError(f"Mistral chat: a {message.role} message can only come first")
    return "".join(parts)


def jinja_messages(turns: Sequence[ChatMessage]) -> list[dict]:
    """Messages as Hugging Face chat templates read them: ``tool_calls`` entries with
    ``function.arguments`` as an object when the JSON text is one (templates write it with
    ``tojson``), ``tool_call_id`` on tool results."""
    out = []
    for message in turns:
        entry: dict = {"role": message.role, "content": message.content}
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                try:
                    arguments = json.loads(call.arguments)
                except ValueError:
                    arguments = call.arguments
                calls.append({"id": call.id, "type": "function",
                              "function": {"name": call.name, "arguments": arguments}})
            entry["tool_calls"] = calls
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        out.append(entry)
    return out


# ---- parsing the answer -------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedAnswer:
    """An answer read for tool calls: ``content`` (None when nothing but calls is left) and
    ``tool_calls`` (OpenAI entries; empty when none was parsed)."""

    content: str | None
    tool_calls: tuple[dict, ...]


_DECODER = json.JSONDecoder()
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def _calls_of(value: object, names: frozenset[str], tool_format: str) -> list[dict] | None:
    """OpenAI entries for a parsed JSON call (an object or a list of them), or None when
    any is malformed or names an unknown function."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", item.get("parameters"))
        if "arguments" in item and "parameters" in item:
            return None
        if isinstance(arguments, str):  # arguments given as JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict) or item["name"] not in names:
            return None
        calls.append({"id": new_call_id(tool_format), "type": "function",
                      "function": {"name": item["name"],
                                   "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return calls


def _json_after(text: str, start: int):
    """The JSON value at ``text[start:]`` (after whitespace) and where it ends, or None."""
    position = start
    while position < len(text) and text[position].isspace():
        position += 1
    try:
        return _DECODER.raw_decode(text, position)
    except ValueError:
        return None


def _parse_hermes(text: str, names: frozenset[str]) -> ParsedAnswer | None:
    if "<tool_call>" not in text:
        return None
    calls: list[dict] = []
    for match in _HERMES_BLOCK.finditer(text):
        inner = match.group(1).strip()
        try:
            value = json.loads(inner)
        except ValueError:
            return None
        found = _calls_of(value, names, "hermes")
        if found is None:
            return None
        calls.extend(found)
    content = _HERMES_BLOCK.sub("", text).strip()
    return ParsedAnswer(content or None, tuple(calls))


def _parse_mistral(text: str, names: frozenset[str]) -> ParsedAnswer | None:
    marker = text.find("[TOOL_CALLS]")
    start = marker + len("[TOOL_CALLS]") if marker >= 0 else 0
    before = text[:marker] if marker >= 0 else ""
    if marker < 0 and not text.lstrip().startswith("["):
        return None
    decoded = _json_after(text, start)
    if decoded is None or text[decoded[1]:].strip():
        return None
    value = decoded[0]
    if not isinstance(value, list):
        return None
    calls = _calls_of(value, names, "mistral")
    if calls is None:
        return None
    return ParsedAnswer(before.strip() or None, tuple(calls))


def _parse_llama3(text: str, names: frozenset[str]) -> ParsedAnswer | None:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):]
    decoded = _json_after(body, 0)
    if decoded is None or body[decoded[1]:].strip():
        return None
    calls = _calls_of(decoded[0], names, "llama3")
    return None if calls is None else ParsedAnswer(None, tuple(calls))


_PARSERS = {"hermes": _parse_hermes, "llama3": _parse_llama3, "mistral": _parse_mistral}


def parse_tool_calls(text: str, tools: Sequence[ToolSpec],
                     tool_format: str = "hermes") -> ParsedAnswer:
    """The tool calls in a finished answer (see the module's description): the format
    ``tool_format`` first, then the others; no calls (and the whole text as the content)
    when none reads cleanly."""
    if tool_format not in _PARSERS:
        raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, not "
                         f"{describe_value(tool_format)}")
    names = frozenset(spec.name for spec in tools)
    if names:
        for name in (tool_format, *(other for other in TOOL_FORMATS if other != tool_format)):
            parsed = _PARSERS[name](text, names)
            if parsed is not None and parsed.tool_calls:
                return parsed
    return ParsedAnswer(text, ())


# ---- constrained tool calls -------------------------------------------------------------------


def _rebased(schema: object, pointer: str) -> object:
    """``schema`` with its local ``$ref`` pointers moved under ``pointer``."""
    if isinstance(schema, Mapping):
        out = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = "#" + pointer + value[1:]
            else:
                out[key] = _rebased(value, pointer)
        return out
    if isinstance(schema, list):
        return [_rebased(item, pointer) for item in schema]
    return schema


def _chosen(tools: Sequence[ToolSpec], choice: str) -> list[ToolSpec]:
    if choice == "required":
        return list(tools)
    if choice.startswith("function:"):
        return [spec for spec in tools if spec.name == choice[len("function:"):]]
    raise ValueError(f"a tool-call grammar needs tool_choice 'required' or a function, not "
                     f"{describe_value(choice)}")


def tool_call_schema(tools: Sequence[ToolSpec], choice: str,
                     tool_format: str = "hermes") -> dict:
    """The JSON schema of one call of the chosen function(s) (``choice``: ``"required"``,
    any of ``tools``; ``"function:NAME"``, that one): ``{"name": NAME, "arguments": {...}}``
    (``"parameters"`` for the Llama 3 format), the arguments matching the function's
    ``parameters`` (none given: ``{}``); for the Mistral format, a list of one or more."""
    key = "parameters" if tool_format == "llama3" else "arguments"
    chosen = _chosen(tools, choice)
    prefix = "/items" if tool_format == "mistral" else ""
    options = []
    for position, spec in enumerate(chosen):
        where = prefix + (f"/anyOf/{position}" if len(chosen) > 1 else "")
        parameters = spec.parameters
        if parameters is None:
            parameters = {"type": "object", "additionalProperties": False}
        options.append({
            "type": "object",
            "properties": {"name": {"const": spec.name},
                           key: _rebased(parameters, f"{where}/properties/{key}")},
            "required": ["name", key], "additionalProperties": False})
    call = options[0] if len(options) == 1 else {"anyOf": options}
    if tool_format == "mistral":
        return {"type": "array", "items": call, "minItems": 1}
    return call


_ENVELOPES = {"hermes": (b"<tool_call>\n", b"\n</tool_call>"), "llama3": (b"", b""),
              "mistral": (b"", b"")}


def tool_call_grammar(tools: Sequence[ToolSpec], choice: str,
                      tool_format: str = "hermes") -> Grammar:
    """The grammar of an answer that is exactly one call (:func:`tool_call_schema`) in the
    format: ``<tool_call>\\n...\\n</tool_call>`` (hermes), the bare JSON object (llama3) or
    the bare list (mistral: ``[TOOL_CALLS]`` is a control token, which no mask allows; the
    parser reads the bare list). A parameters schema that cannot compile is a ToolError
    naming it (``tools[0].function.parameters.properties.x.type``)."""
    if tool_format not in _ENVELOPES:
        raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, not "
                         f"{describe_value(tool_format)}")
    for spec in _chosen(tools, choice):
        if spec.parameters is not None:
            try:
                compile_schema(spec.parameters)
            except SchemaError as error:
                raise ToolError(f"tools[{spec.index}].function.parameters{error.path[1:]}",
                                error.detail) from None
    prefix, suffix = _ENVELOPES[tool_format]
    return compile_schema(tool_call_schema(tools, choice, tool_format), prefix=prefix,
                          suffix=suffix)
