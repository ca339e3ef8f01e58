"""riftco_transformer.instructions: instruction examples, their JSONL files (every error rule,
with its line number), the plain chat training text and its response spans, and the data
set fingerprint."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from riftco_transformer.instructions import (
    Conversation,
    InstructionExample,
    PlainChatFormatter,
    instruction_fingerprint,
    parse_instructions_jsonl,
    read_instructions_jsonl,
)
from riftco_transformer.serving import ChatMessage, PlainChatTemplate

from conftest import REPOSITORY

TINY_INSTRUCTIONS = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"

PAIR = '{"prompt": "What is 2 + 2?", "response": "4"}'
CHAT = json.dumps(
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "What is 3 + 3?"},
            {"role": "assistant", "content": "6"},
        ]
    }
)

# One example of every shape the formatter must handle: a pair, a system prompt, several
# turns, content with whitespace to trim, a blank user turn, non-ASCII text.
EXAMPLES = (
    InstructionExample("What is 2 + 2?", "4"),
    InstructionExample("  padded prompt \n", "\tpadded response\n\n"),
    InstructionExample("Café?", "Oui, café ☕ 咖啡 🙂"),
    Conversation(
        (
            ChatMessage("system", "Answer briefly."),
            ChatMessage("user", "Hi"),
            ChatMessage("assistant", "Hello."),
            ChatMessage("user", "   "),
            ChatMessage("assistant", "Line one\nline two"),
        )
    ),
    Conversation((ChatMessage("assistant", "Unprompted."),)),
    Conversation((ChatMessage("assistant", "A"), ChatMessage("assistant", "B"))),
)


def parse_error(text: str | bytes, source: str = "<text>") -> str:
    with pytest.raises(ValueError) as caught:
        parse_instructions_jsonl(text, source)
    return str(caught.value)


# --- examples -------------------------------------------------------------------------------


def test_an_instruction_example_needs_two_nonblank_strings():
    example = InstructionExample("prompt", "response")
    assert example.as_conversation() == Conversation(
        (ChatMessage("user", "prompt"), ChatMessage("assistant", "response"))
    )
    with pytest.raises(ValueError, match="prompt is blank"):
        InstructionExample(" \t\n", "response")
    with pytest.raises(ValueError, match="response is blank"):
        InstructionExample("prompt", "")
    with pytest.raises(TypeError, match="prompt must be a str, not int"):
        InstructionExample(3, "response")
    with pytest.raises(TypeError, match="response must be a str, not NoneType"):
        InstructionExample("prompt", None)
    with pytest.raises(ValueError, match="lone surrogate"):
        InstructionExample("prompt", "bad \ud800")
    # Blank means ASCII whitespace only: a non-breaking space is content.
    assert InstructionExample("\u00a0", "x").prompt == "\u00a0"


def test_a_conversation_takes_messages_or_mappings_and_ends_with_the_assistant():
    conversation = Conversation(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    )
    assert conversation.messages == (ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello"))
    assert conversation.as_conversation() is conversation
    with pytest.raises(ValueError, match="at least one message"):
        Conversation(())
    with pytest.raises(ValueError, match=r"last message must be the assistant's, not the user's"):
        Conversation((ChatMessage("assistant", "Hello"), ChatMessage("user", "Hi")))
    with pytest.raises(ValueError, match=r"messages\[1\]: assistant content is blank"):
        Conversation((ChatMessage("user", "Hi"), ChatMessage("assistant", " \n")))
    with pytest.raises(ValueError, match=r"messages\[0\]: role must be one of"):
        Conversation([{"role": "robot", "content": "Hi"}])
    with pytest.raises(TypeError, match=r"messages\[0\]: content must be a str"):
        Conversation([{"role": "assistant", "content": 5}])
    with pytest.raises(TypeError, match="sequence of messages"):
        Conversation("hello")
    # A blank system or user turn is allowed.
    Conversation((ChatMessage("user", ""), ChatMessage("assistant", "Yes?")))


# --- JSONL ----------------------------------------------------------------------------------


def test_both_shapes_parse_in_file_order_and_extra_keys_are_ignored():
    text = f'{{"prompt": "P", "response": "R", "id": 17, "tags": ["x"]}}\n{CHAT}\n{PAIR}\n'
    first, second, third = parse_instructions_jsonl(text)
    assert first == InstructionExample("P", "R")
    assert second == Conversation(
        (
            ChatMessage("system", "Answer briefly."),
            ChatMessage("user", "Hi"),
            ChatMessage("assistant", "Hello."),
            ChatMessage("user", "What is 3 + 3?"),
            ChatMessage("assistant", "6"),
        )
    )
    assert third == InstructionExample("What is 2 + 2?", "4")
    assert parse_instructions_jsonl(text.encode("utf-8")) == (first, second, third)
    assert parse_instructions_jsonl(bytearray(text.encode("utf-8"))) == (first, second, third)


def test_blank_lines_are_skipped_but_counted_and_crlf_and_a_bom_are_accepted():
    text = f"\n  \t\n{PAIR}\r\n\r\n{PAIR}"  # no final newline
    assert len(parse_instructions_jsonl(text)) == 2
    assert len(parse_instructions_jsonl(b"\xef\xbb\xbf" + text.encode())) == 2
    assert len(parse_instructions_jsonl("\ufeff" + text)) == 2
    # The line after two blank lines, a pair and a blank line is line 5.
    assert parse_error(f"\n\n{PAIR}\n\n[]\n") == "<text>:5: expected a JSON object, got an array"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "invalid JSON: Expecting property name enclosed in double quotes at column 2"),
        (f"{PAIR}{PAIR}", "invalid JSON: Extra data at column 46"),
        ("[" * 100_000, "invalid JSON: nested too deeply"),
        ('{"prompt": "a", "prompt": "b", "response": "c"}', "invalid JSON: duplicate key 'prompt'"),
        ("[1, 2]", "expected a JSON object, got an array"),
        ('"text"', "expected a JSON object, got a string"),
        ("null", "expected a JSON object, got null"),
        ("3.5", "expected a JSON object, got a number"),
        ('{"response": "R"}', "missing key 'prompt'"),
        ('{"prompt": "P"}', "missing key 'response'"),
        ('{"id": 1}', "missing key 'prompt' and 'response' (or 'messages')"),
        ('{"prompt": 7, "response": "R"}', "'prompt' must be a string, got a number"),
        ('{"prompt": "P", "response": null}', "'response' must be a string, got null"),
        ('{"prompt": "P", "response": true}', "'response' must be a string, got a boolean"),
        ('{"prompt": " \\t\\n", "response": "R"}', "prompt is blank (ASCII whitespace only)"),
        ('{"prompt": "P", "response": ""}', "response is blank (ASCII whitespace only)"),
        ('{"prompt": "\\ud800", "response": "R"}', "prompt is not valid Unicode"),
        (
            '{"prompt": "P", "messages": []}',
            "has both 'messages' and 'prompt': use one shape per line",
        ),
        (
            '{"prompt": "P", "response": "R", "messages": []}',
            "has both 'messages' and 'prompt' and 'response'",
        ),
        ('{"messages": {}}', "'messages' must be an array, got an object"),
        ('{"messages": []}', "'messages' is empty"),
        ('{"messages": ["hi"]}', "messages[0] must be an object, got a string"),
        ('{"messages": [{"content": "x"}]}', "messages[0]: missing key 'role'"),
        ('{"messages": [{"role": "assistant"}]}', "messages[0]: missing key 'content'"),
        ('{"messages": [{"role": 1, "content": "x"}]}', "messages[0]: 'role' must be a string"),
        (
            '{"messages": [{"role": "assistant", "content": ["x"]}]}',
            "messages[0]: 'content' must be a string, got an array",
        ),
        (
            '{"messages": [{"role": "bot", "content": "x"}]}',
            "messages[0]: 'role' must be one of 'system', 'user', 'assistant', got 'bot'",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}]}',
            "'messages' has no assistant message",
        ),
        (
            '{"messages": [{"role": "assistant", "content": "x"}, '
            '{"role": "user", "content": "y"}]}',
            "the last message must be the assistant's, not the user's (messages[1])",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "  "}]}',
            "messages[1]: assistant content is blank (ASCII whitespace only)",
        ),
    ],
)
def test_every_error_names_the_source_and_the_line_number(line, message):
    # Two good lines and a blank line before it: the bad line is line 4.
    text = f"{PAIR}\n\n{CHAT}\n{line}\n{PAIR}\n"
    error = parse_error(text, "train.jsonl")
    assert error.startswith(f"train.jsonl:4: {message}"), error
    assert parse_error(text.encode("utf-8"), "train.jsonl") == error


def test_invalid_utf8_gives_the_line_and_the_byte():
    data = PAIR.encode() + b"\n\n" + b'{"prompt": "caf\xc3", "response": "R"}\n'
    assert parse_error(data, "d.jsonl") == "d.jsonl:3: invalid UTF-8 at byte 16 of the line"
    assert parse_error(b"\xff") == "<text>:1: invalid UTF-8 at byte 1 of the line"


def test_content_without_examples_is_an_error():
    for text in ("", "\n \n\t\n", b"", "\ufeff\n"):
        assert parse_error(text, "empty.jsonl") == "empty.jsonl: no examples"


def test_arguments_of_the_wrong_type_are_type_errors():
    with pytest.raises(TypeError, match="text_or_bytes must be a str or a bytes-like object"):
        parse_instructions_jsonl(["{}"])
    with pytest.raises(TypeError, match="source must be a str"):
        parse_instructions_jsonl(PAIR, source=3)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        read_instructions_jsonl(3)


def test_arbitrary_input_only_ever_raises_value_error():
    generator = random.Random(20240607)
    pieces = [
        "{", "}", "[", "]", '"', ":", ",", "\n", "\r", " ", "\\", "\\u", "d800", "null", "1e999",
        "-", "0", "true", '"prompt"', '"response"', '"messages"', '"role"', '"content"',
        '"assistant"', '"user"', '"x"', "é", "\ud800", "\u2028", "\x00",
    ]  # fmt: skip
    for _ in range(2000):
        text = "".join(generator.choice(pieces) for _ in range(generator.randrange(1, 40)))
        data = bytes(generator.randrange(256) for _ in range(generator.randrange(0, 24)))
        for candidate in (text, data, text.encode("utf-8", "surrogatepass")):
            try:
                parse_instructions_jsonl(candidate)
            except ValueError:
                pass


def test_utf8_text_round_trips_through_a_file(tmp_path):
    examples = (
        InstructionExample("Où est le café ?", "À côté de la gare, naïvement."),
        InstructionExample("中文怎么说“你好”？", "你好 means hello 🙂👋🏽"),
        Conversation(
            (
                ChatMessage("user", "Emoji: 🧪"),
                ChatMessage("assistant", "Ελληνικά, русский, עברית, 😀\u2028 end"),
            )
        ),
    )
    path = tmp_path / "unicode.jsonl"
    with path.open("w", encoding="utf-8") as stream:
        for example in examples:
            stream.write(json.dumps(example.to_record(), ensure_ascii=False) + "\n")
    assert read_instructions_jsonl(path) == examples
    assert read_instructions_jsonl(str(path)) == examples
    escaped = "\n".join(json.dumps(example.to_record()) for example in examples)
    assert parse_instructions_jsonl(escaped) == examples


def test_a_file_error_names_the_path_and_a_missing_file_is_file_not_found(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(f"{PAIR}\n\n\n{{}}\n".encode())
    with pytest.raises(ValueError) as caught:
        read_instructions_jsonl(path)
    assert str(caught.value) == f"{path}:4: missing key 'prompt' and 'response' (or 'messages')"
    with pytest.raises(FileNotFoundError):
        read_instructions_jsonl(tmp_path / "missing.jsonl")


def test_the_bundled_tiny_instructions_read():
    examples = read_instructions_jsonl(TINY_INSTRUCTIONS)
    pairs = [example for example in examples if isinstance(example, InstructionExample)]
    conversations = [example for example in examples if isinstance(example, Conversation)]
    assert len(pairs) >= 35 and len(conversations) == 3
    assert len({example.prompt for example in pairs}) == len(pairs)
    formatter = PlainChatFormatter()
    for example in examples:
        assert "".join(text for text, _ in formatter.segments(example)) == formatter.format(
            example
        )


# --- formatting -----------------------------------------------------------------------------


def test_the_training_text_of_a_pair():
    formatter = PlainChatFormatter()
    example = InstructionExample("What is 2 + 2?", "4")
    assert formatter.format(example) == "### User:\nWhat is 2 + 2?\n### Assistant:\n4\n"
    prompt = formatter.format_prompt("What is 2 + 2?")
    assert prompt == "### User:\nWhat is 2 + 2?\n### Assistant:\n"
    assert formatter.segments(example) == (
        ("### User:\nWhat is 2 + 2?\n### Assistant:\n", False),
        ("4\n", True),
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_training_text_is_what_serving_renders(example):
    formatter = PlainChatFormatter()
    messages = example.as_conversation().messages
    text = formatter.format(example)
    assert text == PlainChatTemplate().render(messages, add_generation_prompt=False)
    assert text.endswith("\n")


@pytest.mark.parametrize("example", EXAMPLES)
def test_segments_concatenate_to_the_text_and_flag_exactly_the_assistant_content(example):
    formatter = PlainChatFormatter()
    segments = formatter.segments(example)
    assert "".join(text for text, _ in segments) == formatter.format(example)
    assert all(text for text, _ in segments)
    assert all(first[1] != second[1] for first, second in zip(segments, segments[1:]))
    assert segments[-1][1] is True  # the text ends with the assistant's content
    trained = "".join(text for text, flag in segments if flag)
    expected = "".join(
        message.content.strip(" \t\n\r\f\v") + "\n"
        for message in example.as_conversation().messages
        if message.role == "assistant"
    )
    assert trained == expected
    for text, flag in segments:
        assert ("### " in text) is (not flag)


def test_format_prompt_is_the_prefix_the_response_continues():
    formatter = PlainChatFormatter()
    for prompt, response in [
        ("What is 2 + 2?", "4"),
        ("  padded \n", "\n response "),
        ("多行\n提示", "Réponse 🙂"),
    ]:
        prompt_text = formatter.format_prompt(prompt)
        full = formatter.format(InstructionExample(prompt, response))
        assert full.startswith(prompt_text)
        assert prompt_text.endswith("### Assistant:\n")
        assert full[len(prompt_text) :] == response.strip(" \t\n\r\f\v") + "\n"
        assert prompt_text == PlainChatTemplate().render([ChatMessage("user", prompt)])
        # The response begins where the trained segment does.
        assert formatter.segments(InstructionExample(prompt, response))[0][0] == prompt_text
    with pytest.raises(ValueError, match="prompt is blank"):
        formatter.format_prompt(" ")
    with pytest.raises(TypeError, match="prompt must be a str"):
        formatter.format_prompt(None)


def test_the_formatter_rejects_other_objects_and_shares_the_stop_sequences():
    formatter = PlainChatFormatter()
    with pytest.raises(TypeError, match="example must be an InstructionExample or a Conversation"):
        formatter.format({"prompt": "P", "response": "R"})
    with pytest.raises(TypeError, match="example must be"):
        formatter.segments("text")
    assert formatter.stop_sequences == PlainChatTemplate().stop_sequences


def test_render_pieces_are_the_lines_of_render():
    template = PlainChatTemplate()
    headers = {header + "\n" for header in PlainChatTemplate.HEADERS.values()}
    for example in EXAMPLES:
        messages = example.as_conversation().messages
        for add_generation_prompt in (False, True):
            pieces = template.render_pieces(messages, add_generation_prompt)
            assert "".join(text for text, _ in pieces) == template.render(
                messages, add_generation_prompt
            )
            roles = [role for _, role in pieces if role is not None]
            assert roles == [message.role for message in messages]
            assert all(text in headers for text, role in pieces if role is None)
            assert all(text.endswith("\n") for text, _ in pieces)


# --- fingerprint ----------------------------------------------------------------------------


def test_the_fingerprint_is_sha256_of_canonical_json():
    examples = (
        InstructionExample("Café?", " Oui "),
        Conversation((ChatMessage("user", "🙂"), ChatMessage("assistant", "ok"))),
    )
    canonical = (
        '[{"prompt":"Café?","response":" Oui "},'
        '{"messages":[{"content":"🙂","role":"user"},{"content":"ok","role":"assistant"}]}]'
    )
    expected = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert instruction_fingerprint(examples) == expected
    assert instruction_fingerprint(list(examples)) == expected
    assert instruction_fingerprint(iter(examples)) == expected
    assert instruction_fingerprint(()) == hashlib.sha256(b"[]").hexdigest()


def test_the_fingerprint_follows_content_and_order():
    a, b = InstructionExample("a", "1"), InstructionExample("b", "2")
    assert instruction_fingerprint([a, b]) != instruction_fingerprint([b, a])
    assert instruction_fingerprint([a]) != instruction_fingerprint([InstructionExample("a", "1 ")])
    # The two shapes of the same turns are different records.
    assert instruction_fingerprint([a]) != instruction_fingerprint([a.as_conversation()])
    with pytest.raises(TypeError, match=r"examples\[1\] must be an InstructionExample"):
        instruction_fingerprint([a, {"prompt": "b", "response": "2"}])
    with pytest.raises(TypeError, match="examples must be an iterable"):
        instruction_fingerprint("ab")


def test_importing_instructions_loads_no_library_and_no_third_party_module(run_python):
    result = run_python(
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import riftco_transformer.instructions\n"
        "from riftco_transformer.native import _loader\n"
        "top = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "outside = top - set(sys.stdlib_module_names) - {'riftco_transformer', '__main__'}\n"
        "print(json.dumps([sorted(outside), _loader._loaded_library is None]))\n",
        environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": "/nonexistent/library.so"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[], true]"



def test_split_examples_is_deterministic_disjoint_and_order_independent():
    from riftco_transformer.instructions import InstructionSplits, split_examples

    examples = [InstructionExample(f"question {i}", f"answer {i}") for i in range(200)]
    splits = split_examples(examples + examples[:5], 0.2, 0.1, seed=3)
    assert isinstance(splits, InstructionSplits)
    names = [set(e.prompt for e in getattr(splits, n)) for n in ("train", "validation", "test")]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])
    assert sum(map(len, names)) == 200  # the five duplicates are dropped
    assert 20 < len(splits.validation) < 60 and 5 < len(splits.test) < 35
    shuffled = split_examples(list(reversed(examples)), 0.2, 0.1, seed=3)
    assert set(shuffled.validation) == set(splits.validation)
    assert split_examples(examples, 0.2, 0.1, seed=4).validation != splits.validation
    assert set(splits.fingerprints()) == {"train", "validation", "test"}
    for arguments, error in (((0.0,), ValueError), ((1.0,), ValueError), ((0.6, 0.5), ValueError),
                             ((True,), TypeError)):
        with pytest.raises(error):
            split_examples(examples, *arguments)
    with pytest.raises(ValueError, match="validation split is empty"):
        split_examples(examples[:1], 0.01)
