#!/usr/bin/env python3
"""Coverage-guided (atheris) fuzzing of riftco_transformer's six untrusted-input loaders.

Run (from the repository root; the Python needs atheris, e.g. the oracle venv)::

    export RIFTCO_TRANSFORMER_LIBRARY=$PWD/build/release/libriftco_transformer_c.so.2
    export PYTHONPATH=$PWD/python
    PY=~/.cache/riftco-transformer/oracle-venv/bin/python
    $PY tools/fuzz/make_seeds.py /tmp/fuzz/seeds            # valid files, one folder a target
    mkdir -p /tmp/fuzz/corpus/bundle && cp /tmp/fuzz/seeds/bundle/* /tmp/fuzz/corpus/bundle/
    $PY tools/fuzz/fuzz_loaders.py --target bundle -max_total_time=600 -timeout=10 \\
        /tmp/fuzz/corpus/bundle

``--target`` is one of ``bundle``, ``checkpoint``, ``safetensors``, ``jsonl``,
``tokenizer_state`` and ``tokenizer_json``; every other argument goes to libFuzzer
(``-runs=N``, ``-max_total_time=S``, ``-timeout=S``, corpus folders, or a single crash file to
replay it). ``tools/fuzz/smoke.sh`` runs every target briefly.

The contract under test: on malformed input a loader raises ValueError and nothing else,
never crashes (native signal) and never hangs. Any other exception escapes to atheris, which
reports it with the input (``crash-<sha1>``). Beyond the contract, accepted inputs go through
consistency oracles (what load accepts must survive a save/load round trip, and must build
natively: a validated tokenizer state, a validated bundle's model), and the tokenizer-state
target is a differential test of the pure-Python validator against the native constructor.

How each input is used:

- an input that looks like the target's real format (a ``PK`` ZIP, a safetensors length +
  ``{``, JSON text) is fed to the loader as is, so libFuzzer's own mutations of the valid seeds
  (from ``make_seeds.py``) exercise the readers byte by byte;
- any other input drives a structured generator through ``atheris.FuzzedDataProvider``. For
  the ZIP formats it starts from a valid sample and either mutates the archive bytes, or
  mutates one member and re-packs it with correct CRC-32s (``write_stored_zip``), or edits the
  manifest as a JSON tree (replace/delete/insert values, with "interesting" numbers such as
  2**32, 2**64, 10**400, ``1e400``, ``1e39``) and optionally repairs the hashes and ids that
  would otherwise stop the load early (``weights.sha256``, member SHA-256s and sizes,
  ``artifact_id``/``checkpoint_id``), or replaces the manifest with raw fuzzer text; so the
  manifest validators are fuzzed directly, past the CRC and SHA-256 checks. For
  ``tokenizer_json`` (a Hugging Face tokenizer.json, read as
  ``PretrainedTokenizer.from_tokenizer_json`` reads the file's bytes) it starts from a valid
  byte-level or SentencePiece-style document and makes format-aware edits (merges of
  existing tokens whose concatenation becomes a token, tokens at the next, a taken or an odd
  id, added tokens new, repeating a vocab entry or clashing, another pre-tokenizer or
  normalizer, model flags), or generic JSON-tree edits, sometimes writes one key twice, or
  uses raw fuzzer bytes; an accepted file's tokenizer must encode and decode fixed texts
  (ids in range; decode(encode(text)) == text where the vocabulary makes that hold), and
  rebuild from its state (as ``load_huggingface`` does with tokenizer_config.json's bos/eos).

Known, already-reported bugs can be skipped so that a long run goes on past them: set
``RIFTCO_FUZZ_IGNORE`` to a comma-separated list of ids from ``KNOWN_BUGS`` (or ``all``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import struct
import sys
from array import array

import atheris

with atheris.instrument_imports():
    import riftco_transformer  # noqa: F401  (instrument the whole package)
    from riftco_transformer import Tokenizer
    from riftco_transformer._container import read_stored_zip, write_stored_zip
    from riftco_transformer.artifacts import ModelBundle, validate_tokenizer_state
    from riftco_transformer.checkpoints import TrainingCheckpoint
    from riftco_transformer.instructions import (
        Conversation,
        InstructionExample,
        PlainChatFormatter,
        parse_instructions_jsonl,
    )
    from riftco_transformer.interchange.safetensors import encode_safetensors, parse_safetensors
    from riftco_transformer.native import RiftcoTransformerError
    from riftco_transformer._container import strict_json
    from riftco_transformer.native.pretrained_tokenizer import (
        TOKEN_TYPE_VALUES,
        PretrainedTokenizer,
    )

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_seeds  # noqa: E402  (after instrumentation; imports riftco_transformer lazily)

# ---- known bugs (reported; skipped only when RIFTCO_FUZZ_IGNORE names them) -------------------


def _raised_in(error: BaseException, function: str) -> bool:
    """Whether ``error`` was raised (innermost frame) inside a function named ``function``."""
    traceback = error.__traceback__
    names = []
    while traceback is not None:
        names.append(traceback.tb_frame.f_code.co_name)
        traceback = traceback.tb_next
    return function in names[-2:]


# id -> (description, predicate on the escaping exception). Empty while no reported bug is
# open; an entry looks like
#     "epsilon-huge-int": (
#         "artifacts._validate_config: an int epsilon >= 2**1024 raises OverflowError",
#         lambda error: isinstance(error, OverflowError) and _raised_in(error, "_validate_config"),
#     ),
# (that one and the float32-inf epsilon, both found by this harness, are fixed in 7d3e71f).
KNOWN_BUGS: dict = {}


def _ignored(error: BaseException) -> bool:
    wanted = {name.strip() for name in os.environ.get("RIFTCO_FUZZ_IGNORE", "").split(",") if name}
    for name, (_description, matches) in KNOWN_BUGS.items():
        if ("all" in wanted or name in wanted) and matches(error):
            return True
    return False


# ---- JSON generation with raw number text ------------------------------------------------------


class Raw(str):
    """Number text written into JSON as is (``1e400``, a 5000-digit int, ``NaN``)."""


def dump_json(value, canonical: bool = True, ascii_only: bool = False) -> str:
    """``value`` as JSON text; canonical means sorted keys and compact (what the loaders want).

    Unlike json.dumps it writes :class:`Raw` values verbatim and keeps lone surrogates.
    """
    if isinstance(value, Raw):
        return str(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value) if value.bit_length() < 10_000 else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=ascii_only)
    comma, colon = (",", ":") if canonical else (", ", ": ")
    if isinstance(value, list):
        return "[" + comma.join(dump_json(item, canonical, ascii_only) for item in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items()) if canonical else list(value.items())
        return "{" + comma.join(
            json.dumps(key, ensure_ascii=ascii_only) + colon + dump_json(item, canonical, ascii_only)
            for key, item in items
        ) + "}"
    raise TypeError(f"cannot dump {type(value).__name__}")


def json_bytes(value, canonical: bool = True, ascii_only: bool = False) -> bytes:
    return dump_json(value, canonical, ascii_only).encode("utf-8", "surrogatepass")


def sha256_hex(data) -> str:
    return hashlib.sha256(data).hexdigest()


INTERESTING = [
    0, 1, -1, 2, 3, 4, 7, 8, 255, 256, 257, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
    2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**20, 10**400, -(10**400),
    0.0, -0.0, 0.5, 1.0, 0.9, 0.999, 1e-5, 1e-8, 1e-46, 1e-50, 3.4e38, 3.5e38, 1e39, 1.7e308,
    5e-324, -1.5, True, False, None, "", " ", "inf", "nan", "0", "a", "\ud800", "\u00e9",
    "byte", "bpe", "float32", "little", "adam", "model", "adapter", "assistant", "user",
    "F32", "F16", "__metadata__", "manifest.json", "weights.f32le", "model.f32le",
    Raw("1e400"), Raw("-1e400"), Raw("1E5"), Raw("1.0"), Raw("-0"), Raw("1e-400"),
    Raw("1" + "0" * 5000), Raw("NaN"), Raw("Infinity"), [], {},
]


def fuzz_json(fdp: atheris.FuzzedDataProvider, depth: int = 0):
    """A JSON value chosen by the provider: often an interesting constant, sometimes a tree."""
    kind = fdp.ConsumeIntInRange(0, 9)
    if kind <= 3:
        return fdp.PickValueInList(INTERESTING)
    if kind == 4:
        return fdp.ConsumeIntInRange(-300, 70000)
    if kind == 5:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if kind == 6:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 12))
    if kind == 7 or depth >= 3:
        return fdp.ConsumeBool()
    if kind == 8:
        return [fuzz_json(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {
        fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 6)): fuzz_json(fdp, depth + 1)
        for _ in range(fdp.ConsumeIntInRange(0, 4))
    }


def _nodes(value, limit: int = 4000) -> list[tuple[object, object]]:
    """(container, key) of every value inside ``value`` (breadth first, at most ``limit``)."""
    found = []
    queue = [value] if isinstance(value, (dict, list)) else []
    while queue and len(found) < limit:
        container = queue.pop(0)
        keys = list(container) if isinstance(container, dict) else range(len(container))
        for key in keys:
            found.append((container, key))
            if isinstance(container[key], (dict, list)):
                queue.append(container[key])
    return found


def tweak(fdp: atheris.FuzzedDataProvider, value):
    """A near miss of ``value``: off by one, another type of the same number, and so on."""
    try:
        return _tweak(fdp, value)
    except (OverflowError, ValueError):  # float(10**400), int(inf), int(nan)
        return value


def _tweak(fdp: atheris.FuzzedDataProvider, value):
    choice = fdp.ConsumeIntInRange(0, 9)
    if isinstance(value, bool) or value is None:
        return fdp.PickValueInList([not value, 0, 1, "true", None, [value]])
    if isinstance(value, int):
        return [value + 1, value - 1, -value, value * 2**32, float(value), str(value), bool(value),
                Raw(f"{value}.0"), value + 2**64, 10**400][choice]
    if isinstance(value, float):
        return [value * 2, -value, value * 1e300, value / 1e300, int(value), str(value),
                Raw(repr(value) + "e400"), math.nextafter(value, math.inf), 10**400,
                value * 2.0**-149][choice]
    if isinstance(value, str):
        return [value + "x", value[:-1], value.upper(), "", value + "\ud800", " " + value,
                value * 2, [value], "\x00" + value, value.encode().hex()][choice]
    if isinstance(value, list):
        return [value[:-1], value + value[-1:], value[::-1], [], [value], {"0": value},
                value[1:], value + [None], value * 2, value[:1]][choice]
    return [dict(list(value.items())[:-1]), {}, [value], {**value, "extra": 1}, value, value,
            value, value, value, value][choice]


def mutate_tree(fdp: atheris.FuzzedDataProvider, root):
    """``root`` (a parsed JSON document, edited in place) after 1 to 4 provider-chosen edits."""
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        nodes = _nodes(root)
        if not nodes or fdp.ConsumeIntInRange(0, 31) == 31:
            root = fuzz_json(fdp)
            continue
        container, key = nodes[fdp.ConsumeIntInRange(0, len(nodes) - 1)]
        operation = fdp.ConsumeIntInRange(0, 5)
        if operation <= 1:
            container[key] = tweak(fdp, container[key])
        elif operation == 2:
            container[key] = fuzz_json(fdp)
        elif operation == 3:
            del container[key]
        elif operation == 4:
            if isinstance(container, dict):
                names = list(container) + ["extra", "", "format", "name", "count", "config"]
                container[fdp.PickValueInList(names) + fdp.ConsumeUnicode(1)] = fuzz_json(fdp)
            else:
                container.insert(key, fuzz_json(fdp))
        else:  # copy another node's value here (same-shaped data in the wrong place)
            other, other_key = nodes[fdp.ConsumeIntInRange(0, len(nodes) - 1)]
            try:
                container[key] = json.loads(dump_json(other[other_key]))
            except (ValueError, RecursionError):
                pass
    return root


def mutate_bytes(fdp: atheris.FuzzedDataProvider, data: bytes, maximum_edits: int = 8) -> bytes:
    """``data`` after 1 to ``maximum_edits`` byte-level edits chosen by the provider."""
    out = bytearray(data)
    for _ in range(fdp.ConsumeIntInRange(1, maximum_edits)):
        position = fdp.ConsumeIntInRange(0, len(out))
        operation = fdp.ConsumeIntInRange(0, 6)
        if operation == 0 and position < len(out):
            out[position] ^= 1 << fdp.ConsumeIntInRange(0, 7)
        elif operation == 1 and position < len(out):
            out[position] = fdp.ConsumeIntInRange(0, 255)
        elif operation == 2:
            out[position:position] = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 16))
        elif operation == 3:
            del out[position : position + fdp.ConsumeIntInRange(1, 64)]
        elif operation == 4:
            del out[position:]
        elif operation == 5:
            value = fdp.PickValueInList([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, len(out), position])
            out[position : position + 4] = struct.pack("<I", value)
        else:
            length = fdp.ConsumeIntInRange(1, 32)
            out[position:position] = out[fdp.ConsumeIntInRange(0, len(out)) :][:length]
    return bytes(out)


def repack(members: list[tuple[str, bytes]]) -> bytes:
    """A deterministic stored ZIP of ``members``: CRC-32s and offsets all correct."""
    buffer = io.BytesIO()
    write_stored_zip(buffer, members)
    return buffer.getvalue()


class ZipSample:
    """A valid archive split into its members (manifest parsed) for the structured modes."""

    def __init__(self, data: bytes, expected, optional=()):
        members = read_stored_zip(data, expected, "<seed>", optional)
        self.data = data
        self.members = [(name, bytes(body)) for name, body in members.items()]
        self.manifest_text = self.members[0][1]


def edit_members(fdp: atheris.FuzzedDataProvider, members: list[tuple[str, bytes]], names):
    """Sometimes drop, duplicate, rename or reorder a member (the archive's member list)."""
    members = list(members)
    choice = fdp.ConsumeIntInRange(0, 15)  # 0 (also when the provider is exhausted): no change
    if choice < 12:
        return members
    index = fdp.ConsumeIntInRange(0, len(members) - 1)
    if choice == 12 and len(members) > 1:
        del members[index]
    elif choice == 13:
        members.insert(index, members[index])
    elif choice == 14:
        members[index] = (fdp.PickValueInList(list(names)), members[index][1])
    else:
        members.reverse()
    return members


def zip_case(fdp, samples: list[ZipSample], fixup, member_names) -> bytes:
    """A fuzzed archive derived from a valid sample (see the module docstring)."""
    sample = samples[fdp.ConsumeIntInRange(0, len(samples) - 1)]
    mode = fdp.ConsumeIntInRange(0, 3)
    if mode == 0:  # the archive bytes themselves (the ZIP reader and its CRC checks)
        return mutate_bytes(fdp, sample.data)
    members = list(sample.members)
    if mode == 1:  # one member's bytes, re-packed with a correct CRC
        index = fdp.ConsumeIntInRange(0, len(members) - 1)
        name, body = members[index]
        members[index] = (name, mutate_bytes(fdp, body))
        if index and fdp.ConsumeIntInRange(0, 3) != 3:  # a payload: repair the manifest's hashes
            manifest = json.loads(sample.manifest_text)
            fixup(manifest, members)
            members[0] = (members[0][0], json_bytes(manifest))
    elif mode == 2:  # the manifest as a JSON tree, hashes and ids optionally repaired
        manifest = mutate_tree(fdp, json.loads(sample.manifest_text))
        if fdp.ConsumeIntInRange(0, 3) == 3:  # new float values for a payload member
            index = fdp.ConsumeIntInRange(1, len(members) - 1)
            floats = fdp.ConsumeFloatList(fdp.ConsumeIntInRange(0, 64))
            members[index] = (members[index][0], array("f", floats).tobytes())
        if fdp.ConsumeIntInRange(0, 7) != 7:
            fixup(manifest, members)
        canonical = fdp.ConsumeIntInRange(0, 15) != 15
        members[0] = (members[0][0], json_bytes(manifest, canonical, fdp.ConsumeBool()))
    else:  # raw fuzzer text as the manifest, the payloads kept
        members[0] = (members[0][0], fdp.ConsumeBytes(fdp.remaining_bytes()))
    return repack(edit_members(fdp, members, member_names))


def fix_id(manifest, key: str) -> None:
    """Recompute ``manifest[key]`` as SHA-256 of the canonical manifest without it."""
    if isinstance(manifest, dict) and key in manifest:
        without = {name: value for name, value in manifest.items() if name != key}
        try:
            manifest[key] = sha256_hex(json_bytes(without))
        except (ValueError, RecursionError):
            pass


def _accept(call):
    """``call()``, or None when it raises ValueError (the contract's only allowed failure)."""
    try:
        return call()
    except ValueError:
        return None


# ---- target: bundle ---------------------------------------------------------------------------

BUNDLE_MEMBERS = ("manifest.json", "weights.f32le")
_BUNDLES: list[ZipSample] = []


def _fix_bundle(manifest, members) -> None:
    weights = dict(members).get("weights.f32le", b"")
    entry = manifest.get("weights") if isinstance(manifest, dict) else None
    if isinstance(entry, dict):
        entry["sha256"] = sha256_hex(weights)
        if len(weights) % 4 == 0 and entry.get("count") != len(weights) // 4:
            entry["count"] = len(weights) // 4
    fix_id(manifest, "artifact_id")


def bundle_input(data: bytes) -> bytes:
    if data.startswith(b"PK\x03\x04"):
        return data
    fdp = atheris.FuzzedDataProvider(data)
    return zip_case(fdp, _BUNDLES, _fix_bundle, BUNDLE_MEMBERS + ("extra",))


def check_bundle(data: bytes) -> None:
    bundle = _accept(lambda: ModelBundle.from_bytes(data, "<fuzz>"))
    if bundle is None:
        return
    # What load accepts round-trips exactly and builds natively.
    again = ModelBundle.from_bytes(bundle.to_bytes(), "<again>")
    assert again.manifest_bytes == bundle.manifest_bytes, "bundle round trip changed the manifest"
    assert again.weights == bundle.weights, "bundle round trip changed the weights"
    with bundle.tokenizer() as tokenizer:
        assert tokenizer.vocab_size == bundle.config.vocabulary_size
    if bundle.weight_count <= 50_000:
        bundle.instantiate().close()


# ---- target: checkpoint -----------------------------------------------------------------------

CHECKPOINT_MEMBERS = (
    "manifest.json", "model.f32le", "model-nf4.rtnf4", "adapter.f32le",
    "adam-first-moments.f32le", "adam-second-moments.f32le",
)
_CHECKPOINTS: list[ZipSample] = []


def _fix_checkpoint(manifest, members) -> None:
    bodies = dict(members)
    entries = manifest.get("members") if isinstance(manifest, dict) else None
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"] in bodies:
                body = bodies[entry["name"]]
                entry["sha256"] = sha256_hex(body)
                entry["bytes"] = len(body)
                if entry.get("dtype") == "float32" and len(body) % 4 == 0:
                    entry["count"] = len(body) // 4
    fix_id(manifest, "checkpoint_id")


def checkpoint_input(data: bytes) -> bytes:
    if data.startswith(b"PK\x03\x04"):
        return data
    fdp = atheris.FuzzedDataProvider(data)
    return zip_case(fdp, _CHECKPOINTS, _fix_checkpoint, CHECKPOINT_MEMBERS)


def check_checkpoint(data: bytes) -> None:
    checkpoint = _accept(lambda: TrainingCheckpoint.from_bytes(data, "<fuzz>"))
    if checkpoint is None:
        return
    again = TrainingCheckpoint.from_bytes(checkpoint.to_bytes(), "<again>")
    assert again.checkpoint_id == checkpoint.checkpoint_id, "checkpoint round trip changed the id"
    tokenizer = checkpoint.tokenizer()  # a validated tokenizer state must build natively
    if tokenizer is not None:
        tokenizer.close()
    checkpoint.adam_options()  # validated options must build


# ---- target: safetensors ----------------------------------------------------------------------

_SAFETENSORS: list[bytes] = []


def _safetensors_case(fdp: atheris.FuzzedDataProvider) -> bytes:
    mode = fdp.ConsumeIntInRange(0, 3)
    sample = _SAFETENSORS[fdp.ConsumeIntInRange(0, len(_SAFETENSORS) - 1)]
    if mode == 0:
        return mutate_bytes(fdp, sample)
    length = int.from_bytes(sample[:8], "little")
    header, payload = json.loads(sample[8 : 8 + length]), sample[8 + length :]
    if mode == 1:  # the header as a JSON tree
        header = mutate_tree(fdp, header)
        if fdp.ConsumeIntInRange(0, 3) == 3:
            payload = mutate_bytes(fdp, payload)
        text = json_bytes(header, fdp.ConsumeBool(), fdp.ConsumeBool())
    elif mode == 2:  # a generated header: mostly consistent tensors, sometimes not
        header, payload, offset = {}, b"", 0
        for index in range(fdp.ConsumeIntInRange(0, 6)):
            shape = [fdp.ConsumeIntInRange(0, 4) for _ in range(fdp.ConsumeIntInRange(0, 3))]
            count = math.prod(shape)
            floats = fdp.ConsumeFloatList(count) if fdp.ConsumeBool() else [1.0] * count
            floats += [0.0] * (count - len(floats))
            end = offset + 4 * count + (fdp.ConsumeIntInRange(-4, 4) if fdp.ConsumeIntInRange(0, 7) == 7 else 0)
            begin = offset if fdp.ConsumeIntInRange(0, 7) != 7 else fdp.ConsumeIntInRange(0, 64)
            name = fdp.PickValueInList(["w", "b", "", "__metadata__", f"t{index}", "\ud800", "w"])
            header[name] = {"dtype": fdp.PickValueInList(["F32"] * 6 + ["F16", "f32", 1]),
                            "shape": shape, "data_offsets": [begin, end]}
            payload += array("f", floats).tobytes()
            offset = end
        if fdp.ConsumeBool():
            header["__metadata__"] = {fdp.ConsumeUnicode(3): fuzz_json(fdp) for _ in range(2)}
        text = json_bytes(header, fdp.ConsumeBool(), fdp.ConsumeBool())
        text += b" " * fdp.ConsumeIntInRange(0, 9)
    else:  # raw header text after a correct length prefix
        text = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096))
        payload = fdp.ConsumeBytes(fdp.remaining_bytes())
    prefix = len(text)
    if fdp.ConsumeIntInRange(0, 15) == 15:
        prefix = fdp.PickValueInList([0, max(prefix - 1, 0), prefix + 1, 2**63, 2**64 - 1, 100 * 2**20 + 1])
    return prefix.to_bytes(8, "little") + text + payload


def safetensors_input(data: bytes) -> bytes:
    if len(data) >= 9 and data[8:9] == b"{" and data[5:8] == b"\0\0\0":
        return data
    return _safetensors_case(atheris.FuzzedDataProvider(data))


def check_safetensors(data: bytes) -> None:
    parsed = _accept(lambda: parse_safetensors(data, "<fuzz>"))
    if parsed is None:
        return
    tensors, metadata = parsed
    for name, tensor in tensors.items():
        assert tensor.name == name and len(tensor.values) == math.prod(tensor.shape)
        assert all(map(math.isfinite, tensor.values))
    try:
        encoded = encode_safetensors({name: (t.shape, t.values) for name, t in tensors.items()}, metadata)
    except ValueError:
        return  # e.g. an empty tensor name: the reader allows it, the writer does not
    tensors_again, metadata_again = parse_safetensors(encoded, "<again>")
    assert metadata_again == metadata, "safetensors round trip changed the metadata"
    assert {n: (t.shape, t.values.tobytes()) for n, t in tensors_again.items()} == {
        n: (t.shape, t.values.tobytes()) for n, t in tensors.items()
    }, "safetensors round trip changed the tensors"


# ---- target: jsonl ----------------------------------------------------------------------------

ROLES = ["system", "user", "assistant", "tool", "", "Assistant", 1, None]


def _text(fdp: atheris.FuzzedDataProvider):
    choice = fdp.ConsumeIntInRange(0, 15)
    if choice == 0:
        return fuzz_json(fdp)
    if choice == 1:
        return fdp.PickValueInList([" ", "\t\n", "\ud800", "\u00a0", "\x00", "\ufeff", ""])
    return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 16))


def _jsonl_case(fdp: atheris.FuzzedDataProvider) -> bytes | str:
    if fdp.ConsumeIntInRange(0, 7) == 7:  # raw text through the str path
        return fdp.ConsumeBytes(fdp.remaining_bytes()).decode("utf-8", "surrogateescape")
    lines = []
    for _ in range(fdp.ConsumeIntInRange(0, 5)):
        kind = fdp.ConsumeIntInRange(0, 7)
        if kind <= 2:
            record = {"prompt": _text(fdp), "response": _text(fdp)}
        elif kind <= 5:
            record = {"messages": [
                {"role": fdp.PickValueInList(ROLES), "content": _text(fdp)}
                for _ in range(fdp.ConsumeIntInRange(0, 4))
            ]}
            if fdp.ConsumeIntInRange(0, 3) != 3:
                record["messages"].append({"role": "assistant", "content": _text(fdp)})
        elif kind == 6:
            record = fuzz_json(fdp)
        else:
            lines.append(fdp.PickValueInList(["", "   ", "\t", "\r", "{", "[]", "null", "\ufeff{}"]))
            continue
        if fdp.ConsumeIntInRange(0, 3) == 3:
            record = mutate_tree(fdp, record)
        lines.append(dump_json(record, fdp.ConsumeBool(), fdp.ConsumeBool()))
    text = fdp.PickValueInList(["\n", "\r\n", "\n\n"]).join(lines)
    if fdp.ConsumeIntInRange(0, 7) == 7:
        text = "\ufeff" + text
    data = text.encode("utf-8", "surrogatepass")
    if fdp.ConsumeIntInRange(0, 7) == 7:
        data = mutate_bytes(fdp, data)
    return data if fdp.ConsumeIntInRange(0, 3) != 3 else data.decode("utf-8", "surrogateescape")


def jsonl_input(data: bytes) -> bytes | str:
    if data[:1] in (b"{", b" ", b"\n", b"\xef"):
        return data
    return _jsonl_case(atheris.FuzzedDataProvider(data))


def check_jsonl(data: bytes | str) -> None:
    examples = _accept(lambda: parse_instructions_jsonl(data, "<fuzz>"))
    if examples is None:
        return
    formatter = PlainChatFormatter()
    for example in examples:
        assert isinstance(example, (InstructionExample, Conversation))
        pieces = formatter.segments(example)
        assert "".join(text for text, _ in pieces) == formatter.format(example)
    text = "\n".join(json.dumps(example.to_record()) for example in examples)
    assert parse_instructions_jsonl(text, "<again>") == examples, "JSONL round trip changed"


# ---- target: tokenizer_state (pure validator vs native constructor) --------------------------

ODD_IDS = [-1, 256, 2**32, 2**64, True, False, 1.0, "a", None, [1], 10**400]


def _tokenizer_state_case(fdp: atheris.FuzzedDataProvider):
    method = fdp.ConsumeIntInRange(0, 15)
    odd = fdp.ConsumeIntInRange(0, 3) == 3  # one deliberately broken detail
    if method < 7:  # byte: distinct bytes, sometimes repeated or out of range
        count = fdp.ConsumeIntInRange(0, 260)
        raw = fdp.ConsumeBytes(count)
        vocabulary = list(dict.fromkeys(raw)) if fdp.ConsumeIntInRange(0, 3) != 3 else list(raw)
        if odd and vocabulary:
            vocabulary[fdp.ConsumeIntInRange(0, len(vocabulary) - 1)] = fdp.PickValueInList(ODD_IDS)
        if odd and fdp.ConsumeBool():
            vocabulary = fdp.PickValueInList([[], list(range(256)) + [0], list(range(256)), "abc"])
        return {"method": "byte", "byte_vocabulary": vocabulary}
    if method < 14:  # bpe: rules that refer to earlier ids, sometimes broken
        rules = []
        for index in range(fdp.ConsumeIntInRange(0, 48)):
            result = 256 + index
            left = fdp.ConsumeIntInRange(0, result - 1)
            right = fdp.ConsumeIntInRange(0, result - 1)
            rules.append([left, right, result])
        if odd and rules:
            index = fdp.ConsumeIntInRange(0, len(rules) - 1)
            position = fdp.ConsumeIntInRange(0, 3)
            if position == 3:
                rules[index] = fdp.PickValueInList([rules[index][:2], rules[index] + [0], {}, "abc"])
            elif fdp.ConsumeBool():
                rules[index][position] = fdp.PickValueInList(ODD_IDS)
            else:
                rules[index][position] = fdp.PickValueInList(
                    [256 + index, 255 + index, 257 + index, 2**32 - 1]
                )
        if odd and fdp.ConsumeBool() and rules:  # a repeated pair
            first = rules[fdp.ConsumeIntInRange(0, len(rules) - 1)]
            if isinstance(first, list) and len(first) >= 2:
                rules.append([first[0], first[1], 256 + len(rules)])
        return {"method": "bpe", "merge_rules": rules}
    state = {"method": fdp.PickValueInList(["byte", "bpe", "BPE", "", None, 1])}
    state[fdp.PickValueInList(["byte_vocabulary", "merge_rules", "extra"])] = fuzz_json(fdp)
    return mutate_tree(fdp, state) if fdp.ConsumeBool() else state


def _native_arguments(state):
    """``Tokenizer.from_state`` arguments for a state of the right outline, else None."""
    if not isinstance(state, dict) or len(state) != 2:
        return None
    if state.get("method") == "byte" and isinstance(state.get("byte_vocabulary"), list):
        return ("byte",), {"byte_vocabulary": state["byte_vocabulary"]}
    if state.get("method") == "bpe" and isinstance(state.get("merge_rules"), list):
        rules = [tuple(rule) if isinstance(rule, list) else rule for rule in state["merge_rules"]]
        return ("bpe",), {"merge_rules": rules}
    return None


def tokenizer_state_input(data: bytes):
    """``(state, sample bytes)``, or None for raw JSON that does not parse."""
    if data[:1] == b"{":  # raw JSON mode
        try:
            return json.loads(data.decode("utf-8")), b"hello, world \x00\xff"
        except (ValueError, RecursionError):
            return None
    fdp = atheris.FuzzedDataProvider(data)
    state = _tokenizer_state_case(fdp)
    return state, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))


def check_tokenizer_state(case) -> None:
    if case is None:
        return
    state, sample = case
    try:
        vocabulary_size = validate_tokenizer_state(state, "<fuzz>")
    except ValueError:
        vocabulary_size = None
    arguments = _native_arguments(state)
    if vocabulary_size is None:
        if arguments is None:
            return
        try:
            tokenizer = Tokenizer.from_state(*arguments[0], **arguments[1])
        except (RiftcoTransformerError, ValueError, TypeError):
            return  # both reject
        tokenizer.close()
        raise AssertionError(f"validator rejects, native accepts: {state!r}"[:2000])
    assert arguments is not None, "validator accepted a state of the wrong outline"
    with Tokenizer.from_state(*arguments[0], **arguments[1]) as tokenizer:
        assert tokenizer.vocab_size == vocabulary_size, (tokenizer.vocab_size, vocabulary_size)
        method, vocabulary, rules = tokenizer.state()
        if state["method"] == "byte":
            assert (method, vocabulary) == ("byte", bytes(state["byte_vocabulary"]))
            sample = bytes(vocabulary[byte % len(vocabulary)] for byte in sample)
        else:
            assert (method, [list(rule) for rule in rules]) == ("bpe", state["merge_rules"])
        ids = tokenizer.encode_bytes(sample)
        assert all(0 <= token < vocabulary_size for token in ids)
        assert tokenizer.decode_bytes(ids) == sample, "decode(encode(b)) != b"


# ---- target: tokenizer_json (Hugging Face tokenizer.json) -------------------------------------

TOKENIZER_JSON_SOURCE = "<fuzz>/tokenizer.json"
_TOKENIZER_JSONS: list[dict] = []  # valid parsed documents (make_seeds.tokenizer_json_documents)

# Texts every accepted tokenizer encodes (both special-token modes) and decodes: ASCII,
# multilingual, special-token-like text, and runs longer than 48 symbols (the merger's heap).
TOKENIZER_TEXTS = [
    "",
    "hello world, the quick brown fox. It's 123 o'clock\n\tand  spaces \r\n",
    "Gr\u00fc\u00dfe \u2014 \u00bd \u0663 \u041f\u0440\u0438\u0432\u0435\u0442 \u4e16\u754c "
    "\U0001d518 \U0001f642\U0001f44d\U0001f3fd e\u0301",
    "<|endoftext|><|im_start|>user\nhi<|im_end|><s></s><unk><tool> <0x41>\u2581the \u0120the",
    "hellothe" * 8,
    " hello the world" * 4,
    "\x00nul\x7f\x01",
]
PRE_TOKENIZERS = [
    None,
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    {"type": "ByteLevel"},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": make_seeds._SPLIT_LLAMA3}, "behavior": "Isolated"},
        {"type": "ByteLevel", "use_regex": False}]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": make_seeds._SPLIT_QWEN2}}, {"type": "ByteLevel"}]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}}, {"type": "ByteLevel"}]},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": make_seeds._SPLIT_LLAMA3}},
        {"type": "Split", "pattern": {"Regex": make_seeds._SPLIT_QWEN2}}, {"type": "ByteLevel"}]},
    {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                           {"type": "ByteLevel"}]},
    {"type": "Sequence", "pretokenizers": []},
    {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True},
    {"type": "Metaspace", "prepend_scheme": "first"},
    {"type": "Metaspace", "prepend_scheme": "never", "add_prefix_space": False},
    {"type": "Whitespace"},
    {"type": "Sequence"},
    {"type": 1},
]
NORMALIZERS = [
    None,
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                         {"type": "Replace", "pattern": {"String": " "},
                                          "content": "\u2581"}]},
    {"type": "NFC"},
    {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"kind": "Prepend"}]},
    {"type": "Sequence", "normalizers": "Prepend"},
]
TOKEN_TEXTS = ["<0x41>", "<0xZZ>", "<0x4>", "<0x100>", "<unk>", "<s>", "\u2581", "\u2581x",
               "\u0120", "\u0120x", "\u010a", "a", "<|x|>", "\ud800", "", " ", "a b", "\u00e9",
               "\x00", "\U0001f642", "<|endoftext|>", "\u0100\u0100"]


def _vocab_of(document):
    model = document.get("model") if isinstance(document, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    return model, vocab


def _some_token(fdp: atheris.FuzzedDataProvider, vocab) -> str:
    """A token text: usually one of ``vocab``'s (late entries favoured: merges and specials)."""
    texts = list(vocab) if isinstance(vocab, dict) and vocab else []
    choice = fdp.ConsumeIntInRange(0, 7)
    if texts and choice <= 2:
        return texts[-1 - fdp.ConsumeIntInRange(0, min(len(texts), 40) - 1)]
    if texts and choice <= 4:
        return texts[fdp.ConsumeIntInRange(0, len(texts) - 1)]
    if choice == 5:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(1, 6))
    return fdp.PickValueInList(TOKEN_TEXTS)


def _some_id(fdp: atheris.FuzzedDataProvider, size: int):
    """A token id: the next free one mostly, else a taken, skipped, huge or mistyped one."""
    choice = fdp.ConsumeIntInRange(0, 7)
    if choice <= 3:
        return size
    if choice == 4 and size:
        return fdp.ConsumeIntInRange(0, size - 1)
    return fdp.PickValueInList([size + 1, -1, 2**32 - 2, 2**32 - 1, 2**32, 2**64, "7", True,
                                1.0, None, Raw("1e400"), float(size)])


def _tokenizer_edit(fdp: atheris.FuzzedDataProvider, document: dict) -> None:
    """One edit that knows the format (each one valid more often than not)."""
    model, vocab = _vocab_of(document)
    if not isinstance(vocab, dict) or not isinstance(model, dict):
        document.update(model={"type": "BPE", "vocab": {"a": 0}, "merges": []})
        return
    added = document.get("added_tokens")
    if not isinstance(added, list):
        added = document["added_tokens"] = []
    merges = model.get("merges")
    if not isinstance(merges, list):
        merges = model["merges"] = []
    size = len(vocab) + sum(1 for entry in added if isinstance(entry, dict)
                            and isinstance(entry.get("content"), str)
                            and entry["content"] not in vocab)
    operation = fdp.ConsumeIntInRange(0, 12)
    if operation <= 2:  # a merge of two tokens whose concatenation is (made) a token
        left, right = _some_token(fdp, vocab), _some_token(fdp, vocab)
        if fdp.ConsumeIntInRange(0, 3) != 3 and left + right not in vocab:
            vocab[left + right] = _some_id(fdp, size)
        merge = [left, right] if fdp.ConsumeBool() else f"{left} {right}"
        merges.insert(fdp.ConsumeIntInRange(0, len(merges)), merge)
    elif operation == 3:  # a token
        vocab[_some_token(fdp, vocab)] = _some_id(fdp, size)
    elif operation == 4 and vocab:  # drop a token (perhaps one a merge needs)
        del vocab[list(vocab)[fdp.ConsumeIntInRange(0, len(vocab) - 1)]]
    elif operation == 5 and len(vocab) >= 2:  # two tokens swap ids (still dense)
        texts = list(vocab)
        first = texts[fdp.ConsumeIntInRange(0, len(texts) - 1)]
        second = texts[fdp.ConsumeIntInRange(0, len(texts) - 1)]
        vocab[first], vocab[second] = vocab[second], vocab[first]
    elif operation == 6:  # an added token: new, repeating a vocab entry, or clashing
        content = _some_token(fdp, vocab)
        if content in vocab and fdp.ConsumeIntInRange(0, 2) != 2:
            index = vocab[content]
        else:
            index = _some_id(fdp, size)
        entry = {"id": index, "content": content}
        special = fdp.PickValueInList([True, False, None, "yes", 1, "absent"])
        if special != "absent":
            entry["special"] = special
        added.insert(fdp.ConsumeIntInRange(0, len(added)), entry)
    elif operation == 7 and merges:  # a merge repeated, dropped or moved
        index = fdp.ConsumeIntInRange(0, len(merges) - 1)
        kind = fdp.ConsumeIntInRange(0, 2)
        if kind == 0:
            merges.append(merges[index])
        elif kind == 1:
            del merges[index]
        else:
            merges.insert(0, merges.pop(index))
    elif operation == 8:
        document["pre_tokenizer"] = json.loads(json.dumps(fdp.PickValueInList(PRE_TOKENIZERS)))
    elif operation == 9:
        document["normalizer"] = json.loads(json.dumps(fdp.PickValueInList(NORMALIZERS)))
    elif operation == 10:
        model[fdp.PickValueInList(["byte_fallback", "ignore_merges", "unk_token", "type"])] = \
            fdp.PickValueInList([True, False, None, "true", "<unk>", "<s>", "missing", 0, "BPE",
                                 "WordPiece", "Unigram", _some_token(fdp, vocab)])
    elif operation == 11:  # one token text on a byte-level / SentencePiece boundary
        vocab[fdp.PickValueInList(TOKEN_TEXTS)] = _some_id(fdp, size)
    else:  # a subtree of the document edited generically
        mutate_tree(fdp, fdp.PickValueInList([document, model, added, merges,
                                              document.get("pre_tokenizer") or {}]))


class _Pairs(list):
    """A JSON object written from (key, value) pairs, so a key can appear twice."""


def _dump_with_pairs(value, canonical: bool, ascii_only: bool) -> str:
    if isinstance(value, _Pairs):
        comma, colon = (",", ":") if canonical else (", ", ": ")
        return "{" + comma.join(json.dumps(key, ensure_ascii=ascii_only) + colon
                                + _dump_with_pairs(item, canonical, ascii_only)
                                for key, item in value) + "}"
    if isinstance(value, dict) and any(isinstance(item, (_Pairs, dict, list))
                                       for item in value.values()):
        return _dump_with_pairs(_Pairs(value.items()), canonical, ascii_only)
    if isinstance(value, list) and any(isinstance(item, (_Pairs, dict, list)) for item in value):
        comma = "," if canonical else ", "
        return "[" + comma.join(_dump_with_pairs(item, canonical, ascii_only)
                                for item in value) + "]"
    return dump_json(value, canonical, ascii_only)


def _duplicate_a_key(fdp: atheris.FuzzedDataProvider, document):
    """``document`` with one object's key written twice (the second with another value)."""
    objects = [(container, key) for container, key in _nodes(document, 600)
               if isinstance(container[key], dict) and container[key]]
    if not objects:
        return document
    container, key = objects[fdp.ConsumeIntInRange(0, len(objects) - 1)]
    pairs = _Pairs(container[key].items())
    name = pairs[fdp.ConsumeIntInRange(0, len(pairs) - 1)][0]
    pairs.insert(fdp.ConsumeIntInRange(0, len(pairs)), (name, fuzz_json(fdp)))
    container[key] = pairs
    return document


def _tokenizer_json_case(fdp: atheris.FuzzedDataProvider) -> bytes:
    sample = _TOKENIZER_JSONS[fdp.ConsumeIntInRange(0, len(_TOKENIZER_JSONS) - 1)]
    document = json.loads(json.dumps(sample))  # a copy to edit
    mode = fdp.ConsumeIntInRange(0, 15)
    if mode == 0:  # the file's bytes
        return mutate_bytes(fdp, json.dumps(document).encode("utf-8"))
    if mode == 1:  # raw fuzzer text
        return fdp.ConsumeBytes(fdp.remaining_bytes())
    if mode <= 4:  # generic JSON-tree edits
        document = mutate_tree(fdp, document)
    else:  # format-aware edits, sometimes followed by generic ones
        for _ in range(fdp.ConsumeIntInRange(1, 6)):
            if isinstance(document, dict):
                _tokenizer_edit(fdp, document)
        if fdp.ConsumeIntInRange(0, 7) == 7:
            document = mutate_tree(fdp, document)
    if fdp.ConsumeIntInRange(0, 15) == 15:
        document = _duplicate_a_key(fdp, document)
    text = _dump_with_pairs(document, fdp.ConsumeBool(), fdp.ConsumeBool())
    data = text.encode("utf-8", "surrogatepass")
    if fdp.ConsumeIntInRange(0, 15) == 15:
        data = mutate_bytes(fdp, data, 3)
    return data


def tokenizer_json_input(data: bytes) -> bytes:
    if data[:1] == b"{":  # raw JSON mode: the file's bytes as they are
        return data
    return _tokenizer_json_case(atheris.FuzzedDataProvider(data))


_BYTE_SYMBOLS = make_seeds.byte_level_alphabet()


def _must_round_trip(state: dict) -> bool:
    """Whether decode(encode(text)) == text must hold (the rule of tools/fuzz/gguf_fuzzer.cpp,
    a little stricter): byte-level BPE whose 256 byte symbols are normal tokens and whose
    merges all give normal tokens; SentencePiece with all 256 byte tokens, no dummy prefix and
    U+2581 a normal token, for text without U+2581 (a space is encoded as U+2581, which a
    normal token decodes as a space but byte tokens as U+2581 itself: without a normal U+2581
    token a space comes back as U+2581, as the tokenizers package gives it when the
    vocabulary has no U+2581)."""
    types = state["token_types"]
    ids = {text: index for index, text in enumerate(state["tokens"])}

    def typed(text: str, kind: str) -> bool:
        return text in ids and types[ids[text]] == TOKEN_TYPE_VALUES[kind]

    if state["model"] == "byte_level_bpe":
        return (all(typed(symbol, "normal") for symbol in _BYTE_SYMBOLS)
                and all(typed(merge.replace(" ", "", 1), "normal") for merge in state["merges"]))
    return (not state["add_dummy_prefix"] and typed("\u2581", "normal")
            and all(typed(f"<0x{byte:02X}>", "byte") for byte in range(256)))


def check_tokenizer_json(data: bytes) -> None:
    """What ``PretrainedTokenizer.from_tokenizer_json`` does once it has read the file."""
    try:
        document = strict_json(data, TOKENIZER_JSON_SOURCE)
        tokenizer = PretrainedTokenizer.from_tokenizer_document(document, TOKENIZER_JSON_SOURCE)
    except ValueError as error:
        message = str(error)
        assert message.startswith(TOKENIZER_JSON_SOURCE + ": "), f"not naming the file: {message}"
        return
    with tokenizer:
        size = tokenizer.vocabulary_size
        state = tokenizer.state()
        assert len(state["tokens"]) == size and len(state["token_types"]) == size
        exact = _must_round_trip(state)
        texts = TOKENIZER_TEXTS + state["tokens"][-8:]
        for text in texts:
            for special in (True, False):
                ids = tokenizer.encode(text, special)
                assert all(0 <= index < size for index in ids), (text, ids, size)
                decoded = tokenizer.decode_bytes(ids)
                tokenizer.decode(ids)
                if exact and (state["model"] == "byte_level_bpe" or "\u2581" not in text):
                    assert decoded == text.encode("utf-8"), \
                        f"decode(encode({text!r}, special={special})) = {decoded!r}"
        tokenizer.control_tokens()
        # load_huggingface rebuilds the tokenizer from its state with tokenizer_config.json's
        # bos/eos: the state must build again, to the same tokenizer.
        wanted = {**state, "bos_id": 0 if size else None, "eos_id": size - 1 if size else None}
        with PretrainedTokenizer.from_state(wanted) as again:
            assert again.state() == wanted, "from_state(state()) changed the tokenizer"
            for text in texts[1:4]:
                assert again.encode(text) == tokenizer.encode(text), \
                    f"from_state(state()) encodes {text!r} differently"


# ---- main -------------------------------------------------------------------------------------

# target -> (fuzzer bytes -> loader input, loader input -> None or an escaping exception)
TARGETS = {
    "bundle": (bundle_input, check_bundle),
    "checkpoint": (checkpoint_input, check_checkpoint),
    "safetensors": (safetensors_input, check_safetensors),
    "jsonl": (jsonl_input, check_jsonl),
    "tokenizer_state": (tokenizer_state_input, check_tokenizer_state),
    "tokenizer_json": (tokenizer_json_input, check_tokenizer_json),
}


def _prepare(target: str) -> None:
    """The valid samples the structured modes start from (made in-process, deterministic)."""
    if target == "bundle":
        _BUNDLES.extend(ZipSample(data, BUNDLE_MEMBERS) for _, data in make_seeds.bundle_samples())
    elif target == "checkpoint":
        _CHECKPOINTS.extend(
            ZipSample(data, CHECKPOINT_MEMBERS[:2], CHECKPOINT_MEMBERS[2:])
            for _, data in make_seeds.checkpoint_samples()
        )
    elif target == "safetensors":
        _SAFETENSORS.extend(data for _, data in make_seeds.safetensors_samples())
    elif target == "tokenizer_json":
        _TOKENIZER_JSONS.extend(document for _, document in make_seeds.tokenizer_json_documents())


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--target", required=True, choices=sorted(TARGETS))
    parser.add_argument(
        "--decode", nargs=2, metavar=("FUZZ_INPUT", "OUT"),
        help="write the loader input that FUZZ_INPUT (e.g. a crash file) stands for to OUT, "
        "then exit (for the tokenizer_state target: JSON with the state and the sample's hex)",
    )
    arguments, libfuzzer_arguments = parser.parse_known_args()
    _prepare(arguments.target)
    derive, check = TARGETS[arguments.target]
    if arguments.decode:
        case = derive(open(arguments.decode[0], "rb").read())
        if arguments.target == "tokenizer_state":
            case = None if case is None else json_bytes({"state": case[0], "sample_hex": case[1].hex()})
        elif isinstance(case, str):
            case = case.encode("utf-8", "surrogateescape")
        with open(arguments.decode[1], "wb") as stream:
            stream.write(b"" if case is None else case)
        return

    def test_one_input(data: bytes) -> None:
        try:
            check(derive(data))
        except Exception as error:  # noqa: BLE001 - atheris reports whatever we re-raise
            if _ignored(error):
                return
            raise

    atheris.Setup([sys.argv[0], *libfuzzer_arguments], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
