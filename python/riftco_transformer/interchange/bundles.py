"""Bundles to and from safetensors F32, losslessly.

:func:`export_bundle_safetensors` writes every parameter of a ``.rift`` bundle as a float32
tensor under its native name (``blocks.0.attention.query.weight`` ...), in canonical order,
and keeps everything else the bundle knows in the string ``__metadata__``:
``riftco.format`` (``"riftco-transformer-model-bundle"``), ``riftco.architecture``,
``riftco.config``, ``riftco.tokenizer``, ``riftco.stage``, ``riftco.parent_artifact_id`` and
``riftco.metadata`` (canonical JSON strings), and ``riftco.artifact_id``. Any safetensors
reader (the ``safetensors`` package, PyTorch, numpy) sees plain named F32 tensors.

:func:`import_bundle_safetensors` rebuilds the bundle from such a file: the same manifest,
hence the same ``artifact_id``, which is checked. A file without the ``riftco.*`` keys, or
with tensors that do not match the recorded config, is a ValueError naming what is missing
or wrong; nothing is guessed (foreign checkpoints are the Hugging Face importer's job).
"""

from __future__ import annotations

import hashlib
import io
from array import array
from pathlib import Path

from .._container import canonical_json, strict_json, write_stored_zip
from ..artifacts import (
    ARCHITECTURES,
    BUNDLE_FORMAT,
    ModelBundle,
    little_endian_bytes,
    parameter_shapes,
    validate_model_config,
)
from .safetensors import read_safetensors, write_safetensors

_KEYS = (
    "riftco.format",
    "riftco.architecture",
    "riftco.config",
    "riftco.tokenizer",
    "riftco.stage",
    "riftco.parent_artifact_id",
    "riftco.metadata",
    "riftco.artifact_id",
)


def export_bundle_safetensors(bundle: ModelBundle, path) -> Path:
    """Write ``bundle`` as a safetensors F32 file (atomically); see the module docstring."""
    if not isinstance(bundle, ModelBundle):
        raise TypeError(f"bundle must be a ModelBundle, not {type(bundle).__name__}")
    manifest = bundle.manifest
    weights = bundle.weights
    tensors = {
        spec.name: (spec.shape, weights[spec.offset : spec.offset + spec.count])
        for spec in bundle.parameters
    }
    metadata = {
        "riftco.format": BUNDLE_FORMAT,
        "riftco.architecture": manifest["architecture"],
        "riftco.config": canonical_json(manifest["config"]).decode(),
        "riftco.tokenizer": canonical_json(manifest["tokenizer"]).decode(),
        "riftco.stage": manifest["stage"],
        "riftco.parent_artifact_id": canonical_json(manifest["parent_artifact_id"]).decode(),
        "riftco.metadata": canonical_json(manifest["metadata"]).decode(),
        "riftco.artifact_id": manifest["artifact_id"],
    }
    return write_safetensors(path, tensors, metadata)


def import_bundle_safetensors(path) -> ModelBundle:
    """The bundle a file from :func:`export_bundle_safetensors` holds (ValueError otherwise)."""
    source = str(path)
    tensors, metadata = read_safetensors(path)
    missing = [key for key in _KEYS if key not in metadata]
    if missing:
        raise ValueError(
            f"{source}: not a riftco bundle export: __metadata__ lacks {missing} (import "
            "foreign checkpoints with their architecture's importer)"
        )
    architecture = metadata["riftco.architecture"]
    if metadata["riftco.format"] != BUNDLE_FORMAT or architecture not in ARCHITECTURES:
        raise ValueError(f"{source}: riftco.format/architecture are not a bundle of "
                         f"{' or '.join(ARCHITECTURES)}")
    config_record = strict_json(metadata["riftco.config"].encode(), f"{source}: riftco.config")
    config = validate_model_config(architecture, config_record, f"{source}: riftco.config")
    expected = parameter_shapes(config)
    names = [name for name, _ in expected]
    if list(tensors) != names:
        extra = sorted(set(tensors) - set(names))
        absent = [name for name in names if name not in tensors]
        raise ValueError(
            f"{source}: tensors differ from the config's parameters (missing {absent[:4]}, "
            f"unexpected {extra[:4]}, or out of order)"
        )
    weights = array("f")
    for name, shape in expected:
        tensor = tensors[name]
        if tensor.shape != shape:
            raise ValueError(f"{source}: tensor {name} has shape {tensor.shape}, expected {shape}")
        weights.extend(tensor.values)
    manifest = {
        "format": BUNDLE_FORMAT,
        "format_version": 1,
        "architecture": architecture,
        "stage": metadata["riftco.stage"],
        "parent_artifact_id": strict_json(
            metadata["riftco.parent_artifact_id"].encode(), f"{source}: riftco.parent_artifact_id"
        ),
        "config": config_record,
        "tokenizer": strict_json(
            metadata["riftco.tokenizer"].encode(), f"{source}: riftco.tokenizer"
        ),
        "parameters": _table(expected),
        "weights": {
            "file": "weights.f32le",
            "dtype": "float32",
            "byte_order": "little",
            "count": len(weights),
            "sha256": hashlib.sha256(little_endian_bytes(weights)).hexdigest(),
        },
        "metadata": strict_json(metadata["riftco.metadata"].encode(), f"{source}: riftco.metadata"),
        "artifact_id": metadata["riftco.artifact_id"],
    }
    buffer = io.BytesIO()
    write_stored_zip(
        buffer,
        [
            ("manifest.json", canonical_json(manifest)),
            ("weights.f32le", little_endian_bytes(weights)),
        ],
    )
    # Full validation, the recomputed artifact_id included.
    return ModelBundle.from_bytes(buffer.getvalue(), source)


def _table(expected) -> list:
    table, offset = [], 0
    for name, shape in expected:
        count = 1
        for dimension in shape:
            count *= dimension
        table.append({"name": name, "shape": list(shape), "offset": offset, "count": count})
        offset += count
    return table
