"""Llama / Mistral decoders: configuration, random initialisation, and GGUF checkpoints."""

from __future__ import annotations

import ctypes
import math
import os
import threading
from dataclasses import dataclass, replace

from ._abi import LlamaMistralConfigStruct
from ._errors import check_status
from ._loader import library
from ._validation import UINT32_LIMIT, UINT64_LIMIT, require_choice, require_int, require_real
from .model import (
    ACTIVATION_CHECKPOINTING_VALUES,
    ATTENTION_VALUES,
    FEED_FORWARD_ACTIVATION_NAMES,
    FEED_FORWARD_ACTIVATION_VALUES,
    CausalLanguageModel,
)

ARCHITECTURE_VALUES = {
    "llama": 0,
    "mistral": 1,
    "qwen2": 2,
    "qwen3": 3,
    "gemma2": 4,
    "gemma3": 5,
    "phi3": 6,
    "gpt2": 7,
}
ARCHITECTURE_NAMES = {value: name for name, value in ARCHITECTURE_VALUES.items()}
GATED_ACTIVATION_VALUES = {"silu": 0, "gelu_tanh": 1}
GATED_ACTIVATION_NAMES = {value: name for name, value in GATED_ACTIVATION_VALUES.items()}
ROPE_SCALING_VALUES = {"none": 0, "linear": 1, "llama3": 2, "frequency_factors": 3, "yarn": 4}
ROPE_SCALING_NAMES = {value: name for name, value in ROPE_SCALING_VALUES.items()}
# The GPT-2 choices (C ABI 2.12): RT_POSITIONS_*, RT_NORM_*, RT_FEED_FORWARD_GATED/PLAIN; the
# plain feed-forward's activation is RT_FEED_FORWARD_ACTIVATION_* (the GPT decoder's values).
POSITIONS_VALUES = {"rotary": 0, "learned": 1}
POSITIONS_NAMES = {value: name for name, value in POSITIONS_VALUES.items()}
NORM_VALUES = {"rms": 0, "layer": 1}
NORM_NAMES = {value: name for name, value in NORM_VALUES.items()}
FEED_FORWARD_VALUES = {"gated": 0, "plain": 1}
FEED_FORWARD_NAMES = {value: name for name, value in FEED_FORWARD_VALUES.items()}
PLAIN_ACTIVATION_VALUES = FEED_FORWARD_ACTIVATION_VALUES
PLAIN_ACTIVATION_NAMES = FEED_FORWARD_ACTIVATION_NAMES

# The family choices (C ABI 2.10), each defaulting to Llama's: the 0/1 flags and the reals.
_CHOICE_FLAGS = (
    "query_key_value_bias",
    "query_key_norm",
    "norm_weight_offset",
    "post_block_norms",
    # 2.12 (GPT-2)
    "output_bias",
    "feed_forward_bias",
    "head_bias",
)
# The named choices of 2.12 (GPT-2): field -> (names to ABI values, ABI values to names).
_GPT2_CHOICES = {
    "positions": (POSITIONS_VALUES, POSITIONS_NAMES),
    "norm": (NORM_VALUES, NORM_NAMES),
    "feed_forward": (FEED_FORWARD_VALUES, FEED_FORWARD_NAMES),
    "plain_activation": (PLAIN_ACTIVATION_VALUES, PLAIN_ACTIVATION_NAMES),
}
# The other fields rt_llama_mistral_config_preset may set.
_PRESET_FIELDS = (
    "feed_forward_activation",
    "embedding_scale",
    "sliding_window_period",
    "rope_local_theta",
    *_GPT2_CHOICES,
)
_CHOICE_REALS = (
    "embedding_scale",
    "attention_scale",
    "rope_local_theta",
    "rope_scaling_factor",
    "rope_low_frequency_factor",
    "rope_high_frequency_factor",
    "attention_logit_softcap",
    "final_logit_softcap",
    "rope_yarn_beta_fast",
    "rope_yarn_beta_slow",
    "rope_yarn_attention_factor",
)
# The reals the native struct holds as float32.
_FLOAT32_REALS = (
    "rms_norm_epsilon",
    "embedding_scale",
    "attention_scale",
    "attention_logit_softcap",
    "final_logit_softcap",
)
# The soft caps (C ABI 2.11): a preset sets them only where they are 0 (not given).
_PRESET_CAPS = ("attention_logit_softcap", "final_logit_softcap")

_DIMENSION_FIELDS = (
    "vocabulary_size",
    "maximum_context",
    "model_width",
    "query_head_count",
    "key_value_head_count",
    "block_count",
    "feed_forward_width",
)


CHECKPOINT_FORMAT_VALUES = {"gguf": 0, "huggingface": 1}


def checkpoint_tensor_name(
    architecture: str, checkpoint_format: str, parameter: str, alternative: int = 0
) -> tuple[str, int | None] | None:
    """Where ``checkpoint_format`` ("gguf", "huggingface") checkpoints of ``architecture`` keep
    our parameter ``parameter`` ("blocks.3.attention.query.weight"), from the library's one
    architecture table (``rt_checkpoint_tensor_name``): the tensor's name and, for a fused
    tensor, our parameter's part in it (q, k, v or gate, up order; None: the whole tensor).

    ``alternative`` 1 asks for a second layout the format allows (Phi-3 GGUF files with fused
    tensors); None when there is none for that parameter. ValueError (the library's message)
    for an unknown architecture or format, or a name that is not one of the architecture's
    parameters in that format.
    """
    require_choice(architecture, "architecture", ARCHITECTURE_VALUES)
    require_choice(checkpoint_format, "checkpoint_format", CHECKPOINT_FORMAT_VALUES)
    if not isinstance(parameter, str):
        raise TypeError(f"parameter must be a str, not {type(parameter).__name__}")
    require_int(alternative, "alternative", 0, UINT32_LIMIT)
    function = library().rt_checkpoint_tensor_name
    encoded = parameter.encode("utf-8")
    required = ctypes.c_uint64()
    part = ctypes.c_int32()
    arguments = (ARCHITECTURE_VALUES[architecture], CHECKPOINT_FORMAT_VALUES[checkpoint_format],
                 encoded, alternative)
    status = function(*arguments, None, 0, ctypes.byref(required), ctypes.byref(part))
    if status == 2 and alternative != 0:  # RT_STATUS_OUT_OF_RANGE: no such layout
        return None
    if status == 1:  # RT_STATUS_INVALID_ARGUMENT: not a name of this architecture and format
        raise ValueError(library().rt_last_error().decode("utf-8", errors="replace"))
    check_status(status)
    buffer = ctypes.create_string_buffer(required.value)
    check_status(function(*arguments, buffer, required.value, ctypes.byref(required),
                          ctypes.byref(part)))
    return buffer.value.decode("utf-8"), (part.value if part.value >= 0 else None)


@dataclass(frozen=True)
class LlamaMistralConfig:
    """The shape of a Llama/Mistral decoder (docs/ARCHITECTURE.md, 'The decoder').

    ``vocabulary_size`` V, ``maximum_context`` C, ``model_width`` D, ``query_head_count`` Hq,
    ``key_value_head_count`` Hkv (grouped-query attention: Hq % Hkv == 0), ``block_count`` N
    and ``feed_forward_width`` F are positive ints. ``rope_theta`` θ and
    ``rms_norm_epsilon`` are positive finite floats; ``sliding_window`` is None (dense) or a
    positive int (Mistral; a window shorter than C is applied); ``tie_embeddings`` reads the
    head from the token embedding. That D/Hq is even (with rotary positions) and divides
    evenly is checked by the library when the model is created. The GPT-2 choices (C ABI 2.12:
    ``positions``, ``norm``, ``feed_forward``, ``plain_activation`` and the biases) default to
    Llama's; ``preset("gpt2", ...)`` sets them as GPT-2 has them.
    """

    vocabulary_size: int
    maximum_context: int
    model_width: int
    query_head_count: int
    key_value_head_count: int
    block_count: int
    feed_forward_width: int
    architecture: str = "llama"
    rms_norm_epsilon: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int | None = None
    tie_embeddings: bool = False
    random_seed: int = 5489
    # The family choices (C ABI 2.10; header of model/decoder.hpp). Defaults: Llama's.
    head_width: int = 0
    query_key_value_bias: bool = False
    query_key_norm: bool = False
    norm_weight_offset: bool = False
    post_block_norms: bool = False
    feed_forward_activation: str = "silu"
    embedding_scale: float = 0.0
    attention_scale: float = 0.0
    sliding_window_period: int = 0
    rope_local_theta: float = 0.0
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_low_frequency_factor: float = 1.0
    rope_high_frequency_factor: float = 4.0
    rope_original_context: int = 8192
    # Gemma 2 (C ABI 2.11): scores / logits z become c·tanh(z/c); 0: none.
    attention_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    # YaRN (rope_scaling "yarn", C ABI 2.11; with rope_scaling_factor and rope_original_context):
    # the ramp's rotation bounds and the cos/sin factor (0: 0.1·ln(factor) + 1).
    rope_yarn_beta_fast: float = 32.0
    rope_yarn_beta_slow: float = 1.0
    rope_yarn_attention_factor: float = 0.0
    # rope_scaling "frequency_factors" (a GGUF file's rope_freqs.weight, Llama 3): the d/2
    # divisors, float32 values; empty for every other kind (C ABI 2.11).
    rope_frequency_factors: tuple[float, ...] = ()
    # GPT-2 (C ABI 2.12): "rotary" (RoPE) or "learned" positions (a [C,D] table added to the
    # token embedding); "rms" or "layer" norms (LayerNorm: scale and bias); the "gated"
    # feed-forward (gate/up/down with feed_forward_activation) or the "plain" one
    # (expand/project with plain_activation: "gelu" exact erf, "gelu_tanh" or "relu"); biases
    # on the attention output, on every feed-forward projection, and on the untied head
    # (head_bias is not read while the embeddings are tied).
    positions: str = "rotary"
    norm: str = "rms"
    feed_forward: str = "gated"
    plain_activation: str = "gelu"
    output_bias: bool = False
    feed_forward_bias: bool = False
    head_bias: bool = False

    @classmethod
    def preset(cls, architecture: str, **fields) -> LlamaMistralConfig:
        """The config of ``architecture`` ("llama", "mistral", "qwen2", "qwen3", "gemma2",
        "gemma3", "phi3", "gpt2") with the dimensions given in ``fields`` and the family's
        choices set by the library (Qwen 2: q/k/v biases; Qwen 3: QK-norm; Gemma 2: (1 + w) norms,
        post-block norms, GeGLU, embedding scale sqrt(D), window period 2 (with a
        sliding_window), attention and final soft caps 50 and 30 unless given; Gemma 3:
        QK-norm, (1 + w) norms, post-block norms, GeGLU, embedding scale sqrt(D), window
        period 6 (with a sliding_window) and local RoPE base 10000 unless given; GPT-2:
        learned positions, LayerNorm, the plain feed-forward with tanh-GELU, biases on q/k/v,
        the attention output, the feed-forward and the head)."""
        require_choice(architecture, "architecture", ARCHITECTURE_VALUES)
        draft = cls(**{**fields, "architecture": architecture})
        native = draft._native()
        check_status(
            library().rt_llama_mistral_config_preset(
                ctypes.byref(native), ARCHITECTURE_VALUES[architecture]
            )
        )
        # The given fields as they are (not through the struct's float32); the family's choices
        # as the library set them.
        chosen = cls._from_native(native)
        return replace(
            draft,
            **{name: getattr(chosen, name) for name in (*_CHOICE_FLAGS, *_PRESET_FIELDS)},
            **{name: getattr(draft, name) or getattr(chosen, name) for name in _PRESET_CAPS},
        )

    def __post_init__(self) -> None:
        for name in _DIMENSION_FIELDS:
            object.__setattr__(self, name, require_int(getattr(self, name), name, 1, UINT64_LIMIT))
        require_choice(self.architecture, "architecture", ARCHITECTURE_VALUES)
        for name in ("rms_norm_epsilon", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a float, not {type(value).__name__}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite and > 0 (got {value!r})")
            object.__setattr__(self, name, float(value))
        if self.sliding_window is not None:
            object.__setattr__(
                self,
                "sliding_window",
                require_int(self.sliding_window, "sliding_window", 1, UINT64_LIMIT),
            )
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError(
                f"tie_embeddings must be a bool, not {type(self.tie_embeddings).__name__}"
            )
        object.__setattr__(
            self, "random_seed", require_int(self.random_seed, "random_seed", 0, UINT32_LIMIT)
        )
        for name in ("head_width", "sliding_window_period"):
            object.__setattr__(self, name, require_int(getattr(self, name), name, 0, UINT64_LIMIT))
        object.__setattr__(
            self,
            "rope_original_context",
            require_int(self.rope_original_context, "rope_original_context", 1, UINT64_LIMIT),
        )
        for name in _CHOICE_FLAGS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, not {type(value).__name__} ({value!r})")
        for name in _CHOICE_REALS:
            value = require_real(getattr(self, name), name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0 (got {value!r})")
            object.__setattr__(self, name, value)
        require_choice(
            self.feed_forward_activation, "feed_forward_activation", GATED_ACTIVATION_VALUES
        )
        require_choice(self.rope_scaling, "rope_scaling", ROPE_SCALING_VALUES)
        for name, (values, _) in _GPT2_CHOICES.items():
            require_choice(getattr(self, name), name, values)
        factors = self.rope_frequency_factors
        if isinstance(factors, (str, bytes)) or not isinstance(factors, (tuple, list)):
            raise TypeError(
                f"rope_frequency_factors must be a sequence of floats, not {type(factors).__name__}"
            )
        rounded = []
        for index, factor in enumerate(factors):
            value = require_real(factor, f"rope_frequency_factors[{index}]")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"rope_frequency_factors[{index}] must be finite and > 0 (got {factor!r})"
                )
            rounded.append(ctypes.c_float(value).value)  # the float32 the library keeps
        object.__setattr__(self, "rope_frequency_factors", tuple(rounded))
        if bool(rounded) != (self.rope_scaling == "frequency_factors"):
            raise ValueError(
                "rope_frequency_factors are given exactly with rope_scaling 'frequency_factors' "
                f"(rope_scaling {self.rope_scaling!r}, {len(rounded)} factors)"
            )

    @property
    def resolved_head_width(self) -> int:
        """The head width d: ``head_width``, or D/Hq when it is 0."""
        return self.head_width or self.model_width // self.query_head_count

    def _native(self) -> LlamaMistralConfigStruct:
        native = LlamaMistralConfigStruct()
        check_status(
            library().rt_llama_mistral_config_init(ctypes.byref(native), ctypes.sizeof(native))
        )
        for name in _DIMENSION_FIELDS:
            setattr(native, name, getattr(self, name))
        native.architecture = ARCHITECTURE_VALUES[self.architecture]
        native.random_seed = self.random_seed
        native.rms_norm_epsilon = self.rms_norm_epsilon
        native.rope_theta = self.rope_theta
        native.sliding_window = self.sliding_window or 0
        native.tie_embeddings = 1 if self.tie_embeddings else 0
        native.head_width = self.head_width
        for name in _CHOICE_FLAGS:
            setattr(native, name, 1 if getattr(self, name) else 0)
        for name in _CHOICE_REALS:
            setattr(native, name, getattr(self, name))
        native.feed_forward_activation = GATED_ACTIVATION_VALUES[self.feed_forward_activation]
        native.sliding_window_period = self.sliding_window_period
        native.rope_scaling = ROPE_SCALING_VALUES[self.rope_scaling]
        native.rope_original_context = self.rope_original_context
        for name, (values, _) in _GPT2_CHOICES.items():
            setattr(native, name, values[getattr(self, name)])
        if self.rope_frequency_factors:
            factors = (ctypes.c_float * len(self.rope_frequency_factors))(
                *self.rope_frequency_factors
            )
            native._factors = factors  # kept alive with the struct
            native.rope_frequency_factors = ctypes.cast(factors, ctypes.POINTER(ctypes.c_float))
            native.rope_frequency_factor_count = len(factors)
        return native

    @classmethod
    def _from_native(cls, native: LlamaMistralConfigStruct) -> LlamaMistralConfig:
        return cls(
            **{name: getattr(native, name) for name in _DIMENSION_FIELDS},
            architecture=ARCHITECTURE_NAMES[native.architecture],
            rms_norm_epsilon=native.rms_norm_epsilon,
            rope_theta=native.rope_theta,
            sliding_window=native.sliding_window or None,
            tie_embeddings=bool(native.tie_embeddings),
            random_seed=native.random_seed,
            head_width=native.head_width,
            **{name: bool(getattr(native, name)) for name in _CHOICE_FLAGS},
            **{name: getattr(native, name) for name in _CHOICE_REALS},
            feed_forward_activation=GATED_ACTIVATION_NAMES[native.feed_forward_activation],
            sliding_window_period=native.sliding_window_period,
            rope_scaling=ROPE_SCALING_NAMES[native.rope_scaling],
            rope_original_context=native.rope_original_context,
            rope_frequency_factors=tuple(
                native.rope_frequency_factors[i] for i in range(native.rope_frequency_factor_count)
            ),
            **{name: names[getattr(native, name)] for name, (_, names) in _GPT2_CHOICES.items()},
        )


class LlamaMistralTransformer(CausalLanguageModel):
    """A Llama/Mistral decoder: RoPE (split-half), grouped-query attention, SwiGLU, RMSNorm.

    ``LlamaMistralTransformer(config)`` draws random weights from ``config.random_seed``;
    :meth:`from_gguf` reads a pretrained checkpoint. Everything a
    :class:`DecoderOnlyTransformer` offers works the same way: forward (``model(tokens)``),
    ``parameters()``, attention and checkpointing policies, decode sessions and pools,
    ``attach_lora`` on any of ``attention.{query,key,value,output}``,
    ``feed_forward.{gate,up,down}`` and (untied) ``language_model_head``, ``quantize_nf4``
    and Adam.
    """

    def __init__(
        self,
        config: LlamaMistralConfig,
        attention: str = "materialized",
        activation_checkpointing: str = "disabled",
    ) -> None:
        if not isinstance(config, LlamaMistralConfig):
            raise TypeError(f"config must be a LlamaMistralConfig, not {type(config).__name__}")
        require_choice(attention, "attention", ATTENTION_VALUES)
        require_choice(
            activation_checkpointing, "activation_checkpointing", ACTIVATION_CHECKPOINTING_VALUES
        )
        native = library()
        llama = ctypes.c_void_p()
        check_status(
            native.rt_llama_mistral_model_create(
                ctypes.byref(config._native()), ctypes.byref(llama)
            )
        )
        self._adopt_llama(llama, config)
        try:
            self.set_full_sequence_attention(attention)
            self.set_activation_checkpointing(activation_checkpointing)
        except BaseException:
            self.close()
            raise

    def _adopt_llama(self, llama: ctypes.c_void_p, config: LlamaMistralConfig | None) -> None:
        """Takes an rt_llama_mistral_model handle: keeps an rt_model view of its state."""
        native = library()
        try:
            model = ctypes.c_void_p()
            check_status(native.rt_llama_mistral_model_as_model(llama, ctypes.byref(model)))
            if config is None:
                struct = LlamaMistralConfigStruct()
                struct.struct_size = ctypes.sizeof(struct)
                check_status(native.rt_llama_mistral_model_config(llama, ctypes.byref(struct)))
                config = LlamaMistralConfig._from_native(struct)
        finally:
            native.rt_llama_mistral_model_release(llama)  # the view shares the state
        self._adopt(model.value, threading.RLock())
        self._config = config

    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike, maximum_context: int = 0, attention: str = "flash",
        weights: str = "f32",
    ) -> LlamaMistralTransformer:
        """The model in a GGUF file (every architecture the loader reads).

        ``maximum_context`` 0 keeps the file's context length; a smaller one bounds the
        sequence and cache sizes. ``weights``: ``"f32"`` expands every weight to float32;
        ``"file"`` keeps each projection in the file's block format (Q8_0, Q4_0, Q4_1, Q5_0,
        Q4_K, Q5_K, Q6_K, F16 or BF16, the file's own bytes; another type raises ValueError
        naming the tensor), and the embedding table too when it is in one of them; the norms
        are float32. Malformed or unsupported files raise the native runtime_error naming the
        field.
        """
        require_choice(attention, "attention", ATTENTION_VALUES)
        packed = require_choice(weights, "weights", {"f32": 0, "file": 1}) == 1
        context = require_int(maximum_context, "maximum_context", 0, UINT64_LIMIT)
        encoded = os.fsencode(os.fspath(path))
        if b"\0" in encoded:
            raise ValueError(f"path must not contain NUL bytes (got {path!r})")
        llama = ctypes.c_void_p()
        load = (library().rt_llama_mistral_model_load_gguf_packed if packed
                else library().rt_llama_mistral_model_load_gguf)
        check_status(load(encoded, context, ctypes.byref(llama)))
        model = cls.__new__(cls)
        model._adopt_llama(llama, None)
        model.set_full_sequence_attention(attention)
        return model

    @property
    def config(self) -> LlamaMistralConfig:
        """The model's configuration (from the file for GGUF checkpoints)."""
        with self._native():
            return self._config

    def _given_decoder_reals(self) -> dict[str, float]:
        return {name: getattr(self._config, name) for name in _FLOAT32_REALS}

    def __repr__(self) -> str:
        if self.closed:
            return "<LlamaMistralTransformer (closed)>"
        return f"<LlamaMistralTransformer {self._config} backend={self.backend!r}>"
