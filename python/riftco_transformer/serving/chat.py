"""Chat templates: a conversation as the one prompt string a model was trained to continue.

A template is any object with ``render(messages, add_generation_prompt=True) -> str`` and
``stop_sequences`` (strings that end the assistant's turn). ``messages`` are
:class:`ChatMessage` values or mappings with ``role`` and ``content``. Models of other
families (Llama, Mistral) bring their own template object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..native._validation import describe_value

CHAT_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatMessage:
    """One turn: ``role`` is ``"system"``, ``"user"`` or ``"assistant"``; ``content`` a str."""

    role: str
    content: str

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or self.role not in CHAT_ROLES:
            accepted = ", ".join(map(repr, CHAT_ROLES))
            raise ValueError(f"role must be one of {accepted}, got {describe_value(self.role)}")
        if not isinstance(self.content, str):
            raise TypeError(
                f"content must be a str, not {type(self.content).__name__} "
                f"({describe_value(self.content)})"
            )


def chat_messages(messages: Sequence[ChatMessage | Mapping]) -> tuple[ChatMessage, ...]:
    """``messages`` as a nonempty tuple of ChatMessage (mappings need ``role`` and
    ``content``)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence of messages, not {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must hold at least one message")
    converted = []
    for index, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            converted.append(message)
        elif isinstance(message, Mapping):
            missing = [key for key in ("role", "content") if key not in message]
            if missing:
                raise ValueError(f"messages[{index}] lacks {' and '.join(missing)}")
            try:
                converted.append(ChatMessage(message["role"], message["content"]))
            except (TypeError, ValueError) as error:
                raise type(error)(f"messages[{index}]: {error}") from None
        else:
            raise TypeError(
                f"messages[{index}] must be a ChatMessage or a mapping, not "
                f"{type(message).__name__}"
            )
    return tuple(converted)


@runtime_checkable
class ChatTemplate(Protocol):
    @property
    def stop_sequences(self) -> tuple[str, ...]: ...

    def render(
        self, messages: Sequence[ChatMessage | Mapping], add_generation_prompt: bool = True
    ) -> str: ...


class PlainChatTemplate:
    """The plain chat format our GPT models are fine-tuned on (WORKFLOWS §3.4).

    Every message is a header line ``### System:``, ``### User:`` or ``### Assistant:``,
    then its content with surrounding ASCII whitespace trimmed, then a newline::

        ### User:
        What is 2 + 2?
        ### Assistant:
        4
        ### User:
        And 3 + 3?
        ### Assistant:

    With ``add_generation_prompt`` (the default) the text ends with the assistant header
    line, which is exactly ``PlainChatFormatter.format_prompt``'s prefix for a single user
    turn. The assistant's turn ends at the next header, so the stop sequences are the three
    headers preceded by a newline.
    """

    HEADERS = {"system": "### System:", "user": "### User:", "assistant": "### Assistant:"}

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return tuple(f"\n{header}" for header in self.HEADERS.values())

    def render(
        self, messages: Sequence[ChatMessage | Mapping], add_generation_prompt: bool = True
    ) -> str:
        return "".join(text for text, _ in self.render_pieces(messages, add_generation_prompt))

    def render_pieces(
        self, messages: Sequence[ChatMessage | Mapping], add_generation_prompt: bool = True
    ) -> tuple[tuple[str, str | None], ...]:
        """:meth:`render`'s text as its lines, each with the newline that ends it: pairs
        ``(line, role)`` where ``role`` is the role of the message whose content the line is,
        or None for a header line. The lines concatenate to ``render(messages,
        add_generation_prompt)`` exactly (instruction tuning uses the roles to train on the
        assistant's content only)."""
        pieces: list[tuple[str, str | None]] = []
        for message in chat_messages(messages):
            pieces.append((self.HEADERS[message.role] + "\n", None))
            pieces.append((message.content.strip(" \t\n\r\f\v") + "\n", message.role))
        if add_generation_prompt:
            pieces.append((self.HEADERS["assistant"] + "\n", None))
        return tuple(pieces)

    def __repr__(self) -> str:
        return "PlainChatTemplate()"
