"""Interchange: reading and writing tensors in formats other tools use, standard library only.

* :mod:`.safetensors`: :func:`write_safetensors` and :func:`read_safetensors` (or
  :func:`parse_safetensors` of bytes already in memory), float32 tensors only, with every
  malformed file a ValueError naming what is wrong.
* :mod:`.bundles`: :func:`export_bundle_safetensors` and :func:`import_bundle_safetensors`,
  a lossless round trip of ``.rift`` bundles through safetensors F32.
* :mod:`.gguf_export`: :func:`export_gguf`, rotary-family bundles (or loaded pretrained
  models) as GGUF v3 files for llama.cpp, Ollama and LM Studio (F32, F16, Q8_0 or Q4_0).
* :mod:`.huggingface_export`: :func:`export_huggingface`, the same as Hugging Face checkpoint
  directories for transformers.
* :mod:`.peft`: :func:`export_peft` (a LoRA/QLoRA run's adapter, from its checkpoint, a live
  model or ``PostTrainingResult.adapter``, as a PEFT adapter directory: the adapter-only save)
  and :func:`load_peft_adapter` (a PEFT LoRA adapter onto a base, checked against it);
  :func:`read_peft_adapter` reads one on its own.
"""

from .bundles import export_bundle_safetensors, import_bundle_safetensors
from .gguf_export import export_gguf
from .huggingface_export import export_huggingface
from .peft import (
    LoraAdapter,
    PeftAdapter,
    capture_lora_adapter,
    export_peft,
    load_peft_adapter,
    read_peft_adapter,
)
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
    "LoraAdapter",
    "PeftAdapter",
    "SafetensorsTensor",
    "capture_lora_adapter",
    "encode_safetensors",
    "export_bundle_safetensors",
    "export_gguf",
    "export_huggingface",
    "export_peft",
    "import_bundle_safetensors",
    "load_peft_adapter",
    "parse_safetensors",
    "read_peft_adapter",
    "read_safetensors",
    "write_safetensors",
]
