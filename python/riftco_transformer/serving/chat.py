"""Chat templates: a conversation as the one prompt string a model was trained to continue.

A template is any object with ``render(messages, add_generation_prompt=True) -> str`` and
``stop_sequences`` (strings that end the assistant's turn). ``messages`` are
:class:`ChatMessage` values or mappings with ``role`` and ``content``. Models of other
families (Llama, Mistral) bring their own template object.

:func:`encode_chat` turns a conversation into token ids with the control tokens
(``<|im_start|>``, ``<|eot_id|>``...) of the template only: what the messages say is
always plain text, whatever it spells.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..native._validation import describe_value

CHAT_ROLES = ("system", "user", "assistant")  # the roles of training conversations
TOOL_ROLE = "tool"  # a function's result, answering an assistant's tool call
MESSAGE_ROLES = (*CHAT_ROLES, TOOL_ROLE)


@dataclass(frozen=True)
class ToolCall:
    """A function the assistant called: ``id`` (the caller's name for the call, may be
    empty), the function's ``name`` and its ``arguments`` as JSON text (OpenAI's form)."""

    id: str
    name: str
    arguments: str

    def __post_init__(self) -> None:
        for field in ("id", "name", "arguments"):
            value = getattr(self, field)
            if not isinstance(value, str):
                raise TypeError(f"{field} must be a str, not {type(value).__name__} "
                                f"({describe_value(value)})")
        if not self.name:
            raise ValueError("name must not be empty")


@dataclass(frozen=True)
class ChatMessage:
    """One turn: ``role`` is ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``;
    ``content`` a str. An assistant's turn may carry ``tool_calls`` (ToolCall values); a
    tool's turn (a function's result) may name the call it answers, ``tool_call_id``."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or self.role not in MESSAGE_ROLES:
            accepted = ", ".join(map(repr, MESSAGE_ROLES))
            raise ValueError(f"role must be one of {accepted}, got {describe_value(self.role)}")
        if not isinstance(self.content, str):
            raise TypeError(
                f"content must be a str, not {type(self.content).__name__} "
                f"({describe_value(self.content)})"
            )
        calls = self.tool_calls
        if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
            raise TypeError(f"tool_calls must be a sequence of ToolCall, not "
                            f"{type(calls).__name__}")
        if not all(isinstance(call, ToolCall) for call in calls):
            raise TypeError("tool_calls must hold ToolCall values")
        object.__setattr__(self, "tool_calls", tuple(calls))
        if calls and self.role != "assistant":
            raise ValueError(f"only an assistant message has tool_calls, not a {self.role} "
                             f"message")
        if self.tool_call_id is not None:
            if not isinstance(self.tool_call_id, str):
                raise TypeError(f"tool_call_id must be a str, not "
                                f"{describe_value(self.tool_call_id)}")
            if self.role != TOOL_ROLE:
                raise ValueError(f"only a tool message has a tool_call_id, not a {self.role} "
                                 f"message")


def _tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    """OpenAI's ``tool_calls`` of a message: ``[{"id", "type": "function", "function":
    {"name", "arguments"}}]``, ``arguments`` a JSON string (or an object, written as JSON)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{where} must be a list of tool calls, not {describe_value(value)}")
    calls = []
    for index, call in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(call, Mapping):
            raise TypeError(f"{at} must be an object, not {describe_value(call)}")
        if call.get("type", "function") != "function":
            raise ValueError(f"{at}.type must be 'function', not {describe_value(call['type'])}")
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise TypeError(f"{at}.function must be an object with name and arguments, not "
                            f"{describe_value(function)}")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(arguments, ensure_ascii=False)
        identifier = call.get("id") or ""
        try:
            calls.append(ToolCall(identifier, function.get("name"), arguments))
        except (TypeError, ValueError) as error:
            raise type(error)(f"{at}: {error}") from None
    return tuple(calls)


def chat_messages(messages: Sequence[ChatMessage | Mapping]) -> tuple[ChatMessage, ...]:
    """``messages`` as a nonempty tuple of ChatMessage (mappings need ``role`` and
    ``content``, which an assistant message with ``tool_calls`` may leave out or null; a
    tool message may have ``tool_call_id``)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence of messages, not {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must hold at least one message")
    converted = []
    for index, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            converted.append(message)
        elif isinstance(message, Mapping):
            calls = message.get("tool_calls")
            content = message.get("content")
            if calls and content is None:
                content = ""
            missing = [key for key in ("role", "content")
                       if key not in message and not (key == "content" and calls)]
            if missing:
                raise ValueError(f"messages[{index}] lacks {' and '.join(missing)}")
            try:
                converted.append(ChatMessage(
                    message["role"], content,
                    _tool_calls(calls, "tool_calls") if calls else (),
                    message.get("tool_call_id")))
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
    """The plain chat format our GPT models are fine-tuned on
    (docs/ARCHITECTURE.md, 'Training workflows').

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
        self, messages: Sequence[ChatMessage | Mapping], add_generation_prompt: bool = True,
        tools: Sequence[Mapping] | None = None,
    ) -> str:
        if tools:
            raise ValueError("the plain chat format has no tools")
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
        for index, message in enumerate(chat_messages(messages)):
            if message.role not in self.HEADERS or message.tool_calls:
                raise ValueError(f"messages[{index}]: the plain chat format has no tool "
                                 f"messages or tool calls")
            pieces.append((self.HEADERS[message.role] + "\n", None))
            pieces.append((message.content.strip(" \t\n\r\f\v") + "\n", message.role))
        if add_generation_prompt:
            pieces.append((self.HEADERS["assistant"] + "\n", None))
        return tuple(pieces)

    def __repr__(self) -> str:
        return "PlainChatTemplate()"


# ---- Encoding a conversation: control tokens from the template only ----------------------------
#
# Encoding a rendered prompt with special tokens parsed would turn a message that spells
# "<|im_end|>\n<|im_start|>system\n..." into real control tokens: a user writing a system
# turn (role injection). encode_chat keeps the template's control tokens and nothing else:
#
# 1. every occurrence of a control token's text in a message's content is replaced by a
#    placeholder, a private-use character that occurs in no content, in no control token
#    and not in the template's text (so the template sees the content with its length and
#    whitespace otherwise unchanged: strip, trim and the like work as before);
# 2. the template renders the conversation;
# 3. the rendered text is cut at the control tokens left in it, found leftmost-longest as
#    the tokenizer finds them: all of them are the template's own;
# 4. each piece between them gets its placeholders back and is encoded as plain text
#    (``special=False``): the content's control-token text becomes ordinary tokens.
#
# A control token could also be spelled across a content's edge: two messages rendered next to
# each other ("...<|im_" + "start|>..."), or a template writing part of one next to the
# content. So the longest start of a content that ends some control token, and the longest
# end that begins one, become placeholders too (for the text they are). Outer whitespace
# stays outside them, for the template to trim; parts of control tokens holding whitespace
# are not looked for (no real control token holds whitespace).
#
# Messages with neither (nearly all) take a shortcut: their rendered prompt is encoded once
# with special tokens parsed, which gives the same ids (the tokenizer encodes the pieces
# between control tokens on their own either way).

# Supplementary Private Use Area-A, as placeholders: assigned to nothing, 65,534 of them.
_PLACEHOLDERS = range(0xF0000, 0xFFFFE)


def _trie_pattern(words) -> str:
    """A regular expression matching, at a position, the longest of ``words`` that starts
    there: a trie, in which at most one branch continues at each character, so a match
    costs at most the longest word's length."""
    root: dict = {}
    for word in words:
        node = root
        for character in word:
            node = node.setdefault(character, {})
        node[""] = {}  # a word ends here

    def expression(node: dict) -> str:
        branches = []
        for character in sorted(key for key in node if key):
            run, child = character, node[character]
            while len(child) == 1 and "" not in child:  # a chain with no choice: one literal
                (character, child), = child.items()
                run += character
            branches.append(re.escape(run) + (expression(child) if len(child) > ("" in child)
                                              else ""))
        body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
        # Greedy: the longer word when it matches, else the word ending here.
        return f"(?:{body})?" if "" in node else body

    return expression(root)


class _ControlTokens:
    """A tokenizer's control tokens: their ids, a pattern finding them leftmost-longest, the
    characters they use, and their proper beginnings and endings without whitespace (what a
    content's edge must not leave open)."""

    def __init__(self, ids: Mapping[str, int]) -> None:
        self.ids = {text: id_ for text, id_ in ids.items() if text}
        self.pattern = re.compile(_trie_pattern(self.ids)) if self.ids else None
        self.characters = frozenset("".join(self.ids))
        self.beginnings = {text[:end] for text in self.ids for end in range(1, len(text))}
        self.endings = {text[start:] for text in self.ids for start in range(1, len(text))}
        self.beginnings = {part for part in self.beginnings if not _has_space(part)}
        self.endings = {part for part in self.endings if not _has_space(part)}
        self.longest = max(map(len, self.ids), default=0)
        self.first_characters = frozenset(text[0] for text in self.ids)
        self.last_characters = frozenset(text[-1] for text in self.ids)

    def edges(self, content: str) -> tuple[int, int, int, int] | None:
        """Where ``content``'s edges could spell part of a control token: ``(head_start,
        head_end, tail_start, tail_end)``, the longest start (after leading whitespace) that
        ends a control token and the longest end (before trailing whitespace, in the rest)
        that begins one; None when neither exists."""
        start = len(content) - len(content.lstrip())
        end = len(content.rstrip())
        head = next((n for n in range(min(self.longest - 1, end - start), 0, -1)
                     if content[start + n - 1] in self.last_characters
                     and content[start:start + n] in self.endings), 0)
        tail = next((n for n in range(min(self.longest - 1, end - start - head), 0, -1)
                     if content[end - n] in self.first_characters
                     and content[end - n:end] in self.beginnings), 0)
        if not head and not tail:
            return None
        return start, start + head, end - tail, end


def _has_space(text: str) -> bool:
    return any(character.isspace() for character in text)


_CONTROL_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CONTROL_TOKENS_LOCK = threading.Lock()


def _control_tokens(tokenizer) -> _ControlTokens | None:
    """The control tokens of ``tokenizer`` (``control_tokens()``: a mapping from the text to
    the id), cached per tokenizer; None when it has none or cannot tell."""
    listing = getattr(tokenizer, "control_tokens", None)
    if not callable(listing):
        return None
    try:
        with _CONTROL_TOKENS_LOCK:
            cached = _CONTROL_TOKENS.get(tokenizer)
    except TypeError:  # not weakly referenceable: built each time
        cached = None
    if cached is None:
        cached = _ControlTokens(listing())
        try:
            with _CONTROL_TOKENS_LOCK:
                _CONTROL_TOKENS[tokenizer] = cached
        except TypeError:
            pass
    return cached if cached.pattern is not None else None


def _strings(value: object):
    """Every str inside a JSON-like value (mapping values and keys, list items)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _map_strings(value: object, change):
    """``value`` with ``change`` applied to every str inside it (a copy)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {change(key) if isinstance(key, str) else key: _map_strings(item, change)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(item, change) for item in value]
    return value


def _message_texts(message: ChatMessage):
    yield message.content
    for call in message.tool_calls:
        yield call.id
        yield call.name
        yield call.arguments
    if message.tool_call_id is not None:
        yield message.tool_call_id


def chat_prompt(
    template: ChatTemplate,
    tokenizer,
    messages: Sequence[ChatMessage | Mapping],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping] | None = None,
) -> str | list[int]:
    """What to generate from for ``messages``: their token ids as :func:`encode_chat` makes
    them, or, when ``tokenizer`` has no control tokens, the rendered prompt itself (encoding
    it gives those ids; a caller that shows or records the prompt keeps its text).

    ``tools`` (OpenAI's ``tools`` list, e.g. from :func:`~.tool_calls.template_tools`) is
    passed to ``template.render`` when given. Like the messages' content, every string in
    the tools and in tool calls is plain text, whatever control token it spells."""
    turns = chat_messages(messages)
    options = {"add_generation_prompt": add_generation_prompt}
    if tools is not None:
        options["tools"] = tools
    controls = _control_tokens(tokenizer)
    if controls is None:
        return template.render(turns, **options)
    pattern = controls.pattern
    texts = [text for message in turns for text in _message_texts(message)]
    texts.extend(_strings(tools))
    edges = [controls.edges(text) for text in texts]
    if not any(edges) and not any(pattern.search(text) for text in texts):
        # Nothing in the messages can make a control token: the rendered prompt's control
        # tokens are the template's, and one encoding with them parsed is the answer.
        rendered = template.render(turns, **options)
        ids = list(tokenizer.encode_bytes(rendered.encode("utf-8")))
        if not ids:
            raise ValueError("the prompt must encode to at least one token")
        return ids

    placeholders: dict[str, str] = {}  # text -> the placeholder standing for it
    restore: dict[int, str] = {}  # placeholder -> the text it stands for
    taken = controls.characters.union(*texts)
    template_text = getattr(template, "text", None)
    if isinstance(template_text, str):
        taken = taken.union(template_text)
    free = (chr(code) for code in _PLACEHOLDERS if chr(code) not in taken)

    def placeholder(text: str) -> str:
        if text not in placeholders:
            character = next(free, None)
            if character is None:
                raise ValueError("the messages use every private-use character: they cannot "
                                 "be told apart from placeholders")
            placeholders[text] = character
            restore[ord(character)] = text
        return placeholders[text]

    def defused(content: str) -> str:
        edge = controls.edges(content)
        if edge is None:
            return pattern.sub(lambda match: placeholder(match.group()), content)
        head_start, head_end, tail_start, tail_end = edge
        return "".join((
            content[:head_start],
            placeholder(content[head_start:head_end]) if head_end > head_start else "",
            pattern.sub(lambda match: placeholder(match.group()), content[head_end:tail_start]),
            placeholder(content[tail_start:tail_end]) if tail_end > tail_start else "",
            content[tail_end:]))

    turns = tuple(ChatMessage(
        message.role, defused(message.content),
        tuple(ToolCall(defused(call.id), defused(call.name), defused(call.arguments))
              for call in message.tool_calls),
        None if message.tool_call_id is None else defused(message.tool_call_id))
        for message in turns)
    if tools is not None:
        options["tools"] = _map_strings(tools, defused)
    rendered = template.render(turns, **options)
    ids: list[int] = []

    def plain(text: str) -> None:
        if text:
            ids.extend(tokenizer.encode_bytes(text.translate(restore).encode("utf-8"),
                                              special=False))

    position = 0
    for match in pattern.finditer(rendered):
        plain(rendered[position:match.start()])
        ids.append(controls.ids[match.group()])
        position = match.end()
    plain(rendered[position:])
    if not ids:
        raise ValueError("the prompt must encode to at least one token")
    return ids


def encode_chat(
    template: ChatTemplate,
    tokenizer,
    messages: Sequence[ChatMessage | Mapping],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping] | None = None,
) -> list[int]:
    """The token ids of ``messages`` rendered by ``template``, with control tokens only where
    the template itself writes them: a message's content is encoded as plain text, so
    content that spells ``<|im_end|>\\n<|im_start|>system`` stays text instead of closing
    the user's turn and opening a system turn.

    ``tokenizer`` lists its control tokens with ``control_tokens()`` (a mapping from the
    token's text to its id) and encodes without them with ``encode_bytes(data,
    special=False)``, as ``PretrainedTokenizer`` does; a tokenizer without
    ``control_tokens`` has none, and the rendered prompt is encoded as it is. Errors: those
    of ``template.render`` (a ``ChatTemplateError`` for a failing pretrained template,
    ValueError/TypeError for bad messages), ValueError for a prompt of no tokens, and the
    tokenizer's own."""
    prompt = chat_prompt(template, tokenizer, messages, add_generation_prompt, tools)
    if isinstance(prompt, str):
        from .generation import encode_prompt  # noqa: PLC0415 - generation imports much

        return encode_prompt(tokenizer, prompt)
    return prompt
