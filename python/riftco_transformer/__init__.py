"""riftco_transformer: a dependency-free Python client of the riftco_transformer C library.

The package root re-exports the low-level API of :mod:`riftco_transformer.native` (tensors,
tokenizers, the decoder-only transformer, autograd variables, Adam). The native library is
found on first use: ``$RIFTCO_TRANSFORMER_LIBRARY``, the wheel's ``.libs/`` directory, a
source checkout's build directories, then the system loader.
"""

from .native import *  # noqa: F401,F403 (the public API is native's __all__)
from .native import __all__ as _native_all
from .pretrained import PretrainedModel, load_pretrained

__version__ = "0.1.0"
__all__ = [*_native_all, "PretrainedModel", "load_pretrained", "__version__"]
