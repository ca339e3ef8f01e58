"""Interchange: reading and writing tensors in formats other tools use, standard library only.

* :mod:`.safetensors`: :func:`write_safetensors` and :func:`read_safetensors` (or
  :func:`parse_safetensors` of bytes already in memory), float32 tensors only, with every
  malformed file a ValueError naming what is wrong.
"""

from .safetensors import (
    SAFETENSORS_MAXIMUM_HEADER_BYTES,
    SAFETENSORS_MAXIMUM_TENSORS,
    SafetensorsTensor,
    encode_safetensors,
    parse_safetensors,
    read_safetensors,
    write_safetensors,
)

__all__ = [
    "SAFETENSORS_MAXIMUM_HEADER_BYTES",
    "SAFETENSORS_MAXIMUM_TENSORS",
    "SafetensorsTensor",
    "encode_safetensors",
    "parse_safetensors",
    "read_safetensors",
    "write_safetensors",
]
