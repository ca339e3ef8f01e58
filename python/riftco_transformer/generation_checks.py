"""Generation checks on held-out prompts: does the model, prompted in its chat template, answer
what it should?

A check is a prompt and an expectation, one JSON object per line of a JSONL file::

    {"prompt": "What is 2 + 2?", "expect": "4"}
    {"prompt": "Name a colour.", "match": "(?i)red|green|blue", "max_new_tokens": 8}

``expect`` passes when the response, stripped of surrounding whitespace, equals the expected
text (stripped too); ``match`` passes when :func:`re.search` finds the regular expression in
the stripped response. ``max_new_tokens`` bounds that check's response (default: the file's,
:func:`read_generation_checks_jsonl`'s ``max_new_tokens``, 64).

:func:`run_generation_checks` answers every prompt as ``riftco chat`` does: the user turn is
encoded in the chat template (:func:`~.serving.chat.encode_chat`, the template's control tokens
only), then greedy decoding through the KV-cached :class:`~.serving.generation.TextGenerator`
until the template's stop sequences, the end token or ``max_new_tokens``. The result is a
:class:`GenerationCheckMetric` (``phase="generation"``), the record post-training publishes
beside its validation losses.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .instructions import json_type, jsonl_records

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "GenerationCheck",
    "GenerationCheckMetric",
    "GenerationCheckOutcome",
    "parse_generation_checks_jsonl",
    "read_generation_checks_jsonl",
    "run_generation_checks",
]

DEFAULT_MAX_NEW_TOKENS = 64
# The most new tokens a check may ask for (a check is a short answer, not a document).
MAXIMUM_NEW_TOKENS = 1 << 16
# How much of a response a record keeps.
RECORDED_TEXT_LIMIT = 200
_KEYS = ("prompt", "expect", "match", "max_new_tokens")


def _require_max_new_tokens(value: object, name: str = "max_new_tokens") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 1 <= value <= MAXIMUM_NEW_TOKENS:
        raise ValueError(f"{name} must be an integer in 1..{MAXIMUM_NEW_TOKENS}, got {value!r}")
    return value


@dataclass(frozen=True)
class GenerationCheck:
    """One prompt and exactly one of ``expect`` (the exact response, surrounding whitespace
    aside) or ``match`` (a regular expression :func:`re.search` must find in it).

    TypeError for a field of the wrong type, ValueError for a blank prompt, both or neither
    expectation, an invalid regular expression or ``max_new_tokens`` outside 1..65536."""

    prompt: str
    expect: str | None = None
    match: str | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise TypeError(f"prompt must be a str, not {type(self.prompt).__name__}")
        if not self.prompt.strip():
            raise ValueError("prompt is blank")
        for name in ("expect", "match"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        if (self.expect is None) == (self.match is None):
            raise ValueError("a check needs exactly one of 'expect' and 'match', got "
                             + ("both" if self.expect is not None else "neither"))
        if self.match is not None:
            try:
                re.compile(self.match)
            except re.error as error:
                raise ValueError(f"'match' {self.match!r} is not a valid regular expression: "
                                 f"{error}") from None
        _require_max_new_tokens(self.max_new_tokens)

    def passes(self, response: str) -> bool:
        """Whether ``response`` (the decoded answer, without the end token) meets the check."""
        text = response.strip()
        if self.expect is not None:
            return text == self.expect.strip()
        return re.search(self.match, text) is not None

    def to_record(self) -> dict:
        """The JSONL record of this check."""
        record: dict = {"prompt": self.prompt}
        if self.expect is not None:
            record["expect"] = self.expect
        else:
            record["match"] = self.match
        record["max_new_tokens"] = self.max_new_tokens
        return record


@dataclass(frozen=True)
class GenerationCheckOutcome:
    """How one check went: ``index`` (its position among the checks, 0-based), whether it
    ``passed``, the response (``generated``, stripped, cut to 200 characters with ``"..."``
    when longer), its ``generated_token_count`` (every token sampled, the end token included)
    and ``finish_reason`` (``"length"``, ``"stop"`` or ``"end_token"``)."""

    index: int
    passed: bool
    generated: str
    generated_token_count: int
    finish_reason: str


@dataclass(frozen=True)
class GenerationCheckMetric:
    """One round of generation checks, published as a metric (``phase`` ``"generation"``): at
    ``step`` (0 or the resumed step: before training), ``passed`` of ``total`` checks passed;
    ``checks`` holds each one's :class:`GenerationCheckOutcome`. It has no ``loss``: loss
    curves and early stopping leave it alone."""

    phase: str
    step: int
    passed: int
    total: int
    checks: tuple[GenerationCheckOutcome, ...]
    elapsed_seconds: float | None = None

    @property
    def summary(self) -> str:
        """``"7/10 passed"``."""
        return f"{self.passed}/{self.total} passed"


def _recorded(text: str) -> str:
    if len(text) <= RECORDED_TEXT_LIMIT:
        return text
    return text[:RECORDED_TEXT_LIMIT - 3] + "..."


def require_generation_checks(checks) -> tuple[GenerationCheck, ...]:
    """``checks`` (a sequence of :class:`GenerationCheck`, or None) as a tuple; TypeError
    otherwise."""
    if checks is None:
        return ()
    if isinstance(checks, (str, bytes)) or not isinstance(checks, Sequence):
        raise TypeError(f"generation_checks must be a sequence of GenerationCheck, not "
                        f"{type(checks).__name__}")
    for index, check in enumerate(checks):
        if not isinstance(check, GenerationCheck):
            raise TypeError(f"generation_checks[{index}] must be a GenerationCheck, not "
                            f"{type(check).__name__}")
    return tuple(checks)


def run_generation_checks(model, tokenizer, chat_template, checks: Sequence[GenerationCheck],
                          step: int = 0, end_token_id: int | None = None
                          ) -> GenerationCheckMetric:
    """Answer every check's prompt with ``model`` (greedy, KV-cached; see the module docstring)
    and score it. ``end_token_id`` ends a response when sampled (default: the tokenizer's
    ``eos_id``, as :class:`~.pretrained.PretrainedModel` does).

    The generator's KV-cache pool pins the model's parameters while it lives: it is closed
    before this returns, so an optimizer can step again."""
    from .serving.chat import encode_chat
    from .serving.generation import TextGenerator

    checks = require_generation_checks(checks)
    if end_token_id is None:
        end_token_id = getattr(tokenizer, "eos_id", None)
    stop = tuple(dict.fromkeys(chat_template.stop_sequences))
    started = time.perf_counter()
    outcomes = []
    with TextGenerator(model, tokenizer) as generator:
        for index, check in enumerate(checks):
            prompt = encode_chat(chat_template, tokenizer,
                                 [{"role": "user", "content": check.prompt}])
            result = generator.generate(prompt, max_new_tokens=check.max_new_tokens, stop=stop,
                                        end_token_id=end_token_id)
            response = result.generated_text.strip()
            outcomes.append(GenerationCheckOutcome(
                index, check.passes(response), _recorded(response),
                len(result.generated_token_ids), result.finish_reason))
    return GenerationCheckMetric("generation", step, sum(o.passed for o in outcomes),
                                 len(outcomes), tuple(outcomes),
                                 time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------
# JSONL


def read_generation_checks_jsonl(path: str | os.PathLike,
                                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
                                 ) -> tuple[GenerationCheck, ...]:
    """The checks of the JSONL file at ``path``, in file order; ``max_new_tokens`` is the
    default of the checks that do not set their own. Errors as for
    :func:`parse_generation_checks_jsonl` (``source`` is the path); FileNotFoundError when the
    file does not exist."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    source = os.fsdecode(os.fspath(path))
    with open(path, "rb") as stream:
        return _parse_lines(stream, source, max_new_tokens)


def parse_generation_checks_jsonl(text: str | bytes, source: str = "<text>",
                                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
                                  ) -> tuple[GenerationCheck, ...]:
    """The checks of JSONL content: UTF-8, one JSON object per nonblank line with a string
    ``prompt``, exactly one of a string ``expect`` or a string ``match`` (a valid regular
    expression), and optionally ``max_new_tokens`` (an integer in 1..65536); no other key.

    Any problem is a ValueError starting ``f"{source}:{line_number}: "`` that says what is
    wrong (content without any check: ``f"{source}: no generation checks"``)."""
    if isinstance(text, str):
        lines: Iterable[str | bytes] = text.split("\n")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        lines = bytes(text).split(b"\n")
    else:
        raise TypeError(f"text must be a str or bytes, not {type(text).__name__}")
    return _parse_lines(lines, source, max_new_tokens)


def _parse_lines(lines: Iterable[str | bytes], source: str,
                 max_new_tokens: int) -> tuple[GenerationCheck, ...]:
    _require_max_new_tokens(max_new_tokens)
    return jsonl_records(lines, source, lambda record: _check_from_record(record, max_new_tokens),
                         "generation checks")


def _check_from_record(record: dict, max_new_tokens: int) -> GenerationCheck:
    unknown = [key for key in record if key not in _KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (a check has {', '.join(_KEYS)})")
    if "prompt" not in record:
        raise ValueError("missing key 'prompt'")
    for key in ("prompt", "expect", "match"):
        if key in record and not isinstance(record[key], str):
            raise ValueError(f"{key!r} must be a string, got {json_type(record[key])}")
    if "expect" in record and "match" in record:
        raise ValueError("has both 'expect' and 'match': give one of them")
    if "expect" not in record and "match" not in record:
        raise ValueError("needs 'expect' (the exact response) or 'match' (a regular expression)")
    if "max_new_tokens" in record:
        _require_max_new_tokens(record["max_new_tokens"], "'max_new_tokens'")
    return GenerationCheck(record["prompt"], record.get("expect"), record.get("match"),
                           record.get("max_new_tokens", max_new_tokens))
