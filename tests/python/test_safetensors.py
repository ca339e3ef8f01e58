"""riftco_transformer.interchange.safetensors: round trips, exact bytes, every rejection rule,
and both directions against the ``safetensors`` package itself (an independent oracle).

The oracle tests run a small script in the interpreter named by
``$RIFTCO_TRANSFORMER_ORACLE_PYTHON`` (see ``support.oracle_python``) and skip without one.
"""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
from array import array
from pathlib import Path

import pytest

from riftco_transformer.interchange import (
    SAFETENSORS_MAXIMUM_HEADER_BYTES,
    SAFETENSORS_MAXIMUM_TENSORS,
    SafetensorsTensor,
    encode_safetensors,
    parse_safetensors,
    read_safetensors,
    write_safetensors,
)
from support import oracle_python

NAN = float("nan")
INF = float("inf")


def _float32(values) -> list[float]:
    """``values`` rounded to float32, as Python floats."""
    return array("f", values).tolist()


def _tensors() -> dict:
    """Tensors of every kind: 2-d, 0-d, zero-size, a non-ASCII name, each values type."""
    generator = random.Random(5)
    return {
        "layer.weight": ((2, 3), array("f", [generator.uniform(-2, 2) for _ in range(6)])),
        "scalar": ((), [0.1]),
        "empty": ((0, 4), []),
        "ψ.bias": ((3,), memoryview(array("f", [1.5, -0.0, 3.4e38]))),
        "from_doubles": ((2, 2), array("d", [1e-40, -1.0, 1 / 3, 2.0])),
        "from_ints": ((1, 3, 1), (1, -2, 3)),
    }


METADATA = {"format": "pt", "note": "üñí code \"quoted\""}


def _file(header: object = None, data: bytes = b"", *, raw: bytes | None = None, length=None):
    """A hand-built file: the length prefix (``length``, else the header's real length), the
    header (``raw`` bytes, else ``header`` as JSON) and the data buffer."""
    encoded = raw if raw is not None else json.dumps(header).encode("utf-8")
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


def _entry(shape, begin, end, dtype="F32") -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _header_of(data: bytes) -> tuple[int, bytes]:
    (length,) = struct.unpack_from("<Q", data)
    return length, data[8 : 8 + length]


# ---- Round trips and the exact bytes.


def test_round_trip_preserves_names_order_shapes_values_and_metadata(tmp_path):
    tensors = _tensors()
    path = write_safetensors(tmp_path / "model.safetensors", tensors, METADATA)
    assert path == tmp_path / "model.safetensors"
    read, metadata = read_safetensors(path)
    assert metadata == METADATA
    assert list(read) == list(tensors)  # data order is the given order
    for name, (shape, values) in tensors.items():
        tensor = read[name]
        assert isinstance(tensor, SafetensorsTensor)
        assert tensor.name == name
        assert tensor.shape == shape
        assert isinstance(tensor.values, array) and tensor.values.typecode == "f"
        assert tensor.values.tolist() == _float32(values)
    assert read["scalar"].values.tolist() == _float32([0.1])
    assert read["empty"].values.tolist() == []
    assert math.copysign(1.0, read["ψ.bias"].values[1]) == -1.0  # -0.0 survives


def test_writing_is_deterministic_and_aligned(tmp_path):
    tensors = _tensors()
    first = write_safetensors(tmp_path / "a.safetensors", tensors, METADATA).read_bytes()
    second = write_safetensors(tmp_path / "b.safetensors", tensors, dict(METADATA)).read_bytes()
    assert first == second == encode_safetensors(tensors, METADATA)
    length, header = _header_of(first)
    assert length % 8 == 0 and (8 + length) % 8 == 0
    text = header.decode("utf-8")
    compact = text.rstrip(" ")  # the padding: fewer than 8 spaces after the JSON
    assert len(text) - len(compact) < 8
    decoded = json.loads(compact)
    assert compact == json.dumps(decoded, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert decoded["__metadata__"] == METADATA
    # Contiguous, in the given order.
    offsets = [decoded[name]["data_offsets"] for name in tensors]
    assert offsets[0][0] == 0
    assert all(previous[1] == following[0] for previous, following in zip(offsets, offsets[1:]))
    assert len(first) == 8 + length + offsets[-1][1]


def test_exact_bytes_of_a_small_file():
    header = b'{"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}}'
    assert len(header) == 54
    expected = struct.pack("<Q", 56) + header + b"  " + _f32(1.0, -2.0)
    assert encode_safetensors({"a": ((2,), [1.0, -2.0])}) == expected
    assert encode_safetensors({"a": ([2], array("f", [1.0, -2.0]))}, metadata={}) == expected


def test_no_tensors_at_all():
    data = encode_safetensors({})
    assert data == struct.pack("<Q", 8) + b"{}      "
    assert parse_safetensors(data) == ({}, {})
    assert parse_safetensors(encode_safetensors({}, {"k": "v"})) == ({}, {"k": "v"})


def test_read_tensors_write_back_byte_identical(tmp_path):
    data = encode_safetensors(_tensors(), METADATA)
    tensors, metadata = parse_safetensors(data)
    assert encode_safetensors(tensors, metadata) == data


def test_parse_accepts_bytearray_memoryview_and_a_foreign_layout():
    # Another writer's choices: unsorted keys, pretty JSON, no padding, metadata last.
    header = '{\n  "b": {"shape": [1], "dtype": "F32", "data_offsets": [4, 8]},\n'
    header += '  "a": {"data_offsets": [0, 4], "dtype": "F32", "shape": []},\n'
    header += '  "__metadata__": {"x": ""}\n}'
    data = _file(raw=header.encode(), data=_f32(1.0, 2.0))
    for form in (data, bytearray(data), memoryview(data), memoryview(bytearray(data))):
        tensors, metadata = parse_safetensors(form)
        assert list(tensors) == ["a", "b"]  # data order
        assert tensors["a"] == SafetensorsTensor("a", (), array("f", [1.0]))
        assert tensors["b"] == SafetensorsTensor("b", (1,), array("f", [2.0]))
        assert metadata == {"x": ""}


def test_numpy_arrays_as_values():
    numpy = pytest.importorskip("numpy")
    matrix = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
    tensors = {
        "contiguous": ((3, 4), matrix),
        "strided": ((3, 2), matrix[:, ::2]),
        "big_endian": ((3, 4), matrix.astype(">f4")),
        "float64": ((3, 4), matrix.astype(numpy.float64)),
        "scalar": ((), numpy.array(7.0, dtype=numpy.float32)),
    }
    read, _ = parse_safetensors(encode_safetensors(tensors))
    assert read["contiguous"].values.tolist() == matrix.ravel().tolist()
    assert read["strided"].values.tolist() == matrix[:, ::2].ravel().tolist()
    assert read["big_endian"].values.tolist() == matrix.ravel().tolist()
    assert read["float64"].values.tolist() == matrix.ravel().tolist()
    assert read["scalar"].values.tolist() == [7.0]
    with pytest.raises(TypeError, match="'half'.*buffer format 'e'"):
        encode_safetensors({"half": ((1,), numpy.zeros(1, dtype=numpy.float16))})


# ---- The writer's rejections.


def _write_rejection(id_, tensors, error, message, metadata=None):
    return pytest.param(tensors, metadata, error, message, id=id_)


ONE = ((1,), [1.0])
WRITE_REJECTIONS = [
    _write_rejection("empty-name", {"": ONE}, ValueError, "must not be empty"),
    _write_rejection("metadata-name", {"__metadata__": ONE}, ValueError, "reserved"),
    _write_rejection("int-name", {7: ONE}, TypeError, "names must be str, not int"),
    _write_rejection("surrogate-name", {"\ud800": ONE}, ValueError, "UTF-8"),
    _write_rejection("no-pair", {"w": [1.0]}, TypeError, "'w' must map to (shape, values)"),
    _write_rejection("int-shape", {"w": (3, [1.0])}, TypeError, "'w': shape must be a tuple"),
    _write_rejection("negative-dim", {"w": ((-1,), [])}, ValueError, "'w': shape[0] must be in"),
    _write_rejection("bool-dim", {"w": ((True,), [1.0])}, TypeError, "'w': shape[0] must be an"),
    _write_rejection("float-dim", {"w": ((1.0,), [1.0])}, TypeError, "shape[0] must be an int"),
    _write_rejection("huge-dim", {"w": ((2**64,), [])}, ValueError, "must be in [0, 2**64)"),
    _write_rejection(
        "mismatch", {"w": ((2, 2), [1.0] * 3)}, ValueError, "'w': shape (2, 2) holds 4 elements"
    ),
    _write_rejection(
        "huge-shape", {"w": ((2**40, 2**40), [1.0])}, ValueError, "holds more than 2**64 elements"
    ),
    _write_rejection("scalar-empty", {"w": ((), [])}, ValueError, "shape () holds 1 elements"),
    _write_rejection(
        "nan", {"ok": ONE, "w": ((3,), [1.0, 2.0, NAN])}, ValueError, "tensor 'w': element 2 is nan"
    ),
    _write_rejection("-inf", {"w": ((2,), [-INF, 1.0])}, ValueError, "element 0 is -inf"),
    _write_rejection(
        "rounds-to-inf", {"w": ((2,), [1.0, 1e39])}, ValueError, "element 1 is inf as float32"
    ),
    _write_rejection("big-int", {"w": ((1,), [10**400])}, ValueError, "'w': a value is out of"),
    _write_rejection("str-item", {"w": ((1,), ["1"])}, TypeError, "'w': values must be a flat"),
    _write_rejection("nested", {"w": ((1,), [[1.0]])}, TypeError, "'w': values must be a flat"),
    _write_rejection("raw-bytes", {"w": ((4,), b"\0\0\0\0")}, TypeError, "not bytes"),
    _write_rejection("float-values", {"w": ((1,), 1.0)}, TypeError, "'w': values must be a buffer"),
    _write_rejection("list-metadata", {"w": ONE}, TypeError, "metadata must be a mapping", ["k"]),
    _write_rejection("int-metadata", {"w": ONE}, TypeError, "map str to str", {"k": 1}),
    _write_rejection("int-metadata-key", {"w": ONE}, TypeError, "map str to str", {1: "v"}),
    _write_rejection("list", [("w", ONE)], TypeError, "tensors must be a mapping"),
]


@pytest.mark.parametrize(("tensors", "metadata", "error", "message"), WRITE_REJECTIONS)
def test_write_rejections_leave_the_destination_untouched(
    tmp_path, tensors, metadata, error, message
):
    destination = tmp_path / "model.safetensors"
    destination.write_bytes(b"the previous file")
    with pytest.raises(error) as caught:
        write_safetensors(destination, tensors, metadata)
    assert message in str(caught.value)
    assert destination.read_bytes() == b"the previous file"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.safetensors"]
    with pytest.raises(error):
        encode_safetensors(tensors, metadata)


def test_write_more_than_the_maximum_tensor_count():
    tensors = {f"t{index}": ((0,), []) for index in range(SAFETENSORS_MAXIMUM_TENSORS + 1)}
    with pytest.raises(ValueError, match="8193 tensors exceed the maximum of 8192"):
        encode_safetensors(tensors)
    del tensors["t0"]
    assert len(parse_safetensors(encode_safetensors(tensors))[0]) == SAFETENSORS_MAXIMUM_TENSORS


def test_write_path_errors(tmp_path):
    tensors = {"w": ((1,), [1.0])}
    with pytest.raises(IsADirectoryError):
        write_safetensors(tmp_path, tensors)
    with pytest.raises(FileNotFoundError):
        write_safetensors(tmp_path / "missing" / "model.safetensors", tensors)
    with pytest.raises(TypeError):
        write_safetensors(b"model.safetensors", tensors)
    assert list(tmp_path.iterdir()) == []


# ---- The reader's rejections.


def _too_many_tensors() -> bytes:
    count = SAFETENSORS_MAXIMUM_TENSORS + 1
    return _file({f"t{index}": _entry([0], 0, 0) for index in range(count)})


PARSE_REJECTIONS = [
    pytest.param(b"\x01\x02", ["the file is 2 bytes, too short"], id="short"),
    pytest.param(struct.pack("<Q", 0), ["the header length is 0"], id="zero-length"),
    pytest.param(
        _file(raw=b"{}", length=SAFETENSORS_MAXIMUM_HEADER_BYTES + 1),
        [f"header length {SAFETENSORS_MAXIMUM_HEADER_BYTES + 1} exceeds the maximum"],
        id="length-over-maximum",
    ),
    pytest.param(
        _file(raw=b"{}", length=2**64 - 1), ["exceeds the maximum"], id="length-u64-max"
    ),
    pytest.param(
        _file(raw=b"{}", length=100),
        ["header length 100 runs past the end", "only 2"],
        id="past-end",
    ),
    pytest.param(_file(raw=b'{"\xff":1}'), ["not valid UTF-8", "header byte 2"], id="utf8"),
    pytest.param(_file(raw=b'{"a":'), ["not valid JSON"], id="truncated-json"),
    pytest.param(_file(raw=b'{"a":{}} x'), ["not valid JSON", "Extra data"], id="trailing-junk"),
    pytest.param(_file(raw=b'{"a": NaN}'), ["not valid JSON", "NaN"], id="nan-constant"),
    pytest.param(_file(raw=b"[" * 100_000), ["not valid JSON", "nested too deeply"], id="deep"),
    pytest.param(
        _file(raw=b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,0]}}'),
        ["not valid JSON"],
        id="int-digits",
    ),
    pytest.param(
        _file(raw=b'{"a":{},"a":{}}'), ["the header has the key 'a' twice"], id="duplicate-tensor"
    ),
    pytest.param(
        _file(raw=b'{"a":{"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]}}'),
        ["the key 'dtype' twice"],
        id="duplicate-field",
    ),
    pytest.param(_file([]), ["must be a JSON object, not an array"], id="array"),
    pytest.param(_file("x"), ["must be a JSON object, not a string"], id="string"),
    pytest.param(_too_many_tensors(), ["8193 tensors, more than the maximum of 8192"], id="count"),
    pytest.param(
        _file({"__metadata__": ["x"]}), ["__metadata__ must be an object", "an array"], id="meta"
    ),
    pytest.param(
        _file({"__metadata__": None}), ["__metadata__ must be an object", "null"], id="meta-null"
    ),
    pytest.param(
        _file({"__metadata__": {"k": 1}}),
        ["__metadata__['k'] must be a string, not a number"],
        id="meta-value",
    ),
    pytest.param(
        _file(raw=b'{"\\ud800":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'),
        ["lone surrogate"],
        id="surrogate-name",
    ),
    pytest.param(
        _file({"__metadata__": {"k": "\ud800"}}), ["__metadata__['k']", "lone surrogate"],
        id="surrogate-metadata",
    ),
    pytest.param(_file({"w": [0]}), ["tensor 'w' must be an object, not an array"], id="entry"),
    pytest.param(
        _file({"w": {**_entry([1], 0, 4), "extra": 1}}, _f32(1.0)),
        ["tensor 'w' has unknown field(s) 'extra'"],
        id="extra-field",
    ),
    pytest.param(
        _file({"w": {"dtype": "F32", "shape": [1]}}, _f32(1.0)),
        ["tensor 'w' has no data_offsets"],
        id="missing-field",
    ),
    pytest.param(
        _file({"w": _entry([2], 0, 4, dtype="F16")}, b"\0" * 4),
        ["tensor 'w': dtype 'F16' is not supported", "only F32"],
        id="dtype-f16",
    ),
    pytest.param(
        _file({"w": _entry([1], 0, 4, dtype="f32")}, _f32(1.0)),
        ["dtype 'f32' is not supported"],
        id="dtype-lowercase",
    ),
    pytest.param(
        _file({"w": _entry([1], 0, 4, dtype=4)}, _f32(1.0)),
        ["tensor 'w': dtype must be a string, not a number"],
        id="dtype-number",
    ),
    pytest.param(
        _file({"w": _entry(1, 0, 4)}, _f32(1.0)),
        ["tensor 'w': shape must be an array of integers, not a number"],
        id="shape-number",
    ),
    pytest.param(
        _file({"w": _entry([True], 0, 4)}, _f32(1.0)),
        ["tensor 'w': shape[0] must be an integer, not a boolean"],
        id="shape-bool",
    ),
    pytest.param(
        _file({"w": _entry([1.0], 0, 4)}, _f32(1.0)),
        ["tensor 'w': shape[0] must be an integer, not a number (1.0)"],
        id="shape-float",
    ),
    pytest.param(
        _file({"w": _entry([1, -1], 0, 4)}, _f32(1.0)),
        ["tensor 'w': shape[1] is -1"],
        id="shape-negative",
    ),
    pytest.param(
        _file({"w": _entry([2**64, 0], 0, 0)}), ["shape[0] is", "not in [0, 2**64)"], id="dim-u64"
    ),
    pytest.param(
        _file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, _f32(1.0)),
        ["tensor 'w': data_offsets must be an array of two integers, not [0]"],
        id="offsets-one",
    ),
    pytest.param(
        _file({"w": {"dtype": "F32", "shape": [1], "data_offsets": {"0": 4}}}, _f32(1.0)),
        ["tensor 'w': data_offsets must be an array of two integers, not an object"],
        id="offsets-object",
    ),
    pytest.param(
        _file({"w": _entry([1], False, 4)}, _f32(1.0)),
        ["tensor 'w': data_offsets begin must be an integer, not a boolean"],
        id="offsets-bool",
    ),
    pytest.param(
        _file({"w": _entry([1], 0, "4")}, _f32(1.0)),
        ["tensor 'w': data_offsets end must be an integer, not a string"],
        id="offsets-string",
    ),
    pytest.param(
        _file({"w": _entry([0], 8, 4)}, _f32(1.0, 2.0)),
        ["tensor 'w': data_offsets [8, 4] must satisfy 0 <= begin <= end"],
        id="offsets-reversed",
    ),
    pytest.param(
        _file({"w": _entry([1], -4, 0)}, _f32(1.0)),
        ["data_offsets [-4, 0] must satisfy"],
        id="offsets-negative",
    ),
    pytest.param(
        _file({"w": _entry([2], 0, 4)}, _f32(1.0)),
        ["tensor 'w': data_offsets [0, 4] span 4 bytes, but F32 shape [2] needs 8"],
        id="span-short",
    ),
    pytest.param(
        _file({"w": _entry([], 0, 8)}, _f32(1.0, 2.0)),
        ["tensor 'w': data_offsets [0, 8] span 8 bytes, but F32 shape [] needs 4"],
        id="span-scalar",
    ),
    pytest.param(
        _file({"w": _entry([2**40, 2**23, 2**60], 0, 4)}, _f32(1.0)),
        ["tensor 'w'", "needs more than 2**64"],
        id="span-huge-shape",
    ),
    pytest.param(
        _file({"w": _entry([2**30], 0, 2**32)}, _f32(1.0)),
        ["tensor 'w' ends at byte 4294967296", "only 4 data bytes"],
        id="huge-claim",
    ),
    pytest.param(
        _file({"a": _entry([2], 0, 8), "b": _entry([2], 4, 12)}, _f32(1, 2, 3)),
        ["tensors 'a' and 'b' overlap"],
        id="overlap",
    ),
    pytest.param(
        _file({"a": _entry([1], 0, 4), "b": _entry([1], 0, 4)}, _f32(1)),
        ["tensors 'a' and 'b' overlap"],
        id="same-span",
    ),
    pytest.param(
        _file({"a": _entry([1], 0, 4), "b": _entry([1], 8, 12)}, _f32(1, 2, 3)),
        ["bytes [4, 8) of the data buffer belong to no tensor", "between tensors 'a' and 'b'"],
        id="gap",
    ),
    pytest.param(
        _file({"a": _entry([1], 4, 8)}, _f32(1, 2)),
        ["bytes [0, 4)", "before tensor 'a'"],
        id="gap-first",
    ),
    pytest.param(
        _file({"a": _entry([1], 0, 4)}, _f32(1, 2)),
        ["4 trailing bytes", "after tensor 'a'"],
        id="trailing",
    ),
    pytest.param(_file({}, b"x"), ["1 trailing bytes", "with no tensors"], id="trailing-empty"),
    pytest.param(
        _file({"a": _entry([2], 0, 8)}, _f32(1)),
        ["tensor 'a' ends at byte 8", "only 4 data bytes (4 missing)"],
        id="missing",
    ),
    pytest.param(
        _file({"a": _entry([1], 0, 4), "b": _entry([3], 4, 16)}, _f32(1, 2, NAN, 4)),
        ["tensor 'b': element 1 is nan", "only finite"],
        id="nan",
    ),
    pytest.param(
        _file({"a": _entry([2], 0, 8)}, _f32(1, INF)), ["tensor 'a': element 1 is inf"], id="inf"
    ),
    pytest.param(
        _file({"a": _entry([], 0, 4)}, _f32(-INF)), ["tensor 'a': element 0 is -inf"], id="-inf"
    ),
]


@pytest.mark.parametrize(("data", "fragments"), PARSE_REJECTIONS)
def test_parse_rejections_name_the_field(data, fragments):
    with pytest.raises(ValueError) as caught:
        parse_safetensors(data)
    message = str(caught.value)
    assert message.startswith("<bytes>: ")
    for fragment in fragments:
        assert fragment in message


def test_read_rejection_starts_with_the_path_and_changes_nothing(tmp_path):
    path = tmp_path / "corrupt.safetensors"
    corrupt = _file({"a": _entry([2], 0, 8)}, _f32(1.0, NAN))
    path.write_bytes(corrupt)
    with pytest.raises(ValueError) as caught:
        read_safetensors(path)
    assert str(caught.value).startswith(f"{path}: tensor 'a': element 1 is nan")
    assert path.read_bytes() == corrupt
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["corrupt.safetensors"]
    with pytest.raises(ValueError, match="^custom: "):
        parse_safetensors(corrupt, source="custom")


def test_parse_leaves_its_input_unchanged_and_unlocked():
    data = bytearray(_file({"a": _entry([2], 0, 8)}, _f32(1.0, INF)))
    before = bytes(data)
    with pytest.raises(ValueError) as caught:
        parse_safetensors(data)
    assert data == before
    data.extend(b"!")  # the error (its traceback holds the parser's frames) locks nothing
    assert caught.value is not None


def test_read_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(IsADirectoryError):
        read_safetensors(tmp_path)
    with pytest.raises(TypeError):
        read_safetensors(3)
    with pytest.raises(TypeError):
        parse_safetensors("not bytes")
    with pytest.raises(TypeError):
        parse_safetensors(b"", source=None)


def test_arbitrary_bytes_raise_only_value_errors():
    """Mutations of a valid file (flipped bytes, truncations, insertions, a forged length) and
    random headers: each parses or is a ValueError starting with the source, nothing else."""
    valid = encode_safetensors(_tensors(), METADATA)
    generator = random.Random(2024)
    # Mostly JSON-ish bytes, so that mutations get past the UTF-8 and JSON checks.
    alphabet = b'{}[]":,0123456789-.eE FNa_ \\u\xff'

    def byte() -> int:
        return generator.choice(alphabet) if generator.random() < 0.8 else generator.randrange(256)

    candidates = [valid[:cut] for cut in range(0, len(valid), 3)]
    for _ in range(600):
        mutated = bytearray(valid)
        for _ in range(generator.randint(1, 3)):
            position = generator.randrange(len(mutated))
            choice = generator.random()
            if choice < 0.6:
                mutated[position] = byte()
            elif choice < 0.8:
                mutated[position:position] = bytes([byte()])
            else:
                del mutated[position]
        candidates.append(bytes(mutated))
    for _ in range(300):
        header = bytes(generator.choice(alphabet) for _ in range(generator.randint(1, 40)))
        candidates.append(_file(raw=header, data=bytes(generator.randrange(4) * 4)))
    rejected_per_tensor = parsed = 0
    for candidate in candidates:
        try:
            parse_safetensors(candidate)
            parsed += 1
        except ValueError as error:
            assert str(error).startswith("<bytes>: ")
            rejected_per_tensor += str(error).startswith("<bytes>: tensor")
    assert parsed > 0 and rejected_per_tensor > 0  # the mutations reach past the JSON


# ---- Against the safetensors package (an independent oracle).

ORACLE_LOAD = r"""
import json, sys
import safetensors, safetensors.numpy
path = sys.argv[1]
arrays = safetensors.numpy.load_file(path)
with safetensors.safe_open(path, framework="numpy") as opened:
    metadata = opened.metadata()
print(json.dumps({
    "tensors": {
        name: {"dtype": str(a.dtype), "shape": list(a.shape), "values": a.ravel().tolist()}
        for name, a in arrays.items()
    },
    "metadata": metadata,
}))
"""

ORACLE_SAVE = r"""
import json, sys
import numpy, safetensors.numpy
generator = numpy.random.default_rng(9)
arrays = {
    "embedding": generator.standard_normal((5, 3)).astype(numpy.float32),
    "scalar": numpy.array(-0.25, dtype=numpy.float32),
    "empty": numpy.zeros((2, 0), dtype=numpy.float32),
    "extremes": numpy.array([3.4028235e38, -1.4e-45, 1.17549435e-38, -0.0], dtype=numpy.float32),
    "b.ψ": generator.uniform(-1, 1, (2, 1, 2)).astype(numpy.float32),
}
metadata = {"format": "np", "ünïcode": "välue"}
safetensors.numpy.save_file(arrays, sys.argv[1], metadata=metadata)
print(json.dumps({
    "tensors": {
        name: {"shape": list(a.shape), "values": a.ravel().tolist()} for name, a in arrays.items()
    },
    "metadata": metadata,
}))
"""


def _run_oracle(python: str, script: str, path: Path) -> dict:
    completed = subprocess.run(
        [python, "-c", script, str(path)], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_safetensors_package_reads_our_files(tmp_path):
    python = oracle_python("safetensors.numpy")
    tensors = _tensors()
    path = write_safetensors(tmp_path / "ours.safetensors", tensors, METADATA)
    loaded = _run_oracle(python, ORACLE_LOAD, path)
    assert loaded["metadata"] == METADATA
    assert sorted(loaded["tensors"]) == sorted(tensors)
    for name, (shape, values) in tensors.items():
        entry = loaded["tensors"][name]
        assert entry["dtype"] == "float32"
        assert tuple(entry["shape"]) == shape
        assert entry["values"] == _float32(values)


def test_we_read_the_safetensors_package_files(tmp_path):
    python = oracle_python("safetensors.numpy")
    path = tmp_path / "theirs.safetensors"
    saved = _run_oracle(python, ORACLE_SAVE, path)
    tensors, metadata = read_safetensors(path)
    assert metadata == saved["metadata"]
    assert sorted(tensors) == sorted(saved["tensors"])
    for name, expected in saved["tensors"].items():
        assert tensors[name].shape == tuple(expected["shape"])
        assert tensors[name].values.tolist() == expected["values"]
    # And back: our re-encoding of their file is one they read as the same tensors.
    again = write_safetensors(tmp_path / "again.safetensors", tensors, metadata)
    reloaded = _run_oracle(python, ORACLE_LOAD, again)
    assert reloaded["metadata"] == saved["metadata"]
    for name, expected in saved["tensors"].items():
        assert reloaded["tensors"][name]["values"] == expected["values"]
        assert reloaded["tensors"][name]["shape"] == expected["shape"]


# The rules this reader adds to the format's reference implementation, deliberately: it
# accepts these files and we reject them.
STRICTER_THAN_THE_ORACLE = {
    "count",  # more than SAFETENSORS_MAXIMUM_TENSORS tensors
    "meta-null",  # "__metadata__": null
    "extra-field",  # an unknown field in a tensor entry
    "dtype-f16",  # any dtype but F32
    "nan",  # non-finite values
    "inf",
    "-inf",
}

ORACLE_ACCEPTED = r"""
import json, sys
import safetensors.numpy
accepted = []
for name, data in json.load(open(sys.argv[1])).items():
    try:
        safetensors.numpy.load(bytes.fromhex(data))
    except Exception:
        continue
    accepted.append(name)
print(json.dumps(accepted))
"""


def test_the_safetensors_package_rejects_what_we_reject_but_our_extra_rules(tmp_path):
    python = oracle_python("safetensors.numpy")
    cases = {case.id: case.values[0].hex() for case in PARSE_REJECTIONS}
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    completed = subprocess.run(
        [python, "-c", ORACLE_ACCEPTED, str(path)], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert set(json.loads(completed.stdout)) <= STRICTER_THAN_THE_ORACLE
