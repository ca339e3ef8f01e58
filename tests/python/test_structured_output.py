"""Constrained decoding (serving.structured_output): schemas compiled to grammars, the token
masks against a brute-force check of every token, random walks over allowed tokens that
always end in JSON valid against the schema, the refusals (each naming its JSON path), the
whitespace bound, end and control tokens, the samplers' mask, and SmolLM2's real vocabulary
(skipped without its GGUF file)."""

from __future__ import annotations

import json
import math
import random
import time
from array import array

import pytest

from riftco_transformer.serving.sampling import (
    Greedy,
    TemperatureSampler,
    apply_mask,
    masked_candidates,
)
from riftco_transformer.serving.structured_output import (
    Grammar,
    Matcher,
    SchemaError,
    TokenVocabulary,
    compile_schema,
    response_format_grammar,
)

# ---- a validator of the supported subset (the test's own reading of JSON Schema) ----------


def _type_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _resolve(root, reference: str):
    node = root
    for part in reference[1:].split("/")[1:] if reference != "#" else ():
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def valid(instance, schema, root=None) -> bool:
    root = schema if root is None else root
    if schema is True:
        return True
    if schema is False:
        return False
    if "$ref" in schema:
        return valid(instance, _resolve(root, schema["$ref"]), root)
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            return any(valid(instance, option, root) for option in schema[keyword])
    if "allOf" in schema:
        return all(valid(instance, option, root) for option in schema["allOf"])
    if "const" in schema and instance != schema["const"] or (
            _type_of(instance) != _type_of(schema.get("const", instance))
            and "const" in schema and not (isinstance(instance, (int, float))
                                           and isinstance(schema["const"], (int, float)))):
        return False
    if "enum" in schema and not any(instance == value and (_type_of(instance) == _type_of(value)
                                                           or _type_of(instance) in ("integer",
                                                                                     "number"))
                                    for value in schema["enum"]):
        return False
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if schema.get("nullable"):
            kinds.append("null")
        kind = _type_of(instance)
        if not (kind in kinds or kind == "integer" and "number" in kinds):
            return False
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            return False
        if len(instance) > schema.get("maxLength", math.inf):
            return False
    if isinstance(instance, list):
        if not schema.get("minItems", 0) <= len(instance) <= schema.get("maxItems", math.inf):
            return False
        items = schema.get("items", True)
        if not all(valid(item, items, root) for item in instance):
            return False
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        if any(name not in instance for name in schema.get("required", ())):
            return False
        extra = schema.get("additionalProperties", True)
        for name, value in instance.items():
            if name in properties:
                if not valid(value, properties[name], root):
                    return False
            elif not valid(value, extra, root):
                return False
    return True


# ---- a small vocabulary with every byte and JSON-shaped pieces --------------------------------

END, CONTROL, EMPTY = 0, 1, 2
PIECES = [b'{"', b'":', b'",', b'"}', b'"]', b'},', b'}]', b'"},{"', b'": "', b'", "', b"true",
          b"false", b"null", b"tr", b"ue", b"12", b"-3", b".5", b"e+7", b"0.", b"\n  ", b"  ",
          b"name", b"age", b" the", b"\\n", b"\\u00e9", b"\\ud83d", b"\\", b"\xc3\xa9",
          b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xf0\x9f\x99\x82", b'"a', b'":[', b'":{',
          b"[]", b"{}", b'""', b'"a"', b"1,", b"2]", b"\t", b'\\"', b"\x00", b"\xff", b"\xed\xa0"]
TOKENS = [b"<end>", b"<ctl>", b""] + [bytes((value,)) for value in range(256)] + PIECES


@pytest.fixture(scope="module")
def vocabulary() -> TokenVocabulary:
    return TokenVocabulary(TOKENS, special_ids=(END, CONTROL), end_ids=(END,))


def brute_force_mask(matcher: Matcher) -> bytes:
    grammar, vocabulary = matcher.grammar, matcher.vocabulary
    state = matcher._current()
    out = bytearray(vocabulary.size)
    ending = grammar.ending(state)
    for token in range(vocabulary.size):
        if token in vocabulary.end_ids:
            out[token] = 1 if ending else 0
            continue
        if not vocabulary.is_ordinary(token) or ending == 2:
            continue
        current = state
        for value in vocabulary.token_bytes(token):
            current = grammar.step(current, value)
            if current < 0:
                break
        else:
            out[token] = 1
    return bytes(out)


CLOSERS = frozenset(b'"}],')


def random_walk(grammar: Grammar, vocabulary: TokenVocabulary, rng: random.Random,
                check_masks: bool = False, limit: int = 4000) -> bytes:
    """Sample allowed tokens (favouring the end and closing bytes) until an end token."""
    matcher = Matcher(grammar, vocabulary)
    for _ in range(limit):
        mask = matcher.allowed_tokens()
        if check_masks:
            assert mask == brute_force_mask(matcher), bytes(matcher.text)
        allowed = [token for token, flag in enumerate(mask) if flag]
        assert allowed, f"dead end after {bytes(matcher.text)!r}"
        ends = [token for token in allowed if token in vocabulary.end_ids]
        others = [token for token in allowed if token not in vocabulary.end_ids]
        if ends and (not others or rng.random() < 0.7):
            matcher.advance(ends[0])
            assert matcher.is_complete()
            return bytes(matcher.text)
        closing = [token for token in others
                   if CLOSERS.intersection(vocabulary.token_bytes(token))]
        pool = closing if closing and rng.random() < 0.5 else others
        matcher.advance(rng.choice(pool))
    raise AssertionError(f"no end within {limit} tokens: {bytes(matcher.text)[:200]!r}")


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {
        "a": {"type": "string", "minLength": 2, "maxLength": 4},
        "b": {"type": "number"}, "c": {"type": ["boolean", "null"]},
        "d": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        "e": {"enum": ["red", "green", 3, None]}, "f": {"const": {"k": [1, "x"]}}},
        "required": ["a", "d"]},
    {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "array", "maxItems": 2},
               {"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"]}]},
    {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value", "children"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"type": "object", "additionalProperties": {"type": "string", "maxLength": 2}},
    {"type": "array", "items": {"type": "string", "nullable": True}, "minItems": 2},
    {"type": "object", "properties": {"opt1": {"type": "integer"}, "opt2": {"type": "boolean"},
                                      "req": {"const": "r"}}, "required": ["req"]},
    None,  # json_object: any object
    {"description": "anything", "title": "t"},
    {"definitions": {"s": {"type": "string"}}, "type": "array",
     "items": {"allOf": [{"$ref": "#/definitions/s"}]}, "maxItems": 3},
]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_random_walks_always_end_in_json_that_validates(vocabulary, index):
    schema = SCHEMAS[index]
    grammar = compile_schema(schema)
    rng = random.Random(index)
    for walk in range(25):
        text = random_walk(grammar, vocabulary, rng, check_masks=walk < 3)
        value = json.loads(text.decode("utf-8"))
        assert valid(value, {"type": "object"} if schema is None else schema), text
        assert grammar.accepts(text)


def test_masks_equal_a_brute_force_check_of_every_token(vocabulary):
    grammar = compile_schema(SCHEMAS[1])
    matcher = Matcher(grammar, vocabulary)
    text = b'{"a":"\xc3\xa9\\u00e9x", "c":null\n,"d":[1,-2 ,3]}'
    for value in text:
        assert matcher.allowed_tokens() == brute_force_mask(matcher)
        matcher.advance_bytes(bytes((value,)))
    assert matcher.allowed_tokens() == brute_force_mask(matcher)
    assert matcher.is_complete() and matcher.can_end()


# ---- what each keyword admits ----------------------------------------------------------------

CASES = [
    ({"type": "string"}, ['""', '"a\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"', '"é🙂"'],
     ['"\n"', '"\\x"', '"\\ud800"', "'a'", '"a']),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"a\\nb"', '"éé"', '"abc"'],
     ['"a"', '"abcd"', '"🙂"']),
    ({"type": "integer"}, ["0", "-7", "1234567890123456789"],
     ["1.5", "01", "1e3", "12345678901234567890", "-", "+1"]),
    ({"type": "number"}, ["0", "-0.5", "1e10", "2.5E-3", "1.0"], ["1.", ".5", "1e", "NaN"]),
    ({"type": "boolean"}, ["true", "false"], ["True", "1", "null"]),
    ({"type": "null"}, ["null"], ["nil", "{}"]),
    ({"type": ["string", "null"]}, ['"x"', "null"], ["1"]),
    ({"type": "string", "nullable": True}, ['"x"', "null"], ["1"]),
    ({"enum": ["a", 1, None, [1, 2], {"k": True}]},
     ['"a"', "1", "null", "[1,2]", '{"k":true}'], ['"b"', "2", "[1, 2]"]),
    ({"type": "string", "enum": ["a", 1]}, ['"a"'], ["1"]),
    ({"const": "x"}, ['"x"'], ['"y"']),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
     ["[1]", "[ 1 , 2 ]"], ["[]", "[1,2,3]", '["a"]', "[1,]"]),
    ({"type": "array", "items": False}, ["[]"], ["[1]"]),
    ({"type": "array"}, ["[]", '[1,"a",null,[{}]]'], ["[1,]"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
      "required": ["b"]},
     ['{"b":""}', '{"a":1,"b":""}', '{ "a" : 1 , "b" : "" }'],
     ['{"a":1}', '{"b":"","a":1}', '{"b":"","c":1}', '{"a":1,,"b":""}', '{,"b":""}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
     ["{}", '{"a":1}'], ['{"z":1}']),
    ({"type": "object", "additionalProperties": False}, ["{}"], ['{"a":1}']),
    ({"type": "object"}, ["{}", '{"a":[1,{"b":null}],"c":"d"}'], ['{"a"}', "[]"]),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, ['{"x":1,"y":2}'],
     ['{"x":"1"}']),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, ["1", '"1"'], ["true"]),
    ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, ["1", "null"], ['"1"']),
    ({"allOf": [{"type": "integer"}]}, ["1"], ['"1"']),
    ({"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i"}, ["5"], ['"5"']),
    ({"definitions": {"i": {"type": "integer"}}, "properties": {"n": {"$ref": "#/definitions/i"}},
      "required": ["n"]}, ['{"n":5}'], ['{"n":"5"}']),
    ({"type": "array", "items": {"$ref": "#"}}, ["[]", "[[],[[]]]"], ["[1]"]),
    (True, ["1", '{"a":[]}'], ["{"]),
    ({"title": "T", "description": "d", "default": 1, "examples": [1], "$comment": "c",
      "type": "integer", "deprecated": False, "readOnly": True, "uniqueItems": False},
     ["1"], ['"1"']),
]


@pytest.mark.parametrize("schema, accepted, refused", CASES)
def test_each_keyword_admits_exactly_its_values(schema, accepted, refused):
    grammar = compile_schema(schema, max_whitespace=2)
    for text in accepted:
        assert grammar.accepts(text), text
        assert valid(json.loads(text), schema)
    for text in refused:
        assert not grammar.accepts(text), text


def test_properties_come_in_their_declared_order():
    grammar = compile_schema({"type": "object", "properties": {"z": {"type": "integer"},
                                                               "a": {"type": "integer"}}})
    assert grammar.accepts('{"z":1,"a":2}')
    assert not grammar.accepts('{"a":2,"z":1}')


# ---- refusals name the path and the value ----------------------------------------------------

REFUSALS = [
    ({"type": "object", "properties": {"age": {"type": "int"}}}, "$.properties.age.type",
     "'int'"),
    ({"type": ["string", "date"]}, "$.type[1]", "'date'"),
    ({"type": "string", "pattern": "^a+$"}, "$.pattern", "'^a+$'"),
    ({"type": "string", "format": "email"}, "$.format", "'email'"),
    ({"type": "integer", "minimum": 3}, "$.minimum", "3"),
    ({"type": "array", "uniqueItems": True}, "$.uniqueItems", "True"),
    ({"type": "array", "items": [{"type": "string"}]}, "$.items", "tuple"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "$.maxLength", "2"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "$.maxItems", "2"),
    ({"type": "string", "maxLength": -1}, "$.maxLength", "-1"),
    ({"type": "string", "maxLength": 10**6}, "$.maxLength", "1000000"),
    ({"enum": []}, "$.enum", "[]"),
    ({"type": "integer", "enum": ["a"]}, "$.enum", "'a'"),
    ({"enum": ["a"], "maxLength": 3}, "$.maxLength", "maxLength"),
    ({"properties": {"a": {}}, "required": ["b"]}, "$.required[0]", "'b'"),
    ({"$ref": "https://example.com/s.json"}, "$.$ref", "https://example.com"),
    ({"$ref": "#/$defs/missing"}, "$.$ref", "#/$defs/missing"),
    ({"$ref": "#/$defs/a", "maxLength": 3, "$defs": {"a": {}}}, "$.maxLength", "maxLength"),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"},
     "$.$defs.a.anyOf[0].$ref", "#/$defs/a"),
    ({"$defs": {"a": {"type": "object", "properties": {"n": {"$ref": "#/$defs/a"}},
                      "required": ["n"]}}, "$ref": "#/$defs/a"}, "$.$defs.a", "nests forever"),
    (False, "$", "no finite JSON value"),
    ({"anyOf": []}, "$.anyOf", "[]"),
    ({"allOf": [{}, {}]}, "$.allOf", "allOf"),
    ({"type": "object", "properties": {"a b": {"type": "x"}}}, '$.properties["a b"].type', "'x'"),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": "2"}}},
     "$.properties.a.minLength", "'2'"),
    ({"type": "integer", "maxLength": 3}, "$.maxLength", "integer"),
    ("string", "$", "'string'"),
]


@pytest.mark.parametrize("schema, path, mention", REFUSALS)
def test_schemas_that_cannot_compile_name_their_path(schema, path, mention):
    with pytest.raises(SchemaError) as caught:
        compile_schema(schema)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")
    assert mention in str(caught.value)


def test_response_format_reads_openais_shapes():
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None
    assert response_format_grammar({"type": "json_object"}).accepts('{"a":1}')
    assert not response_format_grammar({"type": "json_object"}).accepts("[1]")
    grammar = response_format_grammar({"type": "json_schema", "json_schema": {
        "name": "person", "strict": True,
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                   "required": ["n"], "additionalProperties": False}}})
    assert grammar.accepts('{"n":1}') and not grammar.accepts('{"n":"1"}')
    refusals = [
        ({"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"age": {"type": "nope"}}}}},
         "response_format.json_schema.schema.properties.age.type"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
         "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "x": 1}},
         "response_format.json_schema.x"),
        ({"type": "text", "json_schema": {}}, "response_format.json_schema"),
        ([], "response_format"),
    ]
    for value, path in refusals:
        with pytest.raises(SchemaError) as caught:
            response_format_grammar(value)
        assert caught.value.path == path, caught.value


# ---- whitespace, ends and special tokens ------------------------------------------------------


def test_whitespace_is_bounded_at_every_place(vocabulary):
    grammar = compile_schema({"type": "array", "items": {"type": "integer"}}, max_whitespace=3)
    assert grammar.accepts("   [   1   ,   2   ]")
    assert not grammar.accepts("    [1]")
    assert not grammar.accepts("[1    ]")
    assert not grammar.accepts("[1] ")  # nothing after the value
    matcher = Matcher(grammar, vocabulary)
    matcher.advance_bytes(b"[1 \n\t")
    mask = matcher.allowed_tokens()
    assert not any(mask[3 + value] for value in b" \t\n\r")  # the single-byte tokens
    assert mask[3 + ord(",")] and mask[3 + ord("]")]
    compact = compile_schema({"type": "array"}, max_whitespace=0)
    assert compact.accepts("[1,[]]") and not compact.accepts("[ ]")
    with pytest.raises(ValueError, match="max_whitespace"):
        compile_schema(None, max_whitespace=-1)


def test_a_walk_of_whitespace_alone_cannot_go_on_forever(vocabulary):
    grammar = compile_schema({"type": "object"})
    matcher = Matcher(grammar, vocabulary)
    steps = 0
    while True:
        mask = matcher.allowed_tokens()
        spaces = [token for token, flag in enumerate(mask)
                  if flag and vocabulary.token_bytes(token).strip() == b""
                  and vocabulary.is_ordinary(token)]
        if not spaces:
            break
        matcher.advance(spaces[0])
        steps += 1
    assert steps <= 20
    assert len(matcher.text) == 20


def test_end_ids_only_where_the_value_is_complete(vocabulary):
    matcher = Matcher(compile_schema({"type": "integer"}), vocabulary)
    assert not matcher.allowed_tokens()[END]
    assert not matcher.can_end()
    matcher.advance_bytes(b"12")
    mask = matcher.allowed_tokens()
    assert mask[END] and mask[3 + ord("3")] and matcher.can_end()
    assert not matcher.is_complete()
    assert not mask[CONTROL] and not mask[EMPTY]
    matcher.advance(END)
    assert matcher.ended and matcher.is_complete() and not any(matcher.allowed_tokens())
    with pytest.raises(ValueError, match="follows the end"):
        matcher.advance(3 + ord("4"))

    matcher = Matcher(compile_schema({"type": "object"}), vocabulary)
    matcher.advance_bytes(b"{}")
    assert matcher.is_complete()
    mask = matcher.allowed_tokens()
    assert [token for token, flag in enumerate(mask) if flag] == [END]


def test_refused_tokens_raise_and_leave_the_matcher_unchanged(vocabulary):
    matcher = Matcher(compile_schema({"type": "boolean"}), vocabulary)
    with pytest.raises(ValueError, match="control or empty"):
        matcher.advance(CONTROL)
    with pytest.raises(ValueError, match="control or empty"):
        matcher.advance(END)  # an end id before the value is complete
    with pytest.raises(ValueError, match="cannot follow"):
        matcher.advance(TOKENS.index(b"tr") + 0 if False else TOKENS.index(b"null"))
    matcher.advance(TOKENS.index(b"tr"))
    with pytest.raises(ValueError, match="cannot follow"):
        matcher.advance_bytes(b"uex")
    assert bytes(matcher.text) == b"tr"
    matcher.advance(TOKENS.index(b"ue"))
    assert matcher.is_complete()
    with pytest.raises(ValueError, match="not below"):
        matcher.advance(len(TOKENS))


def test_a_token_may_span_grammar_boundaries(vocabulary):
    grammar = compile_schema({"type": "object", "properties": {"a": {"type": "string"},
                                                               "b": {"type": "string"}},
                              "required": ["a", "b"]})
    matcher = Matcher(grammar, vocabulary)
    for piece in (b'{"', b"a", b'": "', b"x", b'", "', b"b", b'":', b'"a"', b"}"):
        mask = matcher.allowed_tokens()
        token = TOKENS.index(piece) if piece in TOKENS[3 + 256:] else 3 + piece[0]
        assert mask[token], piece
        matcher.advance(token)
    assert matcher.is_complete()


def test_utf8_split_across_tokens_is_accepted_and_invalid_utf8_is_not(vocabulary):
    matcher = Matcher(compile_schema({"type": "string", "maxLength": 2}), vocabulary)
    matcher.advance(3 + ord('"'))
    mask = matcher.allowed_tokens()
    assert mask[TOKENS.index(b"\xc3")] and mask[TOKENS.index(b"\xe2\x82")]
    assert not mask[TOKENS.index(b"\xa9")] and not mask[TOKENS.index(b"\xff")]
    assert not mask[TOKENS.index(b"\xed\xa0")]  # a surrogate's encoding
    assert not mask[3 + 0x0A] and not mask[TOKENS.index(b"\x00")]  # raw control characters
    matcher.advance(TOKENS.index(b"\xc3"))
    mask = matcher.allowed_tokens()
    assert mask[TOKENS.index(b"\xa9")] and not mask[3 + ord("a")]
    matcher.advance(TOKENS.index(b"\xa9"))
    matcher.advance(TOKENS.index(b"\xf0\x9f\x99\x82"))  # the second of two characters
    assert [t for t, flag in enumerate(matcher.allowed_tokens()) if flag] == [3 + ord('"')]


def test_the_grammar_cache_and_vocabulary_reuse():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert compile_schema(schema) is compile_schema(json.loads(json.dumps(schema)))
    assert compile_schema(schema) is not compile_schema(schema, max_whitespace=0)
    base = TokenVocabulary([b"a", b"b"], end_ids=(0,))
    other = base.with_end_ids((1,))
    assert other.index is base.index and other.end_ids == (1,)
    with pytest.raises(ValueError, match="end id"):
        TokenVocabulary([b"a"], end_ids=(5,))


class _FakeTokenizer:
    def __init__(self, tokens):
        self.tokens = tokens
        self.vocabulary_size = len(tokens)

    def token_bytes(self, token):
        return self.tokens[token]

    def control_tokens(self):
        return {"<end>": END, "<ctl>": CONTROL}


def test_the_vocabulary_of_a_tokenizer_is_indexed_once():
    tokenizer = _FakeTokenizer(TOKENS)
    first = TokenVocabulary.from_tokenizer(tokenizer, end_ids=(END,))
    second = TokenVocabulary.from_tokenizer(tokenizer)
    assert first.index is second.index and second.end_ids == ()
    assert not first.is_ordinary(CONTROL) and not first.is_ordinary(EMPTY)


# ---- the samplers' mask -----------------------------------------------------------------------


def test_greedy_takes_the_best_allowed_id():
    logits = array("f", [5.0, 1.0, 3.0, 3.0, 0.0])
    assert Greedy().sample(logits, mask=bytes([0, 1, 1, 1, 1])) == 2  # a tie: the lower id
    assert Greedy().sample(logits, mask=bytes([1, 0, 0, 0, 0])) == 0
    assert Greedy(repetition_penalty=2.0).sample(logits, [2], mask=bytes([0, 1, 1, 1, 0])) == 3
    with pytest.raises(ValueError, match="allows no token"):
        Greedy().sample(logits, mask=bytes(5))
    with pytest.raises(ValueError, match="5 logits"):
        Greedy().sample(logits, mask=bytes(4))


def test_temperature_sampling_never_draws_a_masked_id_and_matches_the_unmasked_draw():
    rng = random.Random(3)
    logits = [rng.uniform(-3, 3) for _ in range(50)]
    everything = bytes([1] * 50)
    for seed in range(20):
        plain = TemperatureSampler(0.8, top_p=0.9, seed=seed).sample(logits)
        masked = TemperatureSampler(0.8, top_p=0.9, seed=seed).sample(logits, mask=everything)
        assert plain == masked
    mask = bytes(1 if token % 3 == 0 else 0 for token in range(50))
    sampler = TemperatureSampler(2.0, top_k=40, min_p=0.01, seed=1)
    draws = {sampler.sample(logits, mask=mask) for _ in range(300)}
    assert draws and all(token % 3 == 0 for token in draws)
    # top_k counts among the allowed ids: top_k=1 is the best allowed id.
    best = max((token for token in range(50) if token % 3 == 0), key=logits.__getitem__)
    assert TemperatureSampler(1.0, top_k=1).sample(logits, mask=mask) == best


def test_apply_mask_and_masked_candidates():
    logits = [1.0, 2.0, 3.0]
    row = apply_mask(logits, bytes([1, 0, 1]))
    assert row.typecode == "f" and list(row) == [1.0, -math.inf, 3.0]
    assert masked_candidates(logits, b"\x00\x01\x01") == ([1, 2], [2.0, 3.0])
    with pytest.raises(TypeError, match="bytes"):
        apply_mask(logits, [1, 1, 1])


# ---- SmolLM2's vocabulary (skipped without its GGUF) --------------------------------------------


@pytest.fixture(scope="module")
def smollm2_vocabulary():
    from support import smollm2_path

    from riftco_transformer.native.pretrained_tokenizer import PretrainedTokenizer

    tokenizer = PretrainedTokenizer.from_gguf(smollm2_path())
    return TokenVocabulary.from_tokenizer(tokenizer, end_ids=(tokenizer.eos_id,))


def test_smollm2s_vocabulary_walks_to_valid_json_with_fast_masks(smollm2_vocabulary):
    vocabulary = smollm2_vocabulary
    assert vocabulary.size == 49152
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "ok": {"type": "boolean"}}, "required": ["name", "age", "tags", "ok"]}
    grammar = compile_schema(schema)
    rng = random.Random(0)
    for walk in range(4):
        text = random_walk(grammar, vocabulary, rng, check_masks=walk == 0, limit=400)
        assert valid(json.loads(text.decode("utf-8")), schema)
    # The mask of a fresh grammar at each step (no mask reused from the cache).
    fresh = compile_schema(schema, max_whitespace=19)
    matcher = Matcher(fresh, vocabulary)
    times = []
    for piece in (b'{"name": "', b"Bob", b" Smith", b'", "age": ', b"4", b"2", b', "tags": ["',
                  b"a", b'", "', b"b", b'"], "ok": ', b"true", b"}"):
        started = time.perf_counter()
        matcher.allowed_tokens()
        times.append(time.perf_counter() - started)
        matcher.advance_bytes(piece)
    times.sort()
    print(f"SmolLM2 mask per step (uncached): median {times[len(times) // 2] * 1e3:.2f} ms, "
          f"worst {times[-1] * 1e3:.2f} ms")
    assert times[len(times) // 2] < 0.05  # generous: a few ms measured, on a loaded machine


def test_a_dfa_that_grows_past_its_limit_starts_over_under_live_matchers(vocabulary,
                                                                        monkeypatch):
    from riftco_transformer.serving import structured_output

    monkeypatch.setattr(structured_output, "_DFA_STATE_LIMIT", 3)
    schema = {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 4}
    grammar = compile_schema(schema, max_whitespace=1)
    epoch = grammar.epoch
    rng = random.Random(5)
    for _ in range(5):
        assert valid(json.loads(random_walk(grammar, vocabulary, rng)), schema)
    assert grammar.epoch > epoch + 5


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_every_reachable_state_can_go_on_or_end(index):
    """Breadth first over the bytes (up to 3,000 states): no state is a dead end."""
    grammar = compile_schema(SCHEMAS[index], max_whitespace=2)
    seen, frontier = {grammar.start}, [grammar.start]
    while frontier and len(seen) < 3000:
        state = frontier.pop(0)
        following = [grammar.step(state, value) for value in range(256)]
        live = [target for target in following if target >= 0]
        assert live or grammar.ending(state), f"state {state} is a dead end"
        for target in live:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
