"""Chat templates of pretrained models: ChatML (SmolLM, Qwen), Llama 2, Llama 3, Mistral,
Gemma and Phi-3.

A pretrained checkpoint carries its chat template as Jinja text (GGUF
``tokenizer.chat_template``, Hugging Face ``tokenizer_config.json``).
:class:`PretrainedChatTemplate` recognises the family from that text and renders
conversations with our own renderer for it; when ``jinja2`` happens to be importable it
renders the template text itself instead (in a sandbox), so model-specific details (default
system prompts, whitespace) come out exactly as the authors wrote them. The package never
depends on jinja2.

Both satisfy serving's ``ChatTemplate`` protocol: ``render(messages, add_generation_prompt)``
and ``stop_sequences``.

The template text comes with a model file, so it is untrusted:

* Recognising it is linear in its length, and a text longer than
  ``TemplateLimits.template_chars`` (64 Ki characters; real templates are under 20 Ki) is
  refused at load.
* jinja2 renders it in a sandbox with limits on time, steps, memory and output
  (:class:`TemplateLimits`); nothing of it runs at load.
* Whatever goes wrong in it (a syntax error, a limit, ``raise_exception``, an error of its
  code) is a :class:`ChatTemplateError`, a ValueError naming the template's source.
* Its control tokens are the only ones a conversation gets: :func:`~.chat.encode_chat`
  encodes what the messages say as plain text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..native._validation import describe_value
from . import tool_calls
from .chat import ChatMessage, chat_messages
from .tool_calls import FAMILY_TOOL_FORMATS


class ChatTemplateError(ValueError):
    """A chat template that cannot be loaded or rendered; the message names the template
    (where it came from, e.g. ``model.gguf (tokenizer.chat_template)``) and what failed (the
    limit reached, the error of its code)."""


@dataclass(frozen=True)
class TemplateLimits:
    """The resources a chat template's jinja2 rendering may use (the built-in renderers
    need no limits: they are linear in the conversation).

    * ``template_chars``: the template's text, checked at load whatever renders it (real
      templates are under 20 Ki characters; compiling dense markup takes about 8 µs per
      character).
    * ``output_chars``: the rendered text, and any single value the template builds (a
      list counts as the text it would print, parts it shares counted once per place).
    * ``produced_chars``: everything one rendering builds, summed (strings, list items,
      output pieces).
    * ``steps`` plus ``steps_per_message`` per message: loop iterations, calls, filters,
      the operators ``+ * ** %`` and output pieces.
    * ``cpu_seconds``: the rendering thread's CPU time.

    The defaults admit any real template rendering a conversation that fits a server's
    request (``maximum_request_bytes``, 1 MiB by default) and stop a hostile one within
    about a second.
    """

    template_chars: int = 1 << 16
    output_chars: int = 1 << 23
    produced_chars: int = 1 << 25
    steps: int = 100_000
    steps_per_message: int = 100
    cpu_seconds: float = 2.0

    def __post_init__(self) -> None:
        for name in ("template_chars", "output_chars", "produced_chars", "steps",
                     "steps_per_message"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {describe_value(value)}")
        seconds = self.cpu_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            math.isfinite(seconds) and seconds > 0
        ):
            raise ValueError(f"cpu_seconds must be finite and > 0, got {describe_value(seconds)}")

    def step_budget(self, message_count: int) -> int:
        """The steps a rendering of ``message_count`` messages may take."""
        return self.steps + self.steps_per_message * message_count


DEFAULT_TEMPLATE_LIMITS = TemplateLimits()


def _check_template_text(text: object, limits: TemplateLimits, source: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"template text must be a str, not {type(text).__name__}")
    if len(text) > limits.template_chars:
        raise ChatTemplateError(
            f"chat template {source} is {len(text):,} characters long, more than the limit "
            f"{limits.template_chars:,} (TemplateLimits.template_chars)")


def _shortened(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


CHAT_FAMILIES = ("chatml", "llama2", "llama3", "mistral", "gemma", "phi3")

_STOP_SEQUENCES = {
    "chatml": ("<|im_end|>",),
    "llama2": ("</s>",),
    "llama3": ("<|eot_id|>",),
    "mistral": ("</s>",),
    "gemma": ("<end_of_turn>",),
    "phi3": ("<|end|>",),
}


def detect_chat_family(template: str) -> str:
    """The family of a chat template's text, from the markers each family uses.

    ValueError for text that shows none of them (naming what was looked for)."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, not {type(template).__name__}")
    if "<|im_start|>" in template:
        return "chatml"
    if "<|start_header_id|>" in template:
        return "llama3"
    if "<start_of_turn>" in template:
        return "gemma"
    if "<|assistant|>" in template and "<|end|>" in template:
        return "phi3"
    if "[INST]" in template:
        return "llama2" if "<<SYS>>" in template else "mistral"
    raise ValueError(
        "unrecognised chat template: none of the markers <|im_start|> (ChatML), "
        "<|start_header_id|> (Llama 3), <start_of_turn> (Gemma), <|assistant|> with <|end|> "
        "(Phi-3) or [INST] (Llama 2 / Mistral) "
        f"appears in it (first 80 characters: {template[:80]!r})"
    )


def _default_chatml_system(template: str) -> str | None:
    """The system message a ChatML template inserts when the conversation has none: the
    text between the first ``<|im_start|>system`` followed by a newline (or the two
    characters ``\\n``) and the next ``<|im_end|>``. Linear in the template's length (one
    pass of ``str.find`` per step; a regular expression searching for the same thing
    rescanned the rest of the text from every ``<|im_start|>system``)."""
    if "messages[0]['role'] != 'system'" not in template.replace('"', "'"):
        return None
    marker = "<|im_start|>system"
    start = template.find(marker)
    while start >= 0:
        after = start + len(marker)
        newline = next((n for n in ("\\n", "\n") if template.startswith(n, after)), None)
        if newline is not None:
            end = template.find("<|im_end|>", after + len(newline))
            if end < 0:
                return None  # a later marker has no end after it either
            text = template[after + len(newline):end]
            break
        start = template.find(marker, after)
    else:
        return None
    if "{{" in text or "{%" in text:
        return None  # the system message is itself an expression: nothing fixed to insert
    return text.replace("\\n", "\n")


class PretrainedChatTemplate:
    """A pretrained model's chat template.

    ``PretrainedChatTemplate.from_text(text, bos_token=..., eos_token=...)`` detects the
    family; ``use_jinja`` None renders with jinja2 when it imports, True requires it, False
    always uses the built-in renderer of the family. ``PretrainedChatTemplate.for_family(name)``
    gives the built-in renderer of a family without any template text.

    ``source`` says where the text came from (``model.gguf (tokenizer.chat_template)``) for
    error messages; ``limits`` (:class:`TemplateLimits`) bound the text and its jinja2
    rendering. A text over ``limits.template_chars``, or one jinja2 cannot compile, is a
    :class:`ChatTemplateError` here; a rendering that fails (a limit, ``raise_exception``,
    any error of the template's code) is one from :meth:`render`.
    """

    def __init__(
        self,
        family: str,
        *,
        text: str | None = None,
        bos_token: str = "",
        eos_token: str = "",
        use_jinja: bool | None = None,
        source: str | None = None,
        limits: TemplateLimits | None = None,
    ) -> None:
        if family not in CHAT_FAMILIES:
            raise ValueError(f"family must be one of {', '.join(CHAT_FAMILIES)} (got {family!r})")
        if limits is None:
            limits = DEFAULT_TEMPLATE_LIMITS
        if not isinstance(limits, TemplateLimits):
            raise TypeError(f"limits must be a TemplateLimits, not {type(limits).__name__}")
        if source is not None and not isinstance(source, str):
            raise TypeError(f"source must be a str, not {type(source).__name__}")
        self._family = family
        self._source = source if source is not None else "(given as text)"
        self._limits = limits
        if text is not None:
            _check_template_text(text, limits, self._source)
        self._text = text
        self._bos = bos_token
        self._eos = eos_token
        self._default_system = _default_chatml_system(text) if text and family == "chatml" else None
        self._jinja = None
        if use_jinja is not False and text is not None:
            try:
                from . import _template_sandbox as sandbox  # noqa: PLC0415 - needs jinja2
            except ImportError:
                if use_jinja:
                    raise ImportError("use_jinja=True but jinja2 (3.0 or newer) is not "
                                      "importable") from None
            else:
                failure = None
                try:
                    self._jinja = sandbox.environment().compile_template(text)
                except Exception as error:  # noqa: BLE001 - any failure of untrusted text
                    failure = (f"chat template {self._source} does not compile: "
                               f"{type(error).__name__}: {_shortened(str(error))}")
                if failure is not None:
                    raise ChatTemplateError(failure)
        elif use_jinja and text is None:
            raise ValueError("use_jinja=True needs the template text")

    @classmethod
    def from_text(cls, text: str, **options) -> PretrainedChatTemplate:
        limits = options.get("limits") or DEFAULT_TEMPLATE_LIMITS
        source = options.get("source") or "(given as text)"
        if isinstance(limits, TemplateLimits) and isinstance(source, str):
            _check_template_text(text, limits, source)  # before reading it at all
        return cls(detect_chat_family(text), text=text, **options)

    @classmethod
    def for_family(cls, family: str, **options) -> PretrainedChatTemplate:
        return cls(family, **options)

    @property
    def family(self) -> str:
        return self._family

    @property
    def text(self) -> str | None:
        """The template's Jinja text, when it came from a checkpoint."""
        return self._text

    @property
    def source(self) -> str:
        """Where the template came from, as error messages name it."""
        return self._source

    @property
    def limits(self) -> TemplateLimits:
        return self._limits

    @property
    def renders_with_jinja(self) -> bool:
        return self._jinja is not None

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        stops = _STOP_SEQUENCES[self._family]
        if self._eos and self._eos not in stops:
            stops = (*stops, self._eos)
        return stops

    @property
    def takes_tools(self) -> bool:
        """Whether the template's own text renders tools (it mentions ``tools`` or
        ``tool_calls``); a conversation with tools is otherwise rendered by the family's
        built-in renderer, in the family's tool format."""
        return self._jinja is not None and self._text is not None and (
            "tools" in self._text or "tool_calls" in self._text)

    @property
    def tool_format(self) -> str:
        """How the model writes tool calls (``serving.tool_calls.TOOL_FORMATS``): what a
        template that takes tools shows (``[TOOL_CALLS]``: mistral, ``<tool_call>``:
        hermes), else the family's."""
        if self.takes_tools:
            if "[TOOL_CALLS]" in self._text:
                return "mistral"
            if "<tool_call>" in self._text:
                return "hermes"
        return FAMILY_TOOL_FORMATS[self._family]

    def render(
        self, messages: Sequence[ChatMessage | Mapping], add_generation_prompt: bool = True,
        tools: Sequence[Mapping] | None = None,
    ) -> str:
        """The prompt text of ``messages``, control tokens written as text. Encode it with
        :func:`~.chat.encode_chat` (which renders it itself): encoding this text with
        special tokens parsed would also turn control-token text inside the messages into
        control tokens. A jinja2 rendering that fails is a ChatTemplateError.

        ``tools`` (OpenAI's list, :func:`~.tool_calls.template_tools`) are rendered with
        the conversation, as are tool messages and assistants' tool calls: by the template's
        text when it takes tools (``tools`` and the messages' ``tool_calls`` and
        ``tool_call_id`` as Hugging Face passes them), else by the family's built-in tool
        format (:mod:`.tool_calls`)."""
        if not isinstance(add_generation_prompt, bool):
            raise TypeError("add_generation_prompt must be a bool")
        turns = chat_messages(messages)
        if tools is not None and (isinstance(tools, (str, bytes, Mapping))
                                  or not isinstance(tools, Sequence)):
            raise TypeError(f"tools must be a list of tools, not {type(tools).__name__}")
        uses_tools = bool(tools) or any(m.role == "tool" or m.tool_calls for m in turns)
        if self._jinja is not None and (not uses_tools or self.takes_tools):
            return self._render_jinja(turns, add_generation_prompt, tools)
        if uses_tools:
            return self._render_tools(turns, add_generation_prompt, list(tools or ()))
        return getattr(self, f"_render_{self._family}")(turns, add_generation_prompt)

    def _render_tools(self, turns, add_generation_prompt: bool, tools: list) -> str:
        if self._family == "llama3":
            parts = [self._bos or "<|begin_of_text|>"]
            parts.extend(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}"
                         f"<|eot_id|>" for role, content in tool_calls.llama3_turns(turns, tools))
            if add_generation_prompt:
                parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
            return "".join(parts)
        if self._family == "mistral":
            return tool_calls.mistral_render(turns, tools, self._bos or "<s>",
                                             self._eos or "</s>")
        default = self._default_system if self._family == "chatml" else None
        plain = tool_calls.hermes_turns(turns, tools, default)
        return getattr(self, f"_render_{self._family}")(plain, add_generation_prompt)

    def _render_jinja(self, turns, add_generation_prompt: bool, tools=None) -> str:
        from . import _template_sandbox as sandbox  # noqa: PLC0415 - imported at load already

        context = {
            "messages": tool_calls.jinja_messages(turns),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._bos,
            "eos_token": self._eos,
            "tools": list(tools) if tools else None,
        }
        try:
            return sandbox.render(self._jinja, context, self._limits, len(turns))
        except sandbox.TemplateLimitError as error:
            failure = f"chat template {self._source}: rendering stopped: {error}"
        except sandbox.TemplateRaisedError as error:
            failure = f"chat template {self._source}: {_shortened(str(error))}"
        except Exception as error:  # noqa: BLE001 - the template's code failed, whatever it did
            failure = (f"chat template {self._source} failed: {type(error).__name__}: "
                       f"{_shortened(str(error))}")
        # Raised outside the handler: the failed rendering's frames (and what they hold) go.
        raise ChatTemplateError(failure)

    # ---- Built-in renderers, one per family --------------------------------------------

    def _render_chatml(self, turns, add_generation_prompt):
        parts = []
        if self._default_system is not None and turns[0].role != "system":
            parts.append(f"<|im_start|>system\n{self._default_system}<|im_end|>\n")
        parts.extend(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in turns)
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def _render_llama3(self, turns, add_generation_prompt):
        parts = [self._bos or "<|begin_of_text|>"]
        parts.extend(
            f"<|start_header_id|>{m.role}<|end_header_id|>\n\n{m.content.strip()}<|eot_id|>"
            for m in turns
        )
        if add_generation_prompt:
            parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
        return "".join(parts)

    @staticmethod
    def _system_and_turns(turns, family):
        system = turns[0].content if turns[0].role == "system" else None
        rest = turns[1:] if system is not None else turns
        for index, message in enumerate(rest):
            expected = "user" if index % 2 == 0 else "assistant"
            if message.role != expected:
                raise ValueError(
                    f"{family} chat: turns must alternate user/assistant after an optional "
                    f"system message (message {index + (1 if system is not None else 0)} is "
                    f"{message.role!r})"
                )
        return system, rest

    def _render_llama2(self, turns, add_generation_prompt):
        system, rest = self._system_and_turns(turns, "Llama 2")
        bos, eos = self._bos or "<s>", self._eos or "</s>"
        parts = []
        for index, message in enumerate(rest):
            if message.role == "user":
                content = message.content
                if index == 0 and system is not None:
                    content = f"<<SYS>>\n{system}\n<</SYS>>\n\n{content}"
                parts.append(f"{bos}[INST] {content.strip()} [/INST]")
            else:
                parts.append(f" {message.content.strip()} {eos}")
        return "".join(parts)

    def _render_mistral(self, turns, add_generation_prompt):
        system, rest = self._system_and_turns(turns, "Mistral")
        bos, eos = self._bos or "<s>", self._eos or "</s>"
        parts = [bos]
        for index, message in enumerate(rest):
            if message.role == "user":
                content = message.content
                if index == 0 and system is not None:
                    content = f"{system}\n\n{content}"
                parts.append(f"[INST] {content} [/INST]")
            else:
                parts.append(f"{message.content}{eos}")
        return "".join(parts)

    def _render_gemma(self, turns, add_generation_prompt):
        system, rest = self._system_and_turns(turns, "Gemma")
        parts = [self._bos or "<bos>"]
        for index, message in enumerate(rest):
            role = "model" if message.role == "assistant" else "user"
            content = message.content.strip()
            if index == 0 and system is not None:
                content = f"{system.strip()}\n\n{content}"
            parts.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
        if add_generation_prompt:
            parts.append("<start_of_turn>model\n")
        return "".join(parts)

    def _render_phi3(self, turns, add_generation_prompt):
        # Phi-3.5's template: every turn "<|role|>\ncontent<|end|>\n" (an empty system message
        # is left out); without a generation prompt the conversation ends with the eos token.
        parts = [f"<|{m.role}|>\n{m.content}<|end|>\n" for m in turns
                 if m.role != "system" or m.content]
        parts.append("<|assistant|>\n" if add_generation_prompt else self._eos)
        return "".join(parts)

    def __repr__(self) -> str:
        how = "jinja2" if self._jinja is not None else "built-in"
        return f"<PretrainedChatTemplate {self._family} ({how})>"
