"""Chat templates of pretrained models: ChatML (SmolLM, Qwen), Llama 2, Llama 3, Mistral,
Gemma and Phi-3.

A pretrained checkpoint carries its chat template as Jinja text (GGUF
``tokenizer.chat_template``, Hugging Face ``tokenizer_config.json``). :class:`PretrainedChatTemplate`
recognises the family from that text and renders conversations with our own renderer for
it; when ``jinja2`` happens to be importable it renders the template text itself instead (in
a sandbox), so model-specific details (default system prompts, whitespace) come out exactly as
the authors wrote them. The package never depends on jinja2.

Both satisfy serving's ``ChatTemplate`` protocol: ``render(messages, add_generation_prompt)``
and ``stop_sequences``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .chat import ChatMessage, chat_messages

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
    """The system message a ChatML template inserts when the conversation has none."""
    match = re.search(r"<\|im_start\|>system(?:\\n|\n)(.*?)<\|im_end\|>", template, re.DOTALL)
    if match is None or "messages[0]['role'] != 'system'" not in template.replace('"', "'"):
        return None
    text = match.group(1)
    if "{{" in text or "{%" in text:
        return None  # the system message is itself an expression: nothing fixed to insert
    return text.replace("\\n", "\n")


class PretrainedChatTemplate:
    """A pretrained model's chat template.

    ``PretrainedChatTemplate.from_text(text, bos_token=..., eos_token=...)`` detects the
    family; ``use_jinja`` None renders with jinja2 when it imports, True requires it, False
    always uses the built-in renderer of the family. ``PretrainedChatTemplate.for_family(name)``
    gives the built-in renderer of a family without any template text.
    """

    def __init__(
        self,
        family: str,
        *,
        text: str | None = None,
        bos_token: str = "",
        eos_token: str = "",
        use_jinja: bool | None = None,
    ) -> None:
        if family not in CHAT_FAMILIES:
            raise ValueError(f"family must be one of {', '.join(CHAT_FAMILIES)} (got {family!r})")
        self._family = family
        self._text = text
        self._bos = bos_token
        self._eos = eos_token
        self._default_system = _default_chatml_system(text) if text and family == "chatml" else None
        self._jinja = None
        if use_jinja is not False and text is not None:
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                if use_jinja:
                    raise ImportError("use_jinja=True but jinja2 is not importable") from None
            else:
                environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

                def raise_exception(message):
                    raise ValueError(f"chat template: {message}")

                environment.globals["raise_exception"] = raise_exception
                self._jinja = environment.from_string(text)
        elif use_jinja and text is None:
            raise ValueError("use_jinja=True needs the template text")

    @classmethod
    def from_text(cls, text: str, **options) -> PretrainedChatTemplate:
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
    def renders_with_jinja(self) -> bool:
        return self._jinja is not None

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        stops = _STOP_SEQUENCES[self._family]
        if self._eos and self._eos not in stops:
            stops = (*stops, self._eos)
        return stops

    def render(
        self, messages: Sequence[ChatMessage | Mapping], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of ``messages`` (special tokens as text: encode it with special
        tokens parsed)."""
        if not isinstance(add_generation_prompt, bool):
            raise TypeError("add_generation_prompt must be a bool")
        turns = chat_messages(messages)
        if self._jinja is not None:
            return self._jinja.render(
                messages=[{"role": m.role, "content": m.content} for m in turns],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        return getattr(self, f"_render_{self._family}")(turns, add_generation_prompt)

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
