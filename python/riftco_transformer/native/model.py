"""The GPT-style decoder-only transformer and its configuration."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass, replace

from ._abi import (
    ACTIVATION_CHECKPOINTING_DISABLED,
    ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK,
    ATTENTION_FLASH,
    ATTENTION_MATERIALIZED,
    STATUS_RUNTIME_ERROR,
    LlamaMistralConfigStruct,
    LoraConfigStruct,
    QuantizedMemoryStatsStruct,
    TransformerConfigStruct,
)
from ._buffers import byte_input, read_sized, token_ids
from ._errors import check_status
from ._handle import NativeHandle
from ._loader import library
from ._validation import (
    UINT32_LIMIT,
    UINT64_LIMIT,
    require_choice,
    require_int,
    require_positive_float,
)
from .autograd import Variable
from .backends import BACKEND_NAMES, backend_value
from .decode import DecodeSession, KvCachePool, decode_session_options, kv_cache_pool_options
from .lora import LoraConfig, QuantizedMemoryStats
from .parameters import ParameterList

ATTENTION_VALUES = {"materialized": ATTENTION_MATERIALIZED, "flash": ATTENTION_FLASH}
# RT_WEIGHT_FORMAT_*: how packed projection weights are stored.
WEIGHT_FORMAT_NAMES = ("nf4", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k", "f16",
                       "bf16")
# The formats quantize_blocks produces (the K formats come from GGUF files only).
BLOCK_WEIGHT_FORMAT_VALUES = {"q8_0": 1, "q4_0": 2, "q4_1": 3, "q5_0": 4, "f16": 8, "bf16": 9}
ATTENTION_NAMES = {value: name for name, value in ATTENTION_VALUES.items()}
ACTIVATION_CHECKPOINTING_VALUES = {
    "disabled": ACTIVATION_CHECKPOINTING_DISABLED,
    "block": ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK,
    "transformer_block": ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK,
}
ACTIVATION_CHECKPOINTING_NAMES = {
    ACTIVATION_CHECKPOINTING_DISABLED: "disabled",
    ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK: "block",
}

# rt_transformer_config.feed_forward_activation: "gelu" is the exact-erf GELU (the GPT
# decoder's default), "gelu_tanh" GPT-2's tanh approximation.
FEED_FORWARD_ACTIVATION_VALUES = {"gelu": 0, "relu": 1, "gelu_tanh": 2}
FEED_FORWARD_ACTIVATION_NAMES = {
    value: name for name, value in FEED_FORWARD_ACTIVATION_VALUES.items()
}

_DIMENSION_FIELDS = (
    "vocabulary_size",
    "maximum_context",
    "model_width",
    "head_count",
    "block_count",
    "feed_forward_width",
)


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a decoder-only transformer.

    ``vocabulary_size`` V, ``maximum_context`` C, ``model_width`` D, ``head_count`` H,
    ``block_count`` N and ``feed_forward_width`` F are positive ints (TypeError/ValueError
    otherwise); ``random_seed`` (uint32) fixes the initial weights; ``layer_norm_epsilon`` is
    a positive float. That H divides D is checked by the library when the model is created.

    Additions for GPT-2 checkpoints: ``feed_forward_activation`` is
    ``"gelu"`` (exact erf, the default), ``"gelu_tanh"`` (GPT-2) or ``"relu"``; and
    ``tie_embeddings=True`` makes the head read the token embedding (logits = h·Eᵀ), so there
    are no ``language_model_head`` parameters and no head bias.
    """

    vocabulary_size: int
    maximum_context: int
    model_width: int
    head_count: int
    block_count: int
    feed_forward_width: int
    random_seed: int = 5489
    layer_norm_epsilon: float = 1e-5
    feed_forward_activation: str = "gelu"
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in _DIMENSION_FIELDS:
            object.__setattr__(self, name, require_int(getattr(self, name), name, 1, UINT64_LIMIT))
        object.__setattr__(
            self, "random_seed", require_int(self.random_seed, "random_seed", 0, UINT32_LIMIT)
        )
        object.__setattr__(
            self,
            "layer_norm_epsilon",
            require_positive_float(self.layer_norm_epsilon, "layer_norm_epsilon"),
        )
        require_choice(
            self.feed_forward_activation,
            "feed_forward_activation",
            FEED_FORWARD_ACTIVATION_VALUES,
        )
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError(
                f"tie_embeddings must be a bool, not {type(self.tie_embeddings).__name__} "
                f"({self.tie_embeddings!r})"
            )


def _native_config(config: TransformerConfig) -> TransformerConfigStruct:
    native_config = TransformerConfigStruct()
    check_status(
        library().rt_transformer_config_init(
            ctypes.byref(native_config), ctypes.sizeof(native_config)
        )
    )
    for name in _DIMENSION_FIELDS:
        setattr(native_config, name, getattr(config, name))
    native_config.random_seed = config.random_seed
    native_config.layer_norm_epsilon = config.layer_norm_epsilon
    native_config.feed_forward_activation = FEED_FORWARD_ACTIVATION_VALUES[
        config.feed_forward_activation
    ]
    native_config.tie_embeddings = 1 if config.tie_embeddings else 0
    return native_config


class CausalLanguageModel(NativeHandle):
    """What every native decoder-only model offers (the GPT decoder, Llama/Mistral): forward,
    parameters, attention and checkpointing policies, KV-cached decoding, LoRA and packed NF4.

    Subclasses create the native model and set ``self._config`` (with ``vocabulary_size``
    and ``maximum_context``). The model's parameter lists, variables and Adam optimizers
    share its lock and native state: they stay usable after the model is closed.
    """

    _release_function = "rt_model_release"

    @property
    def vocabulary_size(self) -> int:
        """V, the number of token ids."""
        return self._config.vocabulary_size

    @property
    def maximum_context(self) -> int:
        """C, the longest sequence a forward or a decode session takes."""
        return self._config.maximum_context

    @property
    def backend(self) -> str:
        """The backend holding the parameters, e.g. ``"cpu"``."""
        return BACKEND_NAMES[self._query("rt_model_backend", ctypes.c_int32)]

    def to(self, backend: str | int) -> CausalLanguageModel:
        """Move the parameters to ``backend`` (a name, an ABI value or ``"auto"``); returns self.

        Transactional: an unavailable backend (backend_unavailable) or an open variable or
        Adam optimizer of this model (runtime_error) raises and changes nothing.
        """
        value = backend_value(backend, allow_auto=True)
        with self._native() as pointer:
            check_status(library().rt_model_to(pointer, value))
        return self

    @property
    def full_sequence_attention(self) -> str:
        """``"materialized"`` or ``"flash"``."""
        return ATTENTION_NAMES[self._query("rt_model_get_full_sequence_attention", ctypes.c_int32)]

    def set_full_sequence_attention(self, attention: str) -> None:
        """Select the attention used by future forwards: ``"materialized"`` or ``"flash"``."""
        value = require_choice(attention, "attention", ATTENTION_VALUES)
        with self._native() as pointer:
            check_status(library().rt_model_set_full_sequence_attention(pointer, value))

    @property
    def activation_checkpointing(self) -> str:
        """``"disabled"`` or ``"block"``."""
        return ACTIVATION_CHECKPOINTING_NAMES[
            self._query("rt_model_get_activation_checkpointing", ctypes.c_int32)
        ]

    def set_activation_checkpointing(self, policy: str) -> None:
        """Select ``"disabled"`` or ``"block"`` (alias ``"transformer_block"``) checkpointing."""
        value = require_choice(policy, "activation_checkpointing", ACTIVATION_CHECKPOINTING_VALUES)
        with self._native() as pointer:
            check_status(library().rt_model_set_activation_checkpointing(pointer, value))

    def __call__(self, tokens, positions=None) -> Variable:
        """Logits ``[B, T, V]`` for token ids ``[B, T]`` (a flat row is ``B = 1``).

        ``tokens``: one flat row or a rectangular 2-D batch of ints (lists, ``array('I')``
        rows, numpy integer arrays). ``T`` must be in ``[1, maximum_context]`` and every id
        below V (native errors otherwise). Each call builds a fresh single-use graph.

        ``positions`` (packed rows, C ABI 2.13): the same shape as ``tokens``, each token's
        position inside its document (rows start at 0; each next position is 0, a new
        document, or the previous + 1). Positions restart in every document and attention
        never crosses a boundary, so each document gets the logits it gets alone. Flash
        attention needs document bounds in the backend's kernel (CPU, PJRT; a native
        invalid_argument on CUDA and Metal); materialized attention packs everywhere.
        """
        ids = token_ids(tokens, "tokens")
        batch, time = (1, ids.shape[0]) if len(ids.shape) == 1 else ids.shape
        logits = ctypes.c_void_p()
        if positions is not None:
            packed = token_ids(positions, "positions")
            if packed.shape != ids.shape:
                raise ValueError(f"positions has shape {packed.shape}, tokens {ids.shape}")
        with self._native() as pointer:
            if positions is None:
                check_status(
                    library().rt_model_forward(
                        pointer, ids.values, len(ids.values), batch, time, ctypes.byref(logits)
                    )
                )
            else:
                check_status(
                    library().rt_model_forward_packed(
                        pointer, ids.values, packed.values, len(ids.values), batch, time,
                        ctypes.byref(logits)
                    )
                )
        return Variable._from_pointer(logits.value, self._lock)

    def parameters(self) -> ParameterList:
        """The base parameters in canonical order (a new list handle each call).

        Frozen while LoRA adapters are attached (train ``adapter_parameters()``); packed NF4
        projection weights are not parameters and are not listed.
        """
        parameter_list = ctypes.c_void_p()
        with self._native() as pointer:
            check_status(library().rt_model_parameters(pointer, ctypes.byref(parameter_list)))
        return ParameterList._from_pointer(parameter_list.value, self._lock)

    # ---- KV-cached decoding ---------------------------------------------------------------

    def decode_session(self, cache: str = "paged", block_size: int = 16) -> DecodeSession:
        """A :class:`DecodeSession` with a private cache sized for one full context.

        ``cache`` is ``"paged"`` (pages of ``block_size`` positions, leased as the sequence
        grows) or ``"contiguous"`` (the reference: one page of ``maximum_context``; the block
        size is then ignored). While the session lives the model rejects changes to its
        parameters or backend.
        """
        options = decode_session_options(cache, block_size)
        handle = ctypes.c_void_p()
        with self._native() as pointer:
            check_status(
                library().rt_model_decode_session_create(
                    pointer, ctypes.byref(options), ctypes.byref(handle)
                )
            )
        return DecodeSession._from_pointer(handle.value, self._lock)._bind(
            self._config.vocabulary_size, None
        )

    def kv_cache_pool(
        self, block_size: int = 16, block_count: int = 0, prefix_caching: bool = False
    ) -> KvCachePool:
        """A :class:`KvCachePool` of ``block_count`` pages (0: exactly one full context) for
        sessions that :func:`decode_batch` advances together; ``prefix_caching`` keeps filled
        pages for later prompts that start the same way (:meth:`DecodeSession.reuse_prefix`)."""
        options = kv_cache_pool_options(block_size, block_count, prefix_caching)
        handle = ctypes.c_void_p()
        with self._native() as pointer:
            check_status(
                library().rt_model_kv_cache_pool_create(
                    pointer, ctypes.byref(options), ctypes.byref(handle)
                )
            )
        return KvCachePool._from_pointer(handle.value, self._lock)._bind(
            self._config.vocabulary_size, bool(options.prefix_caching)
        )

    # ---- LoRA and packed NF4 --------------------------------------------------------------

    def attach_lora(self, config: LoraConfig | None = None) -> None:
        """Attach low-rank adapters to the projections ``config.targets`` names.

        Once per model lifetime, atomic, and output-preserving (B starts at zero). The whole
        base is frozen afterwards: train ``adapter_parameters()``; ``parameters()`` still lists
        the base schema. A second attach, an attach after merge, or an open variable or Adam
        optimizer of this model is a native runtime_error; a rank above ``min(in, out)`` of a
        selected projection is invalid_argument.
        """
        if config is None:
            config = LoraConfig()
        if not isinstance(config, LoraConfig):
            raise TypeError(f"config must be a LoraConfig, not {type(config).__name__}")
        native = config._native()
        with self._native() as pointer:
            check_status(library().rt_model_attach_lora(pointer, ctypes.byref(native)))

    @property
    def lora_attached(self) -> bool:
        """True while adapters are attached and not merged."""
        return bool(self._query("rt_model_has_lora", ctypes.c_int32))

    @property
    def lora_config(self) -> LoraConfig | None:
        """The attached config (kept after merge), or None when LoRA was never attached."""
        native = LoraConfigStruct()
        native.struct_size = ctypes.sizeof(native)
        with self._native() as pointer:
            status = library().rt_model_lora_config(pointer, ctypes.byref(native))
            if status == STATUS_RUNTIME_ERROR:  # the one failure: never attached
                return None
            check_status(status)
        return LoraConfig._from_native(native)

    @property
    def lora_dropout_key(self) -> int:
        """The LoRA dropout key (uint64, C ABI 2.15): the next training forward's adapter
        dropout masks are drawn from it, and every training forward with ``dropout > 0``
        increments it. Training checkpoints save it; setting it back resumes the masks
        exactly."""
        return self._query("rt_model_lora_dropout_key", ctypes.c_uint64)

    @lora_dropout_key.setter
    def lora_dropout_key(self, key: int) -> None:
        value = require_int(key, "lora_dropout_key", 0, UINT64_LIMIT)
        with self._native() as pointer:
            check_status(library().rt_model_set_lora_dropout_key(pointer, value))

    @property
    def lora_dropout_enabled(self) -> bool:
        """False in evaluation mode: forwards apply no LoRA dropout and leave the key alone
        (the forwards of this API always record a graph; see :meth:`lora_dropout_disabled`)."""
        return bool(self._query("rt_model_lora_dropout_enabled", ctypes.c_int32))

    @lora_dropout_enabled.setter
    def lora_dropout_enabled(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"lora_dropout_enabled must be a bool, not {type(enabled).__name__}")
        with self._native() as pointer:
            check_status(library().rt_model_set_lora_dropout_enabled(pointer, int(enabled)))

    @contextlib.contextmanager
    def lora_dropout_disabled(self):
        """Evaluation mode for the block (validation losses): no LoRA dropout, no key
        advance; the previous mode comes back afterwards."""
        previous = self.lora_dropout_enabled
        self.lora_dropout_enabled = False
        try:
            yield self
        finally:
            self.lora_dropout_enabled = previous

    def adapter_parameters(self) -> ParameterList:
        """The active adapter factors (``<proj>.lora_a.weight``, ``<proj>.lora_b.weight``, block
        order then the head): what Adam trains for LoRA/QLoRA. Native runtime_error without an
        attached adapter."""
        parameter_list = ctypes.c_void_p()
        with self._native() as pointer:
            check_status(library().rt_model_lora_parameters(pointer, ctypes.byref(parameter_list)))
        return ParameterList._from_pointer(parameter_list.value, self._lock)

    def merge_lora(self) -> None:
        """Fold every adapter into its weight (``W += scale·B·A``), one-way and transactional.

        Packed NF4 weights are dequantized first, so the model is dense float32 again and
        trainable. Runtime_error without an attached adapter, after a merge, or while a
        variable, Adam optimizer or adapter parameter list of this model is open.
        """
        with self._native() as pointer:
            check_status(library().rt_model_merge_lora(pointer))

    def untie_embeddings(self) -> None:
        """Give a model with tied embeddings its own head, a copy of the embedding table.

        The logits do not change. Afterwards the head is an ordinary base parameter
        (``language_model_head.weight``, plus a zero ``language_model_head.bias`` for the
        GPT decoder), ``config.tie_embeddings`` is False, and ``quantize_nf4`` packs the head
        too, so batch-1 decoding no longer streams the float32 table for every token; the
        embedding lookups keep the float32 table. RiftcoTransformerError invalid_argument when
        the embeddings are not tied, with LoRA attached or once packed; runtime_error while a
        variable, optimizer, decode session or parameter list of this model is open. Nothing
        changes on error.
        """
        with self._native() as pointer:
            check_status(library().rt_model_untie_embeddings(pointer))
            self._config = replace(self._config, tie_embeddings=False)

    def quantize_nf4(
        self, block_size: int = 64, double_quantization: bool = True, scale_block_size: int = 256
    ) -> None:
        """Pack every projection weight as 4-bit NF4 (before ``attach_lora``, once).

        ``block_size`` and ``scale_block_size`` are powers of two in 32..4096 (the latter only
        with ``double_quantization``, which stores the block scales as 8-bit codes). The dense
        float32 values are released; the packed weights are decoded inside the kernels.
        Transactional. Runtime_error while a variable, Adam optimizer or parameter list of this
        model is open.
        """
        block = require_int(block_size, "block_size", 1, UINT64_LIMIT)
        if not isinstance(double_quantization, bool):
            raise TypeError(
                f"double_quantization must be a bool, not {type(double_quantization).__name__}"
            )
        scale_block = require_int(scale_block_size, "scale_block_size", 1, UINT64_LIMIT)
        with self._native() as pointer:
            if double_quantization:
                check_status(
                    library().rt_model_quantize_linear_weights_nf4_double_quantized(
                        pointer, block, scale_block
                    )
                )
            else:
                check_status(library().rt_model_quantize_linear_weights_nf4(pointer, block))

    def quantize_blocks(self, format: str) -> None:  # noqa: A002 - the format's name
        """Pack every projection weight in a GGUF block format: ``"q8_0"``, ``"q5_0"``,
        ``"q4_1"`` or ``"q4_0"`` (ggml's blocks of 32, bit for bit, rounded as ggml's
        reference quantizer rounds; the K formats come from GGUF files only), or keep it
        dense in half precision: ``"f16"`` or ``"bf16"`` (each value rounded to the nearest).
        Before ``attach_lora``, once; each projection's input width must be a multiple of 32.
        The dense float32 values are released. Transactional."""
        value = require_choice(format, "format", BLOCK_WEIGHT_FORMAT_VALUES)
        with self._native() as pointer:
            check_status(library().rt_model_quantize_linear_weights(pointer, value))

    @property
    def linear_weight_format(self) -> str | None:
        """How the packed weights are stored: ``"nf4"``, a GGUF block format (``"q8_0"``,
        ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q4_k"``, ``"q5_k"``, ``"q6_k"``), ``"f16"``,
        ``"bf16"``, ``"mixed"`` (a GGUF file whose projections or table use several of them),
        or None while the projections are dense float32."""
        value = self._query("rt_model_linear_weight_format", ctypes.c_int32)
        return None if value == -1 else "mixed" if value == -2 else WEIGHT_FORMAT_NAMES[value]

    @property
    def quantized_linear_weights(self) -> bool:
        """True while the projection weights are packed NF4."""
        return bool(self._query("rt_model_has_quantized_linear_weights", ctypes.c_int32))

    @property
    def quantized_memory(self) -> QuantizedMemoryStats:
        """Exact byte accounting of the packed weights (zeros when nothing is packed)."""
        native = QuantizedMemoryStatsStruct()
        native.struct_size = ctypes.sizeof(native)
        with self._native() as pointer:
            check_status(library().rt_model_quantized_memory_stats(pointer, ctypes.byref(native)))
        return QuantizedMemoryStats._from_native(native)

    def packed_quantized_state(self) -> bytes:
        """The packed weights in their canonical byte form (for exact-resume checkpoints)."""
        native = library()
        with self._native() as pointer:
            return bytes(
                read_sized(
                    lambda out, capacity, required: native.rt_model_packed_state_copy(
                        pointer, out, capacity, required
                    ),
                    ctypes.c_uint8,
                )
            )

    def load_packed_quantized_state(self, state) -> None:
        """Replace the packed weights with ``state`` (bytes from ``packed_quantized_state``).

        The model must already be packed with the same shapes, block sizes and scale encoding
        (invalid_argument otherwise); adapters are untouched. Transactional.
        """
        data = byte_input(state, "state")
        with self._native() as pointer:
            check_status(library().rt_model_packed_state_load(pointer, data, len(data)))

    @property
    def parameter_count(self) -> int:
        """The number of scalars in ``parameters()``."""
        with self.parameters() as parameter_list:
            return parameter_list.total_numel

    def decoder_config(self):
        """The model's general decoder configuration as a :class:`LlamaMistralConfig`
        (C ABI 2.12, ``rt_model_decoder_config``): both classes are the one decoder, and a
        :class:`DecoderOnlyTransformer` reads back as the ``"gpt2"`` preset of its dimensions
        (learned positions, LayerNorm, the plain feed-forward with its activation, the biases;
        ``random_seed`` as created). A ``LlamaMistralTransformer`` built from it has the same
        parameters and logits."""
        from .llama import LlamaMistralConfig  # llama.py imports this module

        struct = LlamaMistralConfigStruct()
        struct.struct_size = ctypes.sizeof(struct)
        with self._native() as pointer:
            check_status(library().rt_model_decoder_config(pointer, ctypes.byref(struct)))
            config = LlamaMistralConfig._from_native(struct)
            # The library keeps float32 reals: where the value given at creation rounds to the
            # one read back, the given value (as LlamaMistralConfig.preset keeps given fields).
            given = {
                name: value
                for name, value in self._given_decoder_reals().items()
                if ctypes.c_float(value).value == getattr(config, name)
            }
            return replace(config, **given)

    def _given_decoder_reals(self) -> dict[str, float]:
        """The float32 fields of :meth:`decoder_config` as given when the model was made."""
        return {}


class DecoderOnlyTransformer(CausalLanguageModel):
    """A GPT-style decoder-only transformer, created on CPU with weights from the config's seed.

    ``attention`` selects full-sequence attention: ``"materialized"`` (keeps the [B,H,T,T]
    probabilities) or ``"flash"`` (memory-linear, recomputes them in backward).
    ``activation_checkpointing`` is ``"disabled"`` or ``"block"`` (keep only block inputs and
    recompute each block during backward; ``"transformer_block"`` is accepted too). Both are
    runtime policies: they change memory and time, not results (beyond float rounding).

    The model's parameter lists, variables and Adam optimizers share its lock and native
    state: they stay usable after the model is closed.
    """

    def __init__(
        self,
        config: TransformerConfig,
        attention: str = "materialized",
        activation_checkpointing: str = "disabled",
    ) -> None:
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, not {type(config).__name__}")
        # Validate the policies before creating anything; the setters below apply them.
        require_choice(attention, "attention", ATTENTION_VALUES)
        require_choice(
            activation_checkpointing, "activation_checkpointing", ACTIVATION_CHECKPOINTING_VALUES
        )
        pointer = ctypes.c_void_p()
        check_status(
            library().rt_model_create(ctypes.byref(_native_config(config)), ctypes.byref(pointer))
        )
        self._adopt(pointer.value, threading.RLock())
        self._config = config
        try:
            self.set_full_sequence_attention(attention)
            self.set_activation_checkpointing(activation_checkpointing)
        except BaseException:
            self.close()
            raise

    @property
    def config(self) -> TransformerConfig:
        """The configuration the model was created with."""
        with self._native():
            return self._config

    def _given_decoder_reals(self) -> dict[str, float]:
        return {"rms_norm_epsilon": self._config.layer_norm_epsilon}

    def __repr__(self) -> str:
        if self.closed:
            return "<DecoderOnlyTransformer (closed)>"
        return f"<DecoderOnlyTransformer {self._config} backend={self.backend!r}>"
