"""Post-training data: instruction examples, their JSONL files, and the plain chat format.

An example is either an :class:`InstructionExample` (one prompt, one response) or a
:class:`Conversation` (system, user and assistant turns ending with the assistant's).
:func:`read_instructions_jsonl` streams a JSONL file of them, one JSON object per nonblank
line, in either shape::

    {"prompt": "What is 2 + 2?", "response": "4"}
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}

:class:`PlainChatFormatter` turns an example into training text exactly as serving's
:class:`~riftco_transformer.serving.chat.PlainChatTemplate` renders the same conversation,
so a model fine-tuned on it answers the prompts serving builds; its :meth:`segments
<PlainChatFormatter.segments>` flag the assistant's content, for a loss on the response
only. :func:`instruction_fingerprint` identifies a data set by content.

Standard library only; importing this module loads no native library.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ._container import unique_keys
from .serving.chat import CHAT_ROLES, ChatMessage, PlainChatTemplate, chat_messages

__all__ = [
    "Conversation",
    "Example",
    "InstructionExample",
    "InstructionSplits",
    "PlainChatFormatter",
    "instruction_fingerprint",
    "parse_instructions_jsonl",
    "read_instructions_jsonl",
    "split_examples",
]

# What PlainChatTemplate trims from content, and what counts as blank here.
ASCII_WHITESPACE = " \t\n\r\f\v"


def _require_text(value: object, name: str, *, allow_blank: bool = False) -> str:
    """``value`` when it is a str that UTF-8 can encode (no lone surrogates) and, unless
    ``allow_blank``, holds something besides ASCII whitespace."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name} is not valid Unicode (a lone surrogate at index {error.start})"
        ) from None
    if not allow_blank and not value.strip(ASCII_WHITESPACE):
        raise ValueError(f"{name} is blank (ASCII whitespace only)")
    return value


@dataclass(frozen=True)
class InstructionExample:
    """One prompt and the response to learn: both str, neither blank (ASCII whitespace only).

    TypeError for a non-str field, ValueError for a blank one or one with a lone surrogate.
    """

    prompt: str
    response: str

    def __post_init__(self) -> None:
        _require_text(self.prompt, "prompt")
        _require_text(self.response, "response")

    def as_conversation(self) -> Conversation:
        """The same example as a two-turn :class:`Conversation` (user, then assistant)."""
        return Conversation(
            (ChatMessage("user", self.prompt), ChatMessage("assistant", self.response))
        )

    def to_record(self) -> dict[str, str]:
        """The JSONL record of this example: ``{"prompt": ..., "response": ...}``."""
        return {"prompt": self.prompt, "response": self.response}


@dataclass(frozen=True)
class Conversation:
    """Turns to learn the assistant's side of: a nonempty tuple of ChatMessage.

    Any order of the roles ChatMessage accepts, but the last message is the assistant's, and
    no assistant message is blank (ASCII whitespace only). ``messages`` may be given as any
    sequence of ChatMessage values or ``{"role", "content"}`` mappings; it is stored as a
    tuple of ChatMessage. TypeError or ValueError (naming ``messages[i]``) otherwise.
    """

    messages: tuple[ChatMessage, ...]

    def __post_init__(self) -> None:
        messages = chat_messages(self.messages)
        for index, message in enumerate(messages):
            _require_text(
                message.content,
                f"messages[{index}]: {message.role} content",
                allow_blank=message.role != "assistant",
            )
        if messages[-1].role != "assistant":
            raise ValueError(
                f"the last message must be the assistant's, not the {messages[-1].role}'s "
                f"(messages[{len(messages) - 1}])"
            )
        object.__setattr__(self, "messages", messages)

    def as_conversation(self) -> Conversation:
        """This conversation (so that every :data:`Example` has ``as_conversation``)."""
        return self

    def to_record(self) -> dict[str, list[dict[str, str]]]:
        """The JSONL record of this conversation: ``{"messages": [{"role", "content"}...]}``."""
        return {
            "messages": [
                {"role": message.role, "content": message.content} for message in self.messages
            ]
        }


Example = InstructionExample | Conversation
"""An instruction example of either shape."""


# ---------------------------------------------------------------------------------------------
# JSONL


def read_instructions_jsonl(path: str | os.PathLike) -> tuple[Example, ...]:
    """The examples of the JSONL file at ``path``, in file order (see
    :func:`parse_instructions_jsonl` for the format and its errors; ``source`` is the path).

    The file is read line by line, never whole. FileNotFoundError when it does not exist,
    TypeError when ``path`` is not a str or os.PathLike.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    source = os.fspath(path)
    if isinstance(source, bytes):
        source = os.fsdecode(source)
    with open(path, "rb") as stream:
        return _parse_lines(stream, source)


def parse_instructions_jsonl(
    text_or_bytes: str | bytes | bytearray | memoryview, source: str = "<text>"
) -> tuple[Example, ...]:
    """The examples of JSONL content, in order.

    UTF-8 (bytes are decoded line by line; one UTF-8 byte order mark at the very start is
    skipped), lines separated by ``\\n`` (a ``\\r`` before it is allowed), one JSON object per
    nonblank line; blank lines (ASCII whitespace only) are skipped but still counted. Each
    object is ``{"prompt": str, "response": str}`` (other keys ignored) or ``{"messages":
    [{"role": ..., "content": ...}, ...]}`` with the rules of :class:`Conversation`.

    Any problem in the content is a ValueError starting ``f"{source}:{line_number}: "`` that
    says what is wrong: invalid UTF-8, invalid JSON (also a duplicate key, or nesting too deep
    to parse), not an object, a missing key, a field of the wrong JSON type, a blank prompt,
    response or assistant content, a lone surrogate, an unknown role, a conversation not
    ending with the assistant, or ``prompt``/``response`` beside ``messages``. Content with
    no example at all is ``f"{source}: no examples"``. TypeError only for arguments of the
    wrong Python type.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, not {type(source).__name__}")
    if isinstance(text_or_bytes, str):
        lines: Iterable[str | bytes] = text_or_bytes.split("\n")
    elif isinstance(text_or_bytes, (bytes, bytearray, memoryview)):
        lines = bytes(text_or_bytes).split(b"\n")
    else:
        raise TypeError(
            "text_or_bytes must be a str or a bytes-like object, not "
            f"{type(text_or_bytes).__name__}"
        )
    return _parse_lines(lines, source)


def _parse_lines(lines: Iterable[str | bytes], source: str) -> tuple[Example, ...]:
    return jsonl_records(lines, source, _example_from_record, "examples")


def jsonl_records(lines: Iterable[str | bytes], source: str, convert: Callable,
                  nothing: str) -> tuple:
    """``convert(record)`` for the JSON object on every nonblank line, in order: the line
    rules of :func:`parse_instructions_jsonl` (UTF-8 with one byte order mark allowed at the
    start, blank lines skipped but counted, strict JSON, an object per line). A ValueError,
    from the line or from ``convert``, becomes ``f"{source}:{line_number}: {message}"``; no
    record at all is ``f"{source}: no {nothing}"``. The one home of these rules for every
    JSONL input we read (instructions, generation checks)."""
    records = []
    for line_number, line in enumerate(lines, start=1):
        try:
            record = _json_object_line(line, first=line_number == 1)
            if record is not None:
                records.append(convert(record))
        except ValueError as error:
            raise ValueError(f"{source}:{line_number}: {error}") from None
    if not records:
        raise ValueError(f"{source}: no {nothing}")
    return tuple(records)


def _json_object_line(line: str | bytes, first: bool) -> dict | None:
    """The JSON object on one line, or None for a blank line; ValueError without the
    location."""
    if isinstance(line, bytes):
        skipped = 3 if first and line.startswith(b"\xef\xbb\xbf") else 0
        try:
            line = line[skipped:].decode("utf-8")
        except UnicodeDecodeError as error:
            byte = skipped + error.start + 1
            raise ValueError(f"invalid UTF-8 at byte {byte} of the line") from None
    elif first and line.startswith("\ufeff"):
        line = line[1:]
    if not line.strip(ASCII_WHITESPACE):
        return None
    try:
        record = json.loads(line, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON: {error.msg} at column {error.colno}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None
    except ValueError as error:  # a duplicate key, or an integer too long to convert
        raise ValueError(f"invalid JSON: {error}") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {json_type(record)}")
    return record


def _example_from_record(record: dict[str, object]) -> Example:
    if "messages" in record:
        mixed = [key for key in ("prompt", "response") if key in record]
        if mixed:
            raise ValueError(
                f"has both 'messages' and {' and '.join(map(repr, mixed))}: "
                "use one shape per line"
            )
        return _conversation_from_record(record["messages"])
    if "prompt" not in record and "response" not in record:
        raise ValueError("missing key 'prompt' and 'response' (or 'messages')")
    for key in ("prompt", "response"):
        if key not in record:
            raise ValueError(f"missing key {key!r}")
        _require_json_string(record[key], repr(key))
    return InstructionExample(record["prompt"], record["response"])


def _conversation_from_record(messages: object) -> Conversation:
    if not isinstance(messages, list):
        raise ValueError(f"'messages' must be an array, got {json_type(messages)}")
    if not messages:
        raise ValueError("'messages' is empty")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise ValueError(f"{where} must be an object, got {json_type(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"{where}: missing key {key!r}")
            _require_json_string(message[key], f"{where}: {key!r}")
        if message["role"] not in CHAT_ROLES:
            accepted = ", ".join(map(repr, CHAT_ROLES))
            raise ValueError(f"{where}: 'role' must be one of {accepted}, got {message['role']!r}")
    if not any(message["role"] == "assistant" for message in messages):
        raise ValueError("'messages' has no assistant message")
    return Conversation(tuple(ChatMessage(m["role"], m["content"]) for m in messages))


def _require_json_string(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {json_type(value)}")


def json_type(value: object) -> str:
    """The JSON type of a parsed value, for an error message."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


# ---------------------------------------------------------------------------------------------
# Formatting


class PlainChatFormatter:
    """Training text in the plain chat format of :class:`PlainChatTemplate`.

    For ``InstructionExample("What is 2 + 2?", "4")``::

        ### User:
        What is 2 + 2?
        ### Assistant:
        4

    :meth:`format` is ``PlainChatTemplate().render(messages, add_generation_prompt=False)``
    of the example's conversation; :meth:`format_prompt` is what serving renders for one user
    turn, which the model continues with the response; :meth:`segments` marks the
    assistant's content (and the newline that ends it, where the model learns to stop: the
    next text serving sees is a header, one of the template's stop sequences).
    """

    def __init__(self) -> None:
        self.template = PlainChatTemplate()

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """The template's stop sequences (a newline and a header)."""
        return self.template.stop_sequences

    def format(self, example: Example) -> str:
        """The full training text of ``example``; it ends with a newline."""
        return self.template.render(_messages(example), add_generation_prompt=False)

    def format_prompt(self, prompt: str) -> str:
        """The prompt serving gives the model for one user turn: exactly the prefix of
        ``format(InstructionExample(prompt, response))`` up to and including the assistant
        header line, for any response. ``prompt`` follows InstructionExample's rules."""
        _require_text(prompt, "prompt")
        return self.template.render([ChatMessage("user", prompt)], add_generation_prompt=True)

    def segments(self, example: Example) -> tuple[tuple[str, bool], ...]:
        """:meth:`format`'s text as consecutive ``(text, is_assistant_content)`` pieces.

        The pieces concatenate to ``format(example)`` exactly, none is empty, and two
        neighbours never share a flag. True pieces are assistant content, each with the
        newline that ends it (the tokens a response-only loss trains on); False pieces are
        header lines and system or user content.
        """
        pieces = self.template.render_pieces(_messages(example), add_generation_prompt=False)
        merged: list[list] = []
        for text, role in pieces:
            trained = role == "assistant"
            if merged and merged[-1][1] == trained:
                merged[-1][0] += text
            else:
                merged.append([text, trained])
        return tuple((text, trained) for text, trained in merged)

    def __repr__(self) -> str:
        return "PlainChatFormatter()"


class ChatTemplateFormatter:
    """Instruction examples in a pretrained model's own chat template (any object with
    ``render(messages, add_generation_prompt)`` and ``stop_sequences``: ChatML, Llama 3, ...).

    :meth:`format` renders the whole conversation; :meth:`segments` splits it where the last
    assistant turn starts: everything up to the generation prompt is context, the assistant's
    content and the template's end-of-turn text after it are what a response-only loss trains
    (so the model learns to stop). Conversations whose rendering does not extend the rendering
    of their prefix (a template that rewrites earlier turns) are a ValueError naming it.
    """

    def __init__(self, template) -> None:
        if not callable(getattr(template, "render", None)):
            raise TypeError(f"template must have render(), not {type(template).__name__}")
        self.template = template

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return tuple(self.template.stop_sequences)

    def format(self, example: Example) -> str:
        return self.template.render(_messages(example), add_generation_prompt=False)

    def format_prompt(self, prompt: str) -> str:
        _require_text(prompt, "prompt")
        return self.template.render([ChatMessage("user", prompt)], add_generation_prompt=True)

    def segments(self, example: Example) -> tuple[tuple[str, bool], ...]:
        messages = _messages(example)
        last = max(index for index, message in enumerate(messages) if message.role == "assistant")
        whole = self.template.render(messages[: last + 1], add_generation_prompt=False)
        context = self.template.render(messages[:last], add_generation_prompt=True)
        if not whole.startswith(context) or len(whole) == len(context):
            raise ValueError(
                "the chat template's rendering of the conversation does not extend the "
                "rendering of its prompt; response-only training needs a prefix-stable template"
            )
        pieces = [(context, False), (whole[len(context):], True)]
        rest = self.template.render(messages, add_generation_prompt=False)[len(whole):]
        if rest:
            pieces.append((rest, False))
        return tuple(pieces)

    def __repr__(self) -> str:
        return f"ChatTemplateFormatter({self.template!r})"


def _messages(example: object) -> tuple[ChatMessage, ...]:
    if not isinstance(example, (InstructionExample, Conversation)):
        raise TypeError(
            f"example must be an InstructionExample or a Conversation, not "
            f"{type(example).__name__}"
        )
    return example.as_conversation().messages


# ---------------------------------------------------------------------------------------------
# Fingerprint


def instruction_fingerprint(examples: Iterable[Example]) -> str:
    """SHA-256 (hex) identifying ``examples`` by content and order.

    The hash is over the UTF-8 of canonical JSON (sorted keys, no spaces, non-ASCII kept as
    is) of the list of their records: ``{"prompt", "response"}`` for an InstructionExample,
    ``{"messages": [{"role", "content"}, ...]}`` for a Conversation. Content is hashed as
    given, untrimmed. TypeError for an item of another type.
    """
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Iterable):
        raise TypeError(f"examples must be an iterable of examples, not {type(examples).__name__}")
    records = []
    for index, example in enumerate(examples):
        if not isinstance(example, (InstructionExample, Conversation)):
            raise TypeError(
                f"examples[{index}] must be an InstructionExample or a Conversation, not "
                f"{type(example).__name__}"
            )
        records.append(example.to_record())
    canonical = json.dumps(records, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class InstructionSplits:
    """Disjoint train/validation/test examples (``test`` may be empty) with their
    fingerprints (:func:`instruction_fingerprint` of each split)."""

    train: tuple[Example, ...]
    validation: tuple[Example, ...]
    test: tuple[Example, ...] = ()

    def fingerprints(self) -> dict[str, str]:
        return {name: instruction_fingerprint(getattr(self, name))
                for name in ("train", "validation", "test")}


def split_examples(
    examples: Iterable[Example],
    validation_fraction: float,
    test_fraction: float = 0.0,
    seed: int = 0,
) -> InstructionSplits:
    """Split ``examples`` into :class:`InstructionSplits` by content, deterministically.

    Each distinct example goes to a split by the SHA-256 of ``seed`` and its canonical
    record, read as a number u in [0, 1): test when u < test_fraction, validation when u <
    test_fraction + validation_fraction, train otherwise. So an example always lands in the
    same split whatever else the file holds or its order, and an exact duplicate can never
    sit on both sides (later copies are dropped). Each split keeps the input order.
    ``validation_fraction`` is in (0, 1), ``test_fraction`` in [0, 1), their sum below 1;
    ValueError when the train or validation split (or a requested test split) ends up empty.
    """
    for name, value, allow_zero in (("validation_fraction", validation_fraction, False),
                                    ("test_fraction", test_fraction, True)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, not {type(value).__name__}")
        if not (0 <= value < 1) or (value == 0 and not allow_zero):
            raise ValueError(f"{name} must be in {'[0' if allow_zero else '(0'}, 1), got {value!r}")
    if validation_fraction + test_fraction >= 1:
        raise ValueError("validation_fraction + test_fraction must be below 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    splits: dict[str, list] = {"train": [], "validation": [], "test": []}
    seen = set()
    for index, example in enumerate(examples):
        if not isinstance(example, (InstructionExample, Conversation)):
            raise TypeError(f"examples[{index}] must be an InstructionExample or a Conversation")
        record = json.dumps(example.to_record(), sort_keys=True, separators=(",", ":"),
                            ensure_ascii=False)
        if record in seen:
            continue
        seen.add(record)
        digest = hashlib.sha256(f"{seed}\0{record}".encode()).digest()
        position = int.from_bytes(digest[:8], "big") / 2**64
        name = ("test" if position < test_fraction
                else "validation" if position < test_fraction + validation_fraction
                else "train")
        splits[name].append(example)
    for name in ("train", "validation") + (("test",) if test_fraction else ()):
        if not splits[name]:
            raise ValueError(f"the {name} split is empty: too few examples for these fractions")
    return InstructionSplits(tuple(splits["train"]), tuple(splits["validation"]),
                             tuple(splits["test"]))
