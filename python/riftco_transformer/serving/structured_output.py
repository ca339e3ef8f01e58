"""Constrained decoding: a JSON schema compiled to a grammar, and a per-step token mask.

OpenAI's ``response_format`` ``json_object`` and ``json_schema`` (and required tool calls,
:mod:`.tool_calls`) promise text that parses as JSON and validates against a schema. The
promise is kept by masking: before each token is sampled, every token whose bytes the
grammar cannot consume from where the text stands is ruled out.

* :func:`compile_schema` turns a schema (a mapping; None: any JSON object) into a
  :class:`Grammar`. What it cannot enforce is a :class:`SchemaError` (a ValueError) naming
  the JSON path of the keyword and its value (``$.properties.age.type: ...``).
* :class:`TokenVocabulary` is a tokenizer's bytes per token id, indexed once per tokenizer
  (:meth:`TokenVocabulary.from_tokenizer` caches it): a byte trie of the ordinary tokens, and
  which tokens are plain string characters.
* :class:`Matcher` follows one generation: :meth:`Matcher.allowed_tokens` is the mask of
  the next step (a ``bytes`` of V entries, 1 = allowed), :meth:`Matcher.advance` takes the
  sampled id. A token is allowed iff all its bytes can be consumed, so a token may span
  grammar boundaries (``":"``, ``"},``). Control tokens (and tokens of no bytes) are never
  allowed, except the end ids, which are allowed exactly when the text so far is a complete
  value (:meth:`Matcher.can_end`). When nothing more can follow (:meth:`Matcher.is_complete`)
  only the end ids are allowed; a caller may stop there without sampling.
* The mask is applied to the logits before everything else: mask, then the penalties,
  top-k, temperature, top-p, min-p and the draw (``serving.sampling``'s samplers take
  ``mask=``; :func:`~.sampling.apply_mask` gives a row with ``-inf`` where the mask is 0).

The schema subset (what OpenAI's structured outputs use):

* ``type``: ``object``, ``array``, ``string``, ``number``, ``integer``, ``boolean``,
  ``null``, or a list of them (``["string", "null"]``); ``nullable: true`` (OpenAPI) adds
  ``null``. Without ``type``, ``properties``/``required``/``additionalProperties`` mean an
  object, ``items``/``minItems``/``maxItems`` an array, ``minLength``/``maxLength`` a
  string, and nothing at all any JSON value.
* Objects: ``properties`` (generated in their declared order), ``required`` (the others may
  be left out; a required name must be among the properties), ``additionalProperties``:
  properties not declared are never generated, so
  ``false``, ``true``, absent or a schema are all honoured when ``properties`` is given;
  without ``properties``, ``false`` means ``{}``, ``true``/absent any object and a schema an
  object whose values all match it (keys are any strings).
* Arrays: ``items`` (absent or ``true``: any values; ``false``: no items), ``minItems``,
  ``maxItems``. Strings: ``minLength``, ``maxLength`` (in characters). ``enum``, ``const``
  (compact JSON, with ``type`` filtering the listed values). ``anyOf``, ``oneOf`` (generated
  like ``anyOf``: a value matching two branches is possible), ``allOf`` of one schema.
  ``$ref`` to ``#``, ``#/$defs/...``, ``#/definitions/...`` or any local JSON pointer,
  recursive too (a recursion that consumes nothing, or has no finite instance, is an error).
  The boolean schemas ``true`` and ``false``.
* Ignored (annotations only): ``title``, ``description``, ``default``, ``examples``,
  ``$comment``, ``$schema``, ``$id``, ``$anchor``, ``deprecated``, ``readOnly``,
  ``writeOnly``, ``uniqueItems: false``, ``$defs``/``definitions`` (read through ``$ref``).
* Everything else (``pattern``, ``format``, ``minimum``, ``multipleOf``, ``not``,
  ``prefixItems``, ``uniqueItems: true``, ...) is a SchemaError naming it.

What is generated (a subset of the valid texts, chosen to keep generation finite):

* Whitespace: at most ``max_whitespace`` bytes (default 20) of space, tab, newline or
  carriage return at each place JSON allows it (before the value, around ``:`` ``,`` and
  inside brackets), none after the top-level value: the model cannot loop on whitespace.
* Numbers: at most 19 integer digits, 16 fraction digits and 3 exponent digits; integers
  have no fraction or exponent. Strings: any character, escapes included, except ``\\u``
  escapes of surrogates (so each escape is one character for ``minLength``/``maxLength``).
"""

from __future__ import annotations

import codecs
import json
import math
import re
import threading
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from ..native._validation import describe_value

DEFAULT_MAX_WHITESPACE = 20
MAXIMUM_COUNT = 10_000  # the largest minLength/maxLength/minItems/maxItems compiled
INTEGER_DIGITS = 19
FRACTION_DIGITS = 16
EXPONENT_DIGITS = 3

_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "$schema", "$id", "$anchor", "deprecated", "readOnly", "writeOnly",
                          "$defs", "definitions"})
_OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties"})
_ARRAY_KEYWORDS = frozenset({"items", "minItems", "maxItems"})
_STRING_KEYWORDS = frozenset({"minLength", "maxLength"})
_SUPPORTED = (_ANNOTATIONS | _OBJECT_KEYWORDS | _ARRAY_KEYWORDS | _STRING_KEYWORDS
              | {"type", "nullable", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                 "uniqueItems"})
_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")


class SchemaError(ValueError):
    """A schema this module cannot compile: ``path`` is the JSON path of the offending
    keyword (``$.properties.age.type``), and the message names it and its value."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.detail = message


def _child(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


# ---- the grammar: a recursive transition network over bytes ------------------------------------
#
# Every rule is a small NFA whose edges consume a byte, consume nothing (epsilon) or call
# another rule (push the return state, go to the callee's start). A rule returns from any of
# its final states. A matcher's place is a set of stacks of states (the top is where the
# innermost rule stands); sets of stacks are interned as the states of a DFA built lazily.


class _Nfa:
    def __init__(self) -> None:
        self.final: list[bool] = []
        self.edges: list[dict[int, list[int]]] = []
        self.epsilon: list[list[int]] = []
        self.calls: list[list[tuple[int, int]]] = []
        # For a state of a string between characters: how many more plain characters the
        # string takes (math.inf: no limit); None elsewhere.
        self.room: list[float | None] = []
        self.rule_of: list[int] = []  # the start state of the rule each state belongs to
        self.rule_paths: dict[int, str] = {}  # rule start -> the schema path it compiles
        self._rule = -1

    def state(self, final: bool = False) -> int:
        self.final.append(final)
        self.edges.append({})
        self.epsilon.append([])
        self.calls.append([])
        self.room.append(None)
        self.rule_of.append(self._rule)
        return len(self.final) - 1

    def begin_rule(self, path: str) -> tuple[int, int]:
        """A new rule's start state (its states are made until end_rule), and the rule
        being built before it (to give back to end_rule)."""
        outer = self._rule
        self._rule = len(self.final)
        start = self.state()
        self.rule_paths[start] = path
        return start, outer

    def end_rule(self, outer: int) -> None:
        self._rule = outer

    def add_bytes(self, source: int, values: Iterable[int], target: int) -> None:
        edges = self.edges[source]
        for value in values:
            targets = edges.setdefault(value, [])
            if target not in targets:
                targets.append(target)

    def literal(self, source: int, data: bytes) -> int:
        for value in data:
            target = self.state()
            self.add_bytes(source, (value,), target)
            source = target
        return source

    def add_epsilon(self, source: int, target: int) -> None:
        if target not in self.epsilon[source]:
            self.epsilon[source].append(target)

    def call(self, source: int, rule: int) -> int:
        target = self.state()
        self.calls[source].append((rule, target))
        return target


_WHITESPACE = b" \t\n\r"
_DIGITS = b"0123456789"
_HEX = b"0123456789abcdefABCDEF"
_HEX_NOT_D = bytes(value for value in _HEX if value not in b"dD")


class _Compiler:
    def __init__(self, root: object, max_whitespace: int) -> None:
        self.root = root
        self.nfa = _Nfa()
        self.max_whitespace = max_whitespace
        self.refs: dict[str, int] = {}
        self._shared: dict[str, int] = {}
        self._head: list[str] = []  # the $refs entered since the last consumed byte

    # -- shared rules --

    def _shared_rule(self, name: str, build) -> int:
        rule = self._shared.get(name)
        if rule is None:
            start, outer = self.nfa.begin_rule(f"({name})")
            self._shared[name] = start
            build(start)
            self.nfa.end_rule(outer)
            rule = start
        return rule

    def whitespace(self, source: int) -> int:
        """``source`` followed by optional bounded whitespace (a call), or itself when none
        is allowed."""
        if self.max_whitespace == 0:
            return source

        def build(start: int) -> None:
            nfa = self.nfa
            nfa.final[start] = True
            state = start
            for _ in range(self.max_whitespace):
                following = nfa.state(final=True)
                nfa.add_bytes(state, _WHITESPACE, following)
                state = following

        return self.nfa.call(source, self._shared_rule("whitespace", build))

    def character(self) -> int:
        """One character of a JSON string's body: plain, escaped or UTF-8 (RFC 3629)."""

        def build(start: int) -> None:
            nfa = self.nfa
            done = nfa.state(final=True)
            plain = [value for value in range(0x20, 0x80) if value not in (0x22, 0x5C)]
            nfa.add_bytes(start, plain, done)
            escape = nfa.state()
            nfa.add_bytes(start, b"\\", escape)
            nfa.add_bytes(escape, b'"\\/bfnrt', done)
            unicode = [nfa.state() for _ in range(4)]  # after \u, \uX, \uXX, \uXXX
            surrogate = nfa.state()  # after \uD: 0-7 only (no surrogates)
            nfa.add_bytes(escape, b"u", unicode[0])
            nfa.add_bytes(unicode[0], _HEX_NOT_D, unicode[1])
            nfa.add_bytes(unicode[0], b"dD", surrogate)
            nfa.add_bytes(surrogate, b"01234567", unicode[2])
            nfa.add_bytes(unicode[1], _HEX, unicode[2])
            nfa.add_bytes(unicode[2], _HEX, unicode[3])
            nfa.add_bytes(unicode[3], _HEX, done)
            last = nfa.state()  # one continuation byte left
            nfa.add_bytes(last, range(0x80, 0xC0), done)
            nfa.add_bytes(start, range(0xC2, 0xE0), last)
            two = nfa.state()  # two continuation bytes left
            nfa.add_bytes(two, range(0x80, 0xC0), last)
            e0, ed = nfa.state(), nfa.state()
            nfa.add_bytes(start, (0xE0,), e0)
            nfa.add_bytes(e0, range(0xA0, 0xC0), last)
            nfa.add_bytes(start, [*range(0xE1, 0xED), 0xEE, 0xEF], two)
            nfa.add_bytes(start, (0xED,), ed)
            nfa.add_bytes(ed, range(0x80, 0xA0), last)
            f0, f4 = nfa.state(), nfa.state()
            nfa.add_bytes(start, (0xF0,), f0)
            nfa.add_bytes(f0, range(0x90, 0xC0), two)
            three = nfa.state()
            nfa.add_bytes(start, range(0xF1, 0xF4), three)
            nfa.add_bytes(three, range(0x80, 0xC0), two)
            nfa.add_bytes(start, (0xF4,), f4)
            nfa.add_bytes(f4, range(0x80, 0x90), two)

        return self._shared_rule("character", build)

    def string(self, minimum: int = 0, maximum: int | None = None) -> int:
        """A JSON string of ``minimum`` to ``maximum`` characters (None: no limit)."""

        def build(start: int) -> None:
            nfa = self.nfa
            character = self.character()
            end = nfa.state(final=True)
            counts = [nfa.literal(start, b'"')]
            last = minimum if maximum is None else maximum
            for _ in range(last):
                counts.append(nfa.call(counts[-1], character))
            if maximum is None:
                nfa.calls[counts[-1]].append((character, counts[-1]))
            for index, state in enumerate(counts):
                nfa.room[state] = math.inf if maximum is None else maximum - index
                if index >= minimum:
                    nfa.add_bytes(state, b'"', end)

        return self._shared_rule(f"string {minimum} {maximum}", build)

    def number(self, integer: bool) -> int:
        def build(start: int) -> None:
            nfa = self.nfa
            sign = nfa.state()
            nfa.add_bytes(start, b"-", sign)
            zero = nfa.state(final=True)
            whole = [nfa.state(final=True) for _ in range(INTEGER_DIGITS)]
            for state in (start, sign):
                nfa.add_bytes(state, b"0", zero)
                nfa.add_bytes(state, b"123456789", whole[0])
            for state, following in zip(whole, whole[1:], strict=False):
                nfa.add_bytes(state, _DIGITS, following)
            if integer:
                return
            ends = [zero, *whole]
            point = nfa.state()
            fraction = [nfa.state(final=True) for _ in range(FRACTION_DIGITS)]
            nfa.add_bytes(point, _DIGITS, fraction[0])
            for state, following in zip(fraction, fraction[1:], strict=False):
                nfa.add_bytes(state, _DIGITS, following)
            exponent, exponent_sign = nfa.state(), nfa.state()
            power = [nfa.state(final=True) for _ in range(EXPONENT_DIGITS)]
            nfa.add_bytes(exponent, b"+-", exponent_sign)
            for state in (exponent, exponent_sign):
                nfa.add_bytes(state, _DIGITS, power[0])
            for state, following in zip(power, power[1:], strict=False):
                nfa.add_bytes(state, _DIGITS, following)
            for state in ends:
                nfa.add_bytes(state, b".", point)
            for state in (*ends, *fraction):
                nfa.add_bytes(state, b"eE", exponent)

        return self._shared_rule("integer" if integer else "number", build)

    def any_value(self) -> int:
        def build(start: int) -> None:
            nfa = self.nfa
            end = nfa.state(final=True)
            for rule in (self.string(), self.number(False), self._map(start),
                         self._list(start, 0, None), self._literals((True, False, None))):
                nfa.add_epsilon(nfa.call(start, rule), end)

        return self._shared_rule("any value", build)

    # -- composite rules --

    def _literals(self, values: Sequence[object]) -> int:
        texts = []
        for value in values:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode("utf-8")
            if text not in texts:
                texts.append(text)

        def build(start: int) -> None:
            for text in texts:
                end = self.nfa.literal(start, text)
                self.nfa.final[end] = True

        key = "literals " + json.dumps([t.decode("utf-8") for t in texts])
        return self._shared_rule(key, build)

    def _map(self, value_rule: int | None) -> int:
        """An object whose keys are any strings and whose values match ``value_rule`` (None:
        any value)."""
        values = self.any_value() if value_rule is None else value_rule

        def build(start: int) -> None:
            nfa = self.nfa
            end = nfa.state(final=True)
            inside = self.whitespace(nfa.literal(start, b"{"))
            nfa.add_bytes(inside, b"}", end)

            def member(source: int) -> int:
                state = self.whitespace(nfa.call(source, self.string()))
                state = self.whitespace(nfa.literal(state, b":"))
                return self.whitespace(nfa.call(state, values))

            after = member(inside)
            nfa.add_bytes(after, b"}", end)
            again = self.whitespace(nfa.literal(after, b","))
            nfa.add_epsilon(member(again), after)

        return self._shared_rule(f"map {values}", build)

    def _list(self, item_rule: int | None, minimum: int, maximum: int | None) -> int:
        """An array of ``minimum`` to ``maximum`` (None: any number of) items matching
        ``item_rule`` (None: any value)."""
        items = self.any_value() if item_rule is None else item_rule

        def build(start: int) -> None:
            nfa = self.nfa
            end = nfa.state(final=True)
            inside = self.whitespace(nfa.literal(start, b"["))
            if minimum == 0:
                nfa.add_bytes(inside, b"]", end)
            if maximum == 0:
                return
            counted = [self.whitespace(nfa.call(inside, items))]  # after 1, 2, ... items
            last = max(minimum, 1) if maximum is None else maximum
            while len(counted) < last:
                separator = self.whitespace(nfa.literal(counted[-1], b","))
                counted.append(self.whitespace(nfa.call(separator, items)))
            if maximum is None:
                separator = self.whitespace(nfa.literal(counted[-1], b","))
                nfa.add_epsilon(self.whitespace(nfa.call(separator, items)), counted[-1])
            for count, state in enumerate(counted, start=1):
                if count >= minimum:
                    nfa.add_bytes(state, b"]", end)

        return self._shared_rule(f"list {items} {minimum} {maximum}", build)

    # -- schemas --

    def schema(self, schema: object, path: str) -> int:
        """The rule of ``schema`` (at ``path``)."""
        if schema is True:
            return self.any_value()
        if schema is False:
            start, outer = self.nfa.begin_rule(path)  # no final state: nothing matches
            self.nfa.end_rule(outer)
            return start
        if not isinstance(schema, Mapping):
            raise SchemaError(path, f"a schema must be an object or a boolean, not "
                                    f"{describe_value(schema)}")
        for key in schema:
            if key not in _SUPPORTED:
                raise SchemaError(_child(path, key),
                                  f"the keyword {key!r} is not supported (value "
                                  f"{describe_value(schema[key])})")
        if schema.get("uniqueItems", False) is not False:
            raise SchemaError(_child(path, "uniqueItems"),
                              f"only uniqueItems false is supported, not "
                              f"{describe_value(schema['uniqueItems'])}")
        if "$ref" in schema:
            return self._reference(schema, path)
        start, outer = self.nfa.begin_rule(path)
        saved_head = self._head
        try:
            end = self.nfa.state(final=True)
            for rule in self._alternatives(schema, path):
                self.nfa.add_epsilon(self.nfa.call(start, rule), end)
        finally:
            self._head = saved_head
            self.nfa.end_rule(outer)
        return start

    def _reference(self, schema: Mapping, path: str) -> int:
        reference = schema["$ref"]
        where = _child(path, "$ref")
        if not isinstance(reference, str):
            raise SchemaError(where, f"$ref must be a string, not {describe_value(reference)}")
        extra = sorted(set(schema) - _ANNOTATIONS - {"$ref"})
        if extra:
            raise SchemaError(_child(path, extra[0]),
                              f"keywords beside $ref are not supported ({', '.join(extra)})")
        if reference in self._head:
            raise SchemaError(where, f"$ref {reference!r} refers back to itself before any "
                                     f"text is generated (a left recursion)")
        known = self.refs.get(reference)
        if known is not None:
            return known
        target, target_path = self._resolve(reference, where)
        start, outer = self.nfa.begin_rule(target_path)
        self.refs[reference] = start
        self._head = [*self._head, reference]
        try:
            end = self.nfa.state(final=True)
            self.nfa.add_epsilon(self.nfa.call(start, self.schema(target, target_path)), end)
        finally:
            self._head = self._head[:-1]
            self.nfa.end_rule(outer)
        return start

    def _resolve(self, reference: str, where: str) -> tuple[object, str]:
        if not reference.startswith("#"):
            raise SchemaError(where, f"only local references (starting with '#') are "
                                     f"supported, not {reference!r}")
        pointer = reference[1:]
        if pointer and not pointer.startswith("/"):
            raise SchemaError(where, f"{reference!r} is not a JSON pointer (anchors are not "
                                     f"supported)")
        node, path = self.root, "$"
        for part in pointer.split("/")[1:] if pointer else ():
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node, path = node[key], _child(path, key)
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node, path = node[int(key)], _child(path, int(key))
            else:
                raise SchemaError(where, f"$ref {reference!r} points at nothing")
        return node, path

    def _alternatives(self, schema: Mapping, path: str) -> list[int]:
        """The rules whose union ``schema`` means."""
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                options = schema[keyword]
                where = _child(path, keyword)
                if not isinstance(options, list) or not options:
                    raise SchemaError(where, f"{keyword} must be a nonempty list, not "
                                             f"{describe_value(options)}")
                rest = sorted(set(schema) - _ANNOTATIONS - {keyword})
                if rest:
                    raise SchemaError(_child(path, rest[0]), f"keywords beside {keyword} are "
                                                             f"not supported ({', '.join(rest)})")
                return [self.schema(option, _child(where, index))
                        for index, option in enumerate(options)]
        if "allOf" in schema:
            options = schema["allOf"]
            where = _child(path, "allOf")
            if not isinstance(options, list) or len(options) != 1:
                raise SchemaError(where, f"only allOf of exactly one schema is supported, not "
                                         f"{describe_value(options)}")
            rest = sorted(set(schema) - _ANNOTATIONS - {"allOf"})
            if rest:
                raise SchemaError(_child(path, rest[0]), f"keywords beside allOf are not "
                                                         f"supported ({', '.join(rest)})")
            return [self.schema(options[0], _child(where, 0))]
        types = self._types(schema, path)
        if "enum" in schema or "const" in schema:
            return [self._enumeration(schema, path, types)]
        self._head = []  # every typed value starts with a byte
        return [self._typed(kind, schema, path) for kind in types]

    def _types(self, schema: Mapping, path: str) -> list[str]:
        where = _child(path, "type")
        kinds = schema.get("type")
        if kinds is None:
            if "enum" in schema or "const" in schema:
                kinds = []
            elif _OBJECT_KEYWORDS & set(schema):
                kinds = ["object"]
            elif _ARRAY_KEYWORDS & set(schema):
                kinds = ["array"]
            elif _STRING_KEYWORDS & set(schema):
                kinds = ["string"]
            else:
                kinds = ["any"]
        elif isinstance(kinds, str):
            kinds = [kinds]
        elif not isinstance(kinds, list) or not kinds:
            raise SchemaError(where, f"type must be a string or a nonempty list of strings, "
                                     f"not {describe_value(kinds)}")
        for index, kind in enumerate(kinds):
            if kind not in _TYPES and kind != "any" or (kind == "any" and "type" in schema):
                at = where if isinstance(schema.get("type"), str) else _child(where, index)
                raise SchemaError(at, f"{describe_value(kind)} is not a JSON Schema type "
                                      f"(one of {', '.join(_TYPES)})")
        nullable = schema.get("nullable", False)
        if not isinstance(nullable, bool):
            raise SchemaError(_child(path, "nullable"),
                              f"nullable must be true or false, not {describe_value(nullable)}")
        if nullable and "any" not in kinds and "null" not in kinds:
            kinds = [*kinds, "null"]
        for keywords, kind in ((_OBJECT_KEYWORDS, "object"), (_ARRAY_KEYWORDS, "array"),
                               (_STRING_KEYWORDS, "string")):
            used = sorted(keywords & set(schema))
            if used and "any" not in kinds and kind not in kinds:
                raise SchemaError(_child(path, used[0]),
                                  f"{used[0]} applies to {kind}s, but type is "
                                  f"{describe_value(schema.get('type'))}")
        return kinds

    def _enumeration(self, schema: Mapping, path: str, types: list[str]) -> int:
        if "enum" in schema and "const" in schema:
            raise SchemaError(_child(path, "const"), "give enum or const, not both")
        constraints = sorted(set(schema) - _ANNOTATIONS - {"enum", "const", "type", "nullable"})
        if constraints:
            raise SchemaError(_child(path, constraints[0]),
                              f"{constraints[0]} beside enum/const is not supported")
        if "const" in schema:
            values, where = [schema["const"]], _child(path, "const")
        else:
            values, where = schema["enum"], _child(path, "enum")
            if not isinstance(values, list) or not values:
                raise SchemaError(where, f"enum must be a nonempty list, not "
                                         f"{describe_value(values)}")
        for index, value in enumerate(values):
            if not _is_json(value):
                at = where if "const" in schema else _child(where, index)
                raise SchemaError(at, f"{describe_value(value)} is not a JSON value")
        kept = [value for value in values if not types or _json_type(value) in types
                or (_json_type(value) == "integer" and "number" in types)]
        if schema.get("nullable") is True and None not in kept:
            kept.append(None)
        if not kept:
            raise SchemaError(where, f"no value of {describe_value(values)} has the type "
                                     f"{describe_value(schema.get('type'))}")
        return self._literals(kept)

    def _typed(self, kind: str, schema: Mapping, path: str) -> int:
        if kind == "any":
            return self.any_value()
        if kind == "string":
            minimum = _count(schema, "minLength", path, 0)
            maximum = _count(schema, "maxLength", path, None)
            if maximum is not None and maximum < minimum:
                raise SchemaError(_child(path, "maxLength"),
                                  f"maxLength {maximum} is less than minLength {minimum}")
            return self.string(minimum, maximum)
        if kind in ("number", "integer"):
            return self.number(kind == "integer")
        if kind == "boolean":
            return self._literals((True, False))
        if kind == "null":
            return self._literals((None,))
        if kind == "array":
            minimum = _count(schema, "minItems", path, 0)
            maximum = _count(schema, "maxItems", path, None)
            if maximum is not None and maximum < minimum:
                raise SchemaError(_child(path, "maxItems"),
                                  f"maxItems {maximum} is less than minItems {minimum}")
            items = schema.get("items", True)
            if items is False:
                if minimum > 0:
                    raise SchemaError(_child(path, "minItems"),
                                      f"minItems {minimum} with items false")
                maximum = 0
            if isinstance(items, list):
                raise SchemaError(_child(path, "items"), "items as a list (tuple validation) "
                                                         "is not supported; use one schema")
            item_rule = None if items is True or items is False else self.schema(
                items, _child(path, "items"))
            return self._list(item_rule, minimum, maximum)
        return self._object(schema, path)

    def _object(self, schema: Mapping, path: str) -> int:
        properties = schema.get("properties")
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if properties is not None and not isinstance(properties, Mapping):
            raise SchemaError(_child(path, "properties"),
                              f"properties must be an object, not {describe_value(properties)}")
        where = _child(path, "required")
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise SchemaError(where, f"required must be a list of strings, not "
                                     f"{describe_value(required)}")
        if len(set(required)) != len(required):
            raise SchemaError(where, f"required lists a name twice: {describe_value(required)}")
        for index, name in enumerate(required):
            if name not in (properties or {}):
                raise SchemaError(_child(where, index),
                                  f"required property {name!r} is not in properties")
        if not isinstance(extra, (bool, Mapping)):
            raise SchemaError(_child(path, "additionalProperties"),
                              f"additionalProperties must be a boolean or a schema, not "
                              f"{describe_value(extra)}")
        if not properties:
            if extra is False:
                return self._literals(({},))
            if extra is True:
                return self._map(None)
            return self._map(self.schema(extra, _child(path, "additionalProperties")))
        where = _child(path, "properties")
        members = [(name, self.schema(subschema, _child(where, name)), name in required)
                   for name, subschema in properties.items()]
        start, outer = self.nfa.begin_rule(path)
        try:
            self._members(start, members)
        finally:
            self.nfa.end_rule(outer)
        return start

    def _members(self, start: int, members: list[tuple[str, int, bool]]) -> None:
        """``{`` the members in their order (the optional ones may be left out) ``}``."""
        nfa = self.nfa
        end = nfa.state(final=True)
        # places[(index, emitted)]: before member ``index``, with (True) or without (False)
        # a member written already (which a comma must then follow).
        places = {(0, False): self.whitespace(nfa.literal(start, b"{"))}

        def place(index: int, emitted: bool) -> int:
            if (index, emitted) not in places:
                places[(index, emitted)] = nfa.state()
            return places[(index, emitted)]

        for index, (name, rule, is_required) in enumerate(members):
            for emitted in (False, True):
                source = places.get((index, emitted))
                if source is None:
                    continue
                if not is_required:
                    nfa.add_epsilon(source, place(index + 1, emitted))
                state = source
                if emitted:
                    state = self.whitespace(nfa.literal(state, b","))
                key = json.dumps(name, ensure_ascii=False).encode("utf-8")
                state = self.whitespace(nfa.literal(state, key))
                state = self.whitespace(nfa.literal(state, b":"))
                state = self.whitespace(nfa.call(state, rule))
                nfa.add_epsilon(state, place(index + 1, True))
        for emitted in (False, True):
            source = places.get((len(members), emitted))
            if source is not None:
                nfa.add_bytes(source, b"}", end)


def _count(schema: Mapping, keyword: str, path: str, default: int | None) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(_child(path, keyword), f"{keyword} must be a nonnegative integer, "
                                                 f"not {describe_value(value)}")
    if value > MAXIMUM_COUNT:
        raise SchemaError(_child(path, keyword), f"{keyword} {value} is more than this "
                                                 f"server compiles ({MAXIMUM_COUNT})")
    return value


def _is_json(value: object) -> bool:
    if value is None or isinstance(value, (bool, str, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(item) for item in value)
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _prune(nfa: _Nfa) -> set[int]:
    """Cut what can never complete: calls of rules that have no finite match, and edges into
    states from which their rule cannot return. Returns the productive rules (whose start
    can return). Afterwards every state left on a path can finish its rule, so a matcher
    never stands where no byte and no end can follow."""
    count = len(nfa.final)
    rules = set(nfa.rule_paths)
    predecessors: list[list[int]] = [[] for _ in range(count)]  # via bytes and epsilon
    by_return: list[list[tuple[int, int]]] = [[] for _ in range(count)]  # (caller, callee)
    by_callee: dict[int, list[tuple[int, int]]] = {}  # callee -> (caller, return)
    for state in range(count):
        for targets in nfa.edges[state].values():
            for target in targets:
                predecessors[target].append(state)
        for target in nfa.epsilon[state]:
            predecessors[target].append(state)
        for callee, ret in nfa.calls[state]:
            by_return[ret].append((state, callee))
            by_callee.setdefault(callee, []).append((state, ret))
    completes = [False] * count
    productive: set[int] = set()
    todo = [state for state in range(count) if nfa.final[state]]
    for state in todo:
        completes[state] = True
    while todo:
        state = todo.pop()
        candidates = list(predecessors[state])
        candidates += [caller for caller, callee in by_return[state] if callee in productive]
        if state in rules and state not in productive:
            productive.add(state)
            candidates += [caller for caller, ret in by_callee.get(state, ()) if completes[ret]]
        for candidate in candidates:
            if not completes[candidate]:
                completes[candidate] = True
                todo.append(candidate)
    for state in range(count):
        for value, targets in list(nfa.edges[state].items()):
            kept = [target for target in targets if completes[target]]
            if kept:
                nfa.edges[state][value] = kept
            else:
                del nfa.edges[state][value]
        nfa.epsilon[state] = [target for target in nfa.epsilon[state] if completes[target]]
        nfa.calls[state] = [(callee, ret) for callee, ret in nfa.calls[state]
                            if callee in productive and completes[ret]]
    return productive


# ---- the DFA over sets of stacks ------------------------------------------------------------

_DFA_STATE_LIMIT = 200_000  # more interned states than this: the DFA starts over
_MASK_CACHE = 64  # masks kept per grammar (each is V bytes)
_CAN_END, _COMPLETE = 1, 2


class Grammar:
    """A compiled grammar (:func:`compile_schema`). Thread-safe; matchers share its lazily
    built DFA and its cache of masks."""

    def __init__(self, nfa: _Nfa, root: int, description: str) -> None:
        self._nfa = nfa
        self._root = root
        self.description = description
        self._lock = threading.RLock()
        # Per NFA state: nothing leaves it (a final state is then popped at once).
        self._dead_end = [not (nfa.edges[s] or nfa.epsilon[s] or nfa.calls[s])
                          for s in range(len(nfa.final))]
        self._reset()

    def _reset(self) -> None:
        self.epoch = getattr(self, "epoch", -1) + 1
        self._ids: dict[frozenset, int] = {}
        self._configs: list[frozenset] = []
        self._transitions: list[dict[int, int]] = []
        self._ends: list[int] = []  # -1: not computed; else 0, _CAN_END or _COMPLETE
        self._rooms: list = []  # None (unknown yet), False (not a string body) or a room
        self._closures: dict[tuple, tuple[tuple, bool]] = {}
        self._masks: OrderedDict = OrderedDict()
        self.start = self._intern(frozenset({self._normalize((self._root,))}))

    # -- states --

    def _intern(self, config: frozenset) -> int:
        state = self._ids.get(config)
        if state is None:
            state = self._ids[config] = len(self._configs)
            self._configs.append(config)
            self._transitions.append({})
            self._ends.append(-1)
            self._rooms.append(None)
        return state

    def state_of(self, epoch: int, state: int, config: frozenset) -> int:
        """A matcher's state in the current DFA (re-interned after a reset)."""
        if epoch == self.epoch:
            return state
        return self._intern(config)

    def config(self, state: int) -> frozenset:
        return self._configs[state]

    def _normalize(self, stack: tuple) -> tuple:
        dead_end, final = self._dead_end, self._nfa.final
        while stack and final[stack[-1]] and dead_end[stack[-1]]:
            stack = stack[:-1]
        return stack

    def _closure(self, stack: tuple) -> tuple[tuple, bool]:
        """The stacks reachable from ``stack`` without consuming whose top consumes bytes,
        and whether the whole text may end there."""
        cached = self._closures.get(stack)
        if cached is not None:
            return cached
        nfa = self._nfa
        ready, accept, seen, todo = [], False, set(), [stack]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            if not current:
                accept = True
                continue
            top, below = current[-1], current[:-1]
            if nfa.edges[top]:
                ready.append(current)
            for target in nfa.epsilon[top]:
                todo.append((*below, target))
            for callee, ret in nfa.calls[top]:
                todo.append((*below, ret, callee))
            if nfa.final[top]:
                todo.append(below)
        result = self._closures[stack] = (tuple(ready), accept)
        return result

    def step(self, state: int, value: int) -> int:
        """The state after the byte ``value``, or -1 when the byte cannot follow."""
        following = self._transitions[state].get(value)
        if following is not None:
            return following
        with self._lock:
            edges = self._nfa.edges
            out = set()
            for stack in self._configs[state]:
                for ready in self._closure(stack)[0]:
                    targets = edges[ready[-1]].get(value)
                    if targets:
                        below = ready[:-1]
                        for target in targets:
                            out.add(self._normalize((*below, target)))
            following = self._intern(frozenset(out)) if out else -1
            self._transitions[state][value] = following
        return following

    def ending(self, state: int) -> int:
        """0, _CAN_END (the text may end here) or _COMPLETE (it must)."""
        ending = self._ends[state]
        if ending < 0:
            with self._lock:
                accept = live = False
                for stack in self._configs[state]:
                    ready, accepts = self._closure(stack)
                    accept = accept or accepts
                    live = live or bool(ready)
                ending = (_COMPLETE if not live else _CAN_END) if accept else 0
                self._ends[state] = ending
        return ending

    def _room(self, state: int):
        """How many plain characters the state's strings take (the most of them), when every
        stack stands in a string between characters; False otherwise."""
        room = self._rooms[state]
        if room is None:
            rooms = [self._nfa.room[stack[-1]] if stack else None
                     for stack in self._configs[state]]
            room = False if None in rooms else max(rooms)
            self._rooms[state] = room
        return room

    # -- masks --

    def mask(self, state: int, vocabulary: TokenVocabulary) -> bytes:
        key = (vocabulary, state)
        with self._lock:
            cached = self._masks.get(key)
            if cached is not None:
                self._masks.move_to_end(key)
                return cached
            index = vocabulary.index
            ending = self.ending(state)
            if ending == _COMPLETE:
                out = bytearray(index.size)
            else:
                room = self._room(state)
                if room is not False:
                    out = bytearray(index.plain_up_to(room))
                    self._walk(index.string_trie, state, out)
                else:
                    out = bytearray(index.size)
                    self._walk(index.trie, state, out)
            if ending:
                for token in vocabulary.end_ids:
                    out[token] = 1
            mask = bytes(out)
            self._masks[key] = mask
            if len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
            if len(self._configs) > _DFA_STATE_LIMIT:
                self._reset()
            return mask

    def _walk(self, trie: _Trie, state: int, out: bytearray) -> None:
        """Mark every token of ``trie`` whose bytes can all be consumed from ``state``: a
        depth-first walk, each shared prefix once."""
        labels, first, tokens, duplicates = trie.labels, trie.first, trie.tokens, trie.duplicates
        transitions, step = self._transitions, self.step
        todo = [(0, state)]
        pop, push = todo.pop, todo.append
        while todo:
            node, current = pop()
            table = transitions[current]
            base = first[node]
            for offset, value in enumerate(labels[node]):
                following = table.get(value)
                if following is None:
                    following = step(current, value)
                if following < 0:
                    continue
                child = base + offset
                token = tokens[child]
                if token >= 0:
                    out[token] = 1
                    if child in duplicates:
                        for other in duplicates[child]:
                            out[other] = 1
                if labels[child]:
                    push((child, following))

    def accepts(self, text: str | bytes) -> bool:
        """Whether ``text`` is a complete match (for tests and diagnostics)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        state = self.start
        for value in data:
            state = self.step(state, value)
            if state < 0:
                return False
        return self.ending(state) != 0

    def __repr__(self) -> str:
        return f"<Grammar {self.description}>"


_GRAMMARS: OrderedDict = OrderedDict()
_GRAMMARS_LOCK = threading.Lock()
_GRAMMAR_CACHE = 16


def compile_schema(schema: Mapping | bool | None, *, max_whitespace: int =
                   DEFAULT_MAX_WHITESPACE, prefix: bytes = b"", suffix: bytes = b"") -> Grammar:
    """The grammar of the JSON texts that ``schema`` admits (None: any JSON object, what
    ``response_format`` ``json_object`` asks for), between the fixed bytes ``prefix`` and
    ``suffix``. A schema outside the supported subset is a :class:`SchemaError`. Compiled
    grammars are cached (the last 16 distinct schemas)."""
    if isinstance(max_whitespace, bool) or not isinstance(max_whitespace, int) or not (
            0 <= max_whitespace <= 1000):
        raise ValueError(f"max_whitespace must be an int in [0, 1000], got "
                         f"{describe_value(max_whitespace)}")
    if not isinstance(prefix, bytes) or not isinstance(suffix, bytes):
        raise TypeError("prefix and suffix must be bytes")
    if schema is None:
        schema = {"type": "object"}
    try:
        key = (json.dumps(schema, separators=(",", ":"), allow_nan=False), max_whitespace,
               prefix, suffix)
    except (TypeError, ValueError) as error:
        raise SchemaError("$", f"the schema is not JSON data ({error})") from None
    with _GRAMMARS_LOCK:
        grammar = _GRAMMARS.get(key)
        if grammar is not None:
            _GRAMMARS.move_to_end(key)
            return grammar
    compiler = _Compiler(schema, max_whitespace)
    value = compiler.schema(schema, "$")
    nfa = compiler.nfa
    root, outer = nfa.begin_rule("(document)")
    state = nfa.literal(root, prefix)
    state = nfa.call(compiler.whitespace(state), value)
    nfa.final[nfa.literal(state, suffix)] = True
    nfa.end_rule(outer)
    productive = _prune(nfa)
    if root not in productive:
        paths = [nfa.rule_paths[rule] for rule in sorted(nfa.rule_paths)
                 if rule not in productive and not nfa.rule_paths[rule].startswith("(")]
        where = paths[-1] if paths else "$"
        raise SchemaError(where, "no finite JSON value matches this schema (a false schema, "
                                 "or a recursion every instance of which nests forever)")
    grammar = Grammar(nfa, root, json.dumps(schema)[:80])
    with _GRAMMARS_LOCK:
        _GRAMMARS[key] = grammar
        if len(_GRAMMARS) > _GRAMMAR_CACHE:
            _GRAMMARS.popitem(last=False)
    return grammar


def response_format_grammar(response_format: object) -> Grammar | None:
    """The grammar of an OpenAI ``response_format``: None for absent or ``{"type":
    "text"}``, any JSON object for ``{"type": "json_object"}``, the schema's for
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": ..., "strict": ...,
    "description": ...}}``. A malformed value is a SchemaError whose path starts at
    ``response_format`` (``response_format.json_schema.schema.properties.age.type``)."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise SchemaError("response_format", f"must be an object, not "
                                             f"{describe_value(response_format)}")
    kind = response_format.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"},
               "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise SchemaError("response_format.type", f"must be 'text', 'json_object' or "
                                                  f"'json_schema', not {describe_value(kind)}")
    unknown = sorted(set(response_format) - allowed[kind])
    if unknown:
        raise SchemaError(f"response_format.{unknown[0]}", f"is not a field of a {kind} "
                                                           f"response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return compile_schema(None)
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise SchemaError("response_format.json_schema",
                          f"must be an object with name and schema, not {describe_value(spec)}")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise SchemaError(f"response_format.json_schema.{unknown[0]}", "is not a field of "
                                                                       "json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise SchemaError("response_format.json_schema.name",
                          f"must be 1 to 64 letters, digits, _ or -, not {describe_value(name)}")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise SchemaError("response_format.json_schema.strict",
                          f"must be true or false, not {describe_value(strict)}")
    schema = spec.get("schema", {})
    try:
        return compile_schema(schema)
    except SchemaError as error:
        raise SchemaError("response_format.json_schema.schema" + error.path[1:],
                          error.detail) from None


# ---- the vocabulary -------------------------------------------------------------------------


class _Trie:
    """A byte trie, laid out breadth first: the children of ``node`` are the nodes
    ``first[node] + i`` whose bytes are ``labels[node][i]``; ``tokens[node]`` is the id
    ending there (-1: none), ``duplicates`` the further ids with the same bytes."""

    def __init__(self, entries: Iterable[tuple[bytes, int]]) -> None:
        nested: dict = {}
        ends: dict[bytes, list[int]] = {}
        for data, token in entries:
            ends.setdefault(data, []).append(token)
            node = nested
            for value in data:
                node = node.setdefault(value, {})
        self.labels: list[bytes] = []
        self.first = array("i")
        self.tokens = array("i")
        self.duplicates: dict[int, tuple[int, ...]] = {}
        queue = [(nested, b"")]
        position = 0
        while position < len(queue):
            node, prefix = queue[position]
            keys = bytes(sorted(node))
            self.labels.append(keys)
            self.first.append(len(queue))
            ids = ends.get(prefix) if prefix else None
            self.tokens.append(ids[0] if ids else -1)
            if ids and len(ids) > 1:
                self.duplicates[position] = tuple(ids[1:])
            queue.extend((node[key], prefix + bytes((key,))) for key in keys)
            queue[position] = None  # type: ignore[call-overload]  # free as we go
            position += 1

    @property
    def node_count(self) -> int:
        return len(self.labels)


_CONTROL_BYTES = frozenset(range(0x20))


def _string_scan(data: bytes) -> tuple[int, int]:
    """``data`` read from inside a JSON string: (1, characters) when it is all plain
    characters, complete UTF-8; (2, 0) when it may take part in a string anyway (it reaches
    a quote or backslash after plain characters, or ends inside a UTF-8 character); (0, 0)
    when it never can (a control byte or invalid UTF-8 first)."""
    stop = len(data)
    for position, value in enumerate(data):
        if value in (0x22, 0x5C) or value in _CONTROL_BYTES:
            stop = position
            break
    head = data[:stop]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        if stop < len(data):
            return 0, 0
        try:
            codecs.getincrementaldecoder("utf-8")("strict").decode(head, final=False)
        except UnicodeDecodeError:
            return 0, 0
        return 2, 0  # ends inside a character
    if stop == len(data):
        return 1, len(text)
    return (0, 0) if data[stop] in _CONTROL_BYTES else (2, 0)


class _VocabularyIndex:
    """What masks need of a tokenizer, computed once: the tries and the plain tokens."""

    def __init__(self, token_bytes: Sequence[bytes], excluded: frozenset[int]) -> None:
        self.size = len(token_bytes)
        self.token_bytes = tuple(bytes(data) for data in token_bytes)
        self.excluded = excluded
        ordinary = [(data, token) for token, data in enumerate(self.token_bytes)
                    if data and token not in excluded]
        self.trie = _Trie(ordinary)
        plain = bytearray(self.size)
        self._plain_counts: dict[int, list[int]] = {}
        string_entries = []
        for data, token in ordinary:
            kind, characters = _string_scan(data)
            if kind == 1:
                plain[token] = 1
                self._plain_counts.setdefault(characters, []).append(token)
            elif kind == 2:
                string_entries.append((data, token))
        self._plain = bytes(plain)
        self.string_trie = _Trie(string_entries)
        self._plain_up_to: dict[int, bytes] = {}
        self._longest_plain = max(self._plain_counts, default=0)

    def plain_up_to(self, room: float) -> bytes:
        """1 for each plain-character token of at most ``room`` characters."""
        if room >= self._longest_plain:
            return self._plain
        room = int(room)
        cached = self._plain_up_to.get(room)
        if cached is None:
            out = bytearray(self.size)
            for count, tokens in self._plain_counts.items():
                if count <= room:
                    for token in tokens:
                        out[token] = 1
            cached = self._plain_up_to[room] = bytes(out)
        return cached


class TokenVocabulary:
    """The token ids' bytes as constrained decoding reads them, with the ids that end
    generation. ``token_bytes[id]`` is each id's bytes as it decodes inside a sequence;
    ``special_ids`` (control tokens) and ids of no bytes are never allowed; ``end_ids`` are
    allowed where the text may end. Building the index takes a moment (about 0.5 s at
    V = 49,152): :meth:`from_tokenizer` keeps one per tokenizer."""

    def __init__(self, token_bytes: Sequence[bytes] | _VocabularyIndex, *,
                 special_ids: Iterable[int] = (), end_ids: Iterable[int] = ()) -> None:
        if isinstance(token_bytes, _VocabularyIndex):
            self.index = token_bytes
        else:
            self.index = _VocabularyIndex(token_bytes, frozenset(special_ids))
        ends = []
        for token in end_ids:
            if isinstance(token, bool) or not isinstance(token, int) or not (
                    0 <= token < self.index.size):
                raise ValueError(f"end id {describe_value(token)} is not a token id below "
                                 f"{self.index.size}")
            if token not in ends:
                ends.append(token)
        self.end_ids = tuple(ends)

    @property
    def size(self) -> int:
        return self.index.size

    def with_end_ids(self, end_ids: Iterable[int]) -> TokenVocabulary:
        """The same index with other end ids (no rebuilding)."""
        return TokenVocabulary(self.index, end_ids=end_ids)

    def token_bytes(self, token: int) -> bytes:
        return self.index.token_bytes[token]

    def is_ordinary(self, token: int) -> bool:
        return bool(self.index.token_bytes[token]) and token not in self.index.excluded

    @classmethod
    def from_tokenizer(cls, tokenizer, end_ids: Iterable[int] = ()) -> TokenVocabulary:
        """The vocabulary of a tokenizer with ``vocabulary_size``, ``token_bytes(id)`` (or
        ``decode_bytes([id])``) and optionally ``control_tokens()`` (the special ids). The
        index is cached per tokenizer (weakly)."""
        with _VOCABULARIES_LOCK:
            try:
                index = _VOCABULARIES.get(tokenizer)
            except TypeError:
                index = None
        if index is None:
            size = getattr(tokenizer, "vocabulary_size", None)
            if size is None:
                size = tokenizer.vocab_size
            one = getattr(tokenizer, "token_bytes", None)
            if not callable(one):
                decode = tokenizer.decode_bytes

                def one(token: int) -> bytes:
                    return bytes(decode([token]))

            listing = getattr(tokenizer, "control_tokens", None)
            special = frozenset(listing().values()) if callable(listing) else frozenset()
            index = _VocabularyIndex([bytes(one(token)) for token in range(size)], special)
            try:
                with _VOCABULARIES_LOCK:
                    _VOCABULARIES[tokenizer] = index
            except TypeError:
                pass
        return cls(index, end_ids=end_ids)


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_VOCABULARIES_LOCK = threading.Lock()


# ---- one generation -------------------------------------------------------------------------


class Matcher:
    """One generation's place in a grammar: :meth:`allowed_tokens` before each step,
    :meth:`advance` with the sampled id after it."""

    def __init__(self, grammar: Grammar, vocabulary: TokenVocabulary) -> None:
        if not isinstance(grammar, Grammar):
            raise TypeError(f"grammar must be a Grammar, not {type(grammar).__name__}")
        if not isinstance(vocabulary, TokenVocabulary):
            raise TypeError(f"vocabulary must be a TokenVocabulary, not "
                            f"{type(vocabulary).__name__}")
        self.grammar = grammar
        self.vocabulary = vocabulary
        self._epoch = grammar.epoch
        self._state = grammar.start
        self._config = grammar.config(self._state)
        self.ended = False  # an end id was taken
        self.text = bytearray()  # the bytes consumed so far

    def _current(self) -> int:
        grammar = self.grammar
        if self._epoch != grammar.epoch:
            with grammar._lock:
                self._state = grammar.state_of(self._epoch, self._state, self._config)
                self._epoch = grammar.epoch
        return self._state

    def allowed_tokens(self) -> bytes:
        """The mask of the next token: ``mask[id]`` is 1 when ``id`` may be sampled, else
        0 (V entries). After an end id, nothing is allowed."""
        if self.ended:
            return bytes(self.vocabulary.size)
        return self.grammar.mask(self._current(), self.vocabulary)

    def can_end(self) -> bool:
        """Whether the text so far is a complete match (an end id is allowed)."""
        return not self.ended and self.grammar.ending(self._current()) != 0

    def is_complete(self) -> bool:
        """Whether the match is complete and nothing can follow (only an end id)."""
        return self.ended or self.grammar.ending(self._current()) == _COMPLETE

    def advance(self, token_id: int) -> None:
        """Take a sampled id; a ValueError (naming it) when the mask does not allow it."""
        vocabulary = self.vocabulary
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not (
                0 <= token_id < vocabulary.size):
            raise ValueError(f"token id {describe_value(token_id)} is not below the "
                             f"vocabulary size {vocabulary.size}")
        if self.ended:
            raise ValueError(f"token {token_id} follows the end of the constrained text")
        if token_id in vocabulary.end_ids and self.can_end():
            self.ended = True
            return
        if not vocabulary.is_ordinary(token_id):
            raise ValueError(f"token {token_id} ({vocabulary.token_bytes(token_id)!r}) is a "
                             f"control or empty token, not allowed here by the grammar")
        self.advance_bytes(vocabulary.token_bytes(token_id), token_id)

    def advance_bytes(self, data: bytes, token_id: int | None = None) -> None:
        """Consume ``data`` (a ValueError, consuming nothing, when the grammar refuses it)."""
        grammar = self.grammar
        state = self._current()
        for value in data:
            state = grammar.step(state, value)
            if state < 0:
                what = f"token {token_id} ({data!r})" if token_id is not None else repr(data)
                raise ValueError(f"{what} cannot follow {bytes(self.text[-40:])!r} in "
                                 f"{grammar.description}")
        self._state = state
        self._config = grammar.config(state)
        self.text += data
