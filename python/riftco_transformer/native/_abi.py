"""The C ABI 2.10 of ``include/riftco_transformer/c_api.h``, transcribed for ctypes.

This module is a transcription and nothing else: the header's constants, the layouts of its
size-prefixed structs, and one prototype (result type and argument types) for every ``rt_``
function. Keep it in the header's order so the two can be read side by side.

Conventions used below:

* Handles are opaque, so every handle argument is a ``c_void_p`` and every "out handle" is a
  ``POINTER(c_void_p)``.
* Status-returning functions return ``rt_status`` (``int32_t``); the caller checks it (see
  ``_errors.check_status``).
* Array arguments keep their element type (``POINTER(c_float)``, ``POINTER(c_uint32)``...),
  so ctypes rejects a buffer of the wrong element type instead of reinterpreting it.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)

# ---- Versioning: (major << 16) | minor. A library is usable when its major equals ours and its
# minor is at least ours (minors only add).
ABI_VERSION_MAJOR = 2
ABI_VERSION_MINOR = 15
ABI_VERSION = (ABI_VERSION_MAJOR << 16) | ABI_VERSION_MINOR

# ---- Status codes (never renumbered).
STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_OUT_OF_RANGE = 2
STATUS_OVERFLOW = 3
STATUS_BACKEND_UNAVAILABLE = 4
STATUS_OUT_OF_MEMORY = 5
STATUS_RUNTIME_ERROR = 6
STATUS_UNKNOWN_ERROR = 255

# ---- Backends (never renumbered).
BACKEND_CPU = 0
BACKEND_METAL = 1
BACKEND_CUDA = 2
BACKEND_TPU = 3
BACKEND_PJRT = 4  # any PJRT plugin, named by RIFTCO_TRANSFORMER_PJRT_PLUGIN (2.9)

# ---- Tokenizer methods, attention kinds, checkpointing policies, Adam state storage.
TOKENIZER_METHOD_BYTE = 0
TOKENIZER_METHOD_BPE = 1
ATTENTION_MATERIALIZED = 0
ATTENTION_FLASH = 1
ACTIVATION_CHECKPOINTING_DISABLED = 0
ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK = 1
ADAM_STATE_CONTIGUOUS = 0
ADAM_STATE_PAGED = 1
LEARNING_RATE_SCHEDULE_CONSTANT = 0
LEARNING_RATE_SCHEDULE_WARMUP_COSINE = 1
LEARNING_RATE_SCHEDULE_WARMUP_LINEAR = 2

# ---- LoRA target mask bits (uint64).
LORA_TARGET_QUERY = 1 << 0
LORA_TARGET_KEY = 1 << 1
LORA_TARGET_VALUE = 1 << 2
LORA_TARGET_OUTPUT = 1 << 3
LORA_TARGET_FEED_FORWARD_EXPAND = 1 << 4
LORA_TARGET_FEED_FORWARD_PROJECT = 1 << 5
LORA_TARGET_LANGUAGE_MODEL_HEAD = 1 << 6
LORA_TARGETS_DEFAULT = LORA_TARGET_QUERY | LORA_TARGET_VALUE
LORA_TARGETS_ALL_LINEAR = 0x7F
LORA_TARGET_FEED_FORWARD_GATE = 1 << 7
LORA_TARGET_FEED_FORWARD_UP = 1 << 8
LORA_TARGET_FEED_FORWARD_DOWN = 1 << 9

# ---- KV cache kinds (never renumbered).
KV_CACHE_CONTIGUOUS = 0
KV_CACHE_PAGED = 1

# ---- Element types of rt_parameter_list_load_from_bytes (never renumbered).
DTYPE_F32 = 0
DTYPE_F16 = 1
DTYPE_BF16 = 2

rt_status = c_int32
handle = c_void_p
handle_out = POINTER(c_void_p)
size_out = POINTER(c_uint64)


# ---- Size-prefixed structs. Always fill one with its rt_*_init(&s, sizeof s) before editing.
class TokenizerOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("method", c_int32),
        ("reserved", c_uint32),
        ("vocabulary_size", c_uint64),
        ("minimum_pair_frequency", c_uint64),
    ]


class BpeMergeRule(Structure):
    _fields_ = [("left", c_uint32), ("right", c_uint32), ("result", c_uint32)]


class TransformerConfigStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("vocabulary_size", c_uint64),
        ("maximum_context", c_uint64),
        ("model_width", c_uint64),
        ("head_count", c_uint64),
        ("block_count", c_uint64),
        ("feed_forward_width", c_uint64),
        ("random_seed", c_uint32),
        ("layer_norm_epsilon", c_float),
        ("feed_forward_activation", c_uint32),
        ("tie_embeddings", c_uint32),
    ]


class LlamaMistralConfigStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("architecture", c_int32),
        ("random_seed", c_uint32),
        ("vocabulary_size", c_uint64),
        ("maximum_context", c_uint64),
        ("model_width", c_uint64),
        ("query_head_count", c_uint64),
        ("key_value_head_count", c_uint64),
        ("block_count", c_uint64),
        ("feed_forward_width", c_uint64),
        ("rms_norm_epsilon", c_float),
        ("tie_embeddings", c_uint32),
        ("rope_theta", c_double),
        ("sliding_window", c_uint64),
        # 2.10: the family choices
        ("head_width", c_uint64),
        ("query_key_value_bias", c_uint32),
        ("query_key_norm", c_uint32),
        ("norm_weight_offset", c_uint32),
        ("post_block_norms", c_uint32),
        ("feed_forward_activation", c_int32),
        ("embedding_scale", c_float),
        ("attention_scale", c_float),
        ("rope_scaling", c_int32),
        ("sliding_window_period", c_uint64),
        ("rope_local_theta", c_double),
        ("rope_scaling_factor", c_double),
        ("rope_low_frequency_factor", c_double),
        ("rope_high_frequency_factor", c_double),
        ("rope_original_context", c_uint64),
        # 2.11: Gemma 2's soft caps
        ("attention_logit_softcap", c_float),
        ("final_logit_softcap", c_float),
        # 2.11: YaRN
        ("rope_yarn_beta_fast", c_double),
        ("rope_yarn_beta_slow", c_double),
        ("rope_yarn_attention_factor", c_double),
        # 2.11: the frequency factors (rope_scaling "frequency_factors")
        ("rope_frequency_factors", POINTER(c_float)),
        ("rope_frequency_factor_count", c_uint64),
        # 2.12: the GPT-2 choices
        ("positions", c_int32),
        ("norm", c_int32),
        ("feed_forward", c_int32),
        ("plain_activation", c_int32),
        ("output_bias", c_uint32),
        ("feed_forward_bias", c_uint32),
        ("head_bias", c_uint32),
        ("reserved", c_uint32),
    ]


class PretrainedVocabularyStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("model", c_int32),
        ("pretokenizer", c_int32),
        ("token_count", c_uint64),
        ("token_bytes", POINTER(c_uint8)),
        ("token_offsets", POINTER(c_uint64)),
        ("token_types", POINTER(c_int32)),
        ("scores", POINTER(c_float)),
        ("merge_count", c_uint64),
        ("merge_bytes", POINTER(c_uint8)),
        ("merge_offsets", POINTER(c_uint64)),
        ("bos_id", c_int64),
        ("eos_id", c_int64),
        ("unknown_id", c_int64),
        ("ignore_merges", c_uint32),
        ("add_dummy_prefix", c_uint32),
    ]


class PretrainedTokenizerInfoStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("model", c_int32),
        ("pretokenizer", c_int32),
        ("token_count", c_uint64),
        ("merge_count", c_uint64),
        ("bos_id", c_int64),
        ("eos_id", c_int64),
        ("unknown_id", c_int64),
        ("ignore_merges", c_uint32),
        ("add_dummy_prefix", c_uint32),
    ]


class AdamOptionsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("learning_rate", c_float),
        ("beta1", c_float),
        ("beta2", c_float),
        ("epsilon", c_float),
        ("maximum_gradient_norm", c_float),
        ("reserved", c_uint32),
        ("state_storage", c_int32),
        ("reserved2", c_uint32),
        ("page_size", c_uint64),
        # 2.13: AdamW's weight decay and the learning-rate schedule
        ("weight_decay", c_double),
        ("schedule", c_int32),
        ("reserved3", c_uint32),
        ("warmup_steps", c_uint64),
        ("total_steps", c_uint64),
        ("minimum_fraction", c_double),
    ]


class AdamStepStatsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("step", c_uint64),
        ("gradient_norm", c_double),
        ("clip_scale", c_double),
        ("learning_rate", c_double),  # 2.13
    ]


class AdamStateStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("step_count", c_uint64),
        ("beta1_power", c_double),
        ("beta2_power", c_double),
        ("value_count", c_uint64),
    ]


class DecodeSessionOptionsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("kind", c_int32),
        ("reserved", c_uint32),
        ("block_size", c_uint64),
    ]


class KvCachePoolOptionsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("block_size", c_uint64),
        ("block_count", c_uint64),
        ("prefix_caching", c_uint64),  # 2.15
    ]


class SamplingOptionsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("temperature", c_double),
        ("top_p", c_double),
        ("min_p", c_double),
        ("repetition_penalty", c_double),
        ("presence_penalty", c_double),
        ("frequency_penalty", c_double),
        ("top_k", c_uint64),
        ("seed", c_uint64),
    ]


class SamplingRowStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("options", POINTER(SamplingOptionsStruct)),
        ("context", POINTER(c_uint32)),
        ("context_count", c_uint64),
        ("prompt_length", c_uint64),
        ("mask", POINTER(c_uint8)),
        ("draw_index", c_uint64),
        ("vocabulary_limit", c_uint64),
        ("sample", c_uint32),
        ("log_probability", c_uint32),
        ("top_count", c_uint32),
        ("reserved", c_uint32),
    ]


MAX_TOP_LOGPROBS = 20  # RT_MAX_TOP_LOGPROBS


class LoraConfigStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("rank", c_uint64),
        ("alpha", c_float),
        ("random_seed", c_uint32),
        ("targets", c_uint64),
        ("reserved", c_uint64),
        ("rank_stabilized", c_uint32),  # 2.13: rsLoRA
        ("reserved2", c_uint32),
        ("dropout", c_float),  # 2.15: dropout on the adapter input
        ("reserved3", c_uint32),
    ]


QUANTIZED_MEMORY_FIELDS = (
    "weight_count",
    "packed_code_bytes",
    "scale_bytes",
    "logical_payload_bytes",
    "resident_payload_bytes",
    "fp32_equivalent_bytes",
    "fp32_scale_bytes",
    "scale_code_bytes",
    "second_level_scale_bytes",
    "scale_offset_bytes",
    "double_quantized_weight_count",
)


class QuantizedMemoryStatsStruct(Structure):
    _fields_ = [("struct_size", c_uint64)] + [(name, c_uint64) for name in QUANTIZED_MEMORY_FIELDS]


# ---- Programmed models.
PROGRAM_INPUT_WHOLE_SOURCE = 0
PROGRAM_INPUT_SOURCE_POSITION = 1
LOWERING_AUTO = 0
LOWERING_DENSE = 1
LOWERING_LINEAR = 2
LOWERING_LINEAR_ATTENTION = 3
LOWERING_UNSUPPORTED_REJECT = 0
LOWERING_UNSUPPORTED_DENSE_FALLBACK = 1
COEFFICIENT_PRECISION_EXACT = 0
COEFFICIENT_PRECISION_ROUNDED = 1
COEFFICIENT_INIT_COMPILED = 0
COEFFICIENT_INIT_RANDOM_UNIFORM = 1


class ProgramAugmentedModelConfigStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("vocabulary_size", c_uint64),
        ("context_length", c_uint64),
        ("model_width", c_uint64),
        ("head_count", c_uint64),
        ("feed_forward_width", c_uint64),
        ("attention_branch_count", c_uint64),
        ("attention", c_int32),
        ("random_seed", c_uint32),
    ]


class ProgramInputLayoutStruct(Structure):
    _fields_ = [
        ("source", c_int32),
        ("reserved", c_uint32),
        ("position", c_uint64),
        ("projection_group", c_uint64),
    ]


class ProgramBranchConfigStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("source_offset", c_uint64),
        ("source_length", c_uint64),
        ("target_offset", c_uint64),
        ("output_length", c_uint64),
        ("inputs", POINTER(ProgramInputLayoutStruct)),
        ("input_count", c_uint64),
        ("input_projection_bias", c_uint32),
        ("merge_bias", c_uint32),
    ]


class NeuralLoweringOptionsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("strategy", c_int32),
        ("unsupported_policy", c_int32),
        ("precision", c_int32),
        ("initialization", c_int32),
        ("random_scale", c_float),
        ("random_seed", c_uint32),
        ("trainable", c_uint32),
        ("attention_query_axis", c_int32),
        ("max_coefficient_elements", c_uint64),
    ]


class ProgramSteeringStruct(Structure):
    _fields_ = [
        ("input_index", c_uint64),
        ("position", c_uint64),
        ("scales", POINTER(c_float)),
        ("scale_count", c_uint64),
        ("offsets", POINTER(c_float)),
        ("offset_count", c_uint64),
    ]


class ProgramForwardOptionsStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint64),
        ("capture_representations", c_uint32),
        ("batch_roll_learned_attention", c_uint32),
        ("batch_roll_shift", c_uint64),
        ("steering", POINTER(ProgramSteeringStruct)),
        ("steering_count", c_uint64),
        ("ablated_program_inputs", POINTER(c_uint64)),
        ("ablated_program_input_count", c_uint64),
        ("ablate_program_output", c_uint32),
        ("reserved", c_uint32),
    ]


# ---- Prototypes: name -> (result type, argument types), in the header's order.
PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    # Versioning, status and errors.
    "rt_abi_version": (c_uint32, []),
    "rt_status_string": (c_char_p, [rt_status]),
    "rt_last_error": (c_char_p, []),
    # Backends.
    "rt_backend_is_available": (rt_status, [c_int32, POINTER(c_int32)]),
    "rt_backend_name": (rt_status, [c_int32, POINTER(c_char), c_uint64, size_out]),
    "rt_backend_unavailability_reason": (rt_status, [c_int32, POINTER(c_char), c_uint64, size_out]),
    "rt_cpu_info": (rt_status, [POINTER(c_char), c_uint64, size_out]),
    # Tokenizers.
    "rt_tokenizer_options_init": (rt_status, [POINTER(TokenizerOptions), c_uint64]),
    "rt_tokenizer_create": (rt_status, [POINTER(c_uint8), c_uint64, handle_out]),
    "rt_tokenizer_create_with_options": (
        rt_status,
        [POINTER(c_uint8), c_uint64, POINTER(TokenizerOptions), handle_out],
    ),
    "rt_tokenizer_create_from_byte_vocabulary": (
        rt_status,
        [POINTER(c_uint8), c_uint64, handle_out],
    ),
    "rt_tokenizer_create_from_bpe_merges": (
        rt_status,
        [POINTER(BpeMergeRule), c_uint64, handle_out],
    ),
    "rt_tokenizer_release": (None, [handle]),
    "rt_tokenizer_get_method": (rt_status, [handle, POINTER(c_int32)]),
    "rt_tokenizer_vocabulary_size": (rt_status, [handle, size_out]),
    "rt_tokenizer_bpe_merge_count": (rt_status, [handle, size_out]),
    "rt_tokenizer_bpe_merge_rule": (rt_status, [handle, c_uint64, POINTER(BpeMergeRule)]),
    "rt_tokenizer_vocabulary": (rt_status, [handle, POINTER(c_uint8), c_uint64, size_out]),
    "rt_tokenizer_token_bytes": (
        rt_status,
        [handle, c_uint32, POINTER(c_uint8), c_uint64, size_out],
    ),
    "rt_tokenizer_encode": (
        rt_status,
        [handle, POINTER(c_uint8), c_uint64, POINTER(c_uint32), c_uint64, size_out],
    ),
    "rt_tokenizer_decode": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, POINTER(c_uint8), c_uint64, size_out],
    ),
    # Contexts and tensors.
    "rt_context_create": (rt_status, [c_int32, handle_out]),
    "rt_context_release": (None, [handle]),
    "rt_context_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_tensor_create_f32": (
        rt_status,
        [handle, POINTER(c_uint64), c_uint64, POINTER(c_float), c_uint64, handle_out],
    ),
    "rt_tensor_zeros_f32": (rt_status, [handle, POINTER(c_uint64), c_uint64, handle_out]),
    "rt_tensor_release": (None, [handle]),
    "rt_tensor_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_tensor_rank": (rt_status, [handle, size_out]),
    "rt_tensor_shape": (rt_status, [handle, POINTER(c_uint64), c_uint64, size_out]),
    "rt_tensor_numel": (rt_status, [handle, size_out]),
    "rt_tensor_copy_to_host_f32": (rt_status, [handle, POINTER(c_float), c_uint64, size_out]),
    "rt_tensor_matmul": (rt_status, [handle, handle, handle_out]),
    # Decoder-only transformer.
    "rt_transformer_config_init": (rt_status, [POINTER(TransformerConfigStruct), c_uint64]),
    "rt_model_create": (rt_status, [POINTER(TransformerConfigStruct), handle_out]),
    "rt_model_release": (None, [handle]),
    "rt_model_config": (rt_status, [handle, POINTER(TransformerConfigStruct)]),
    "rt_model_to": (rt_status, [handle, c_int32]),
    "rt_model_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_set_full_sequence_attention": (rt_status, [handle, c_int32]),
    "rt_model_get_full_sequence_attention": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_set_activation_checkpointing": (rt_status, [handle, c_int32]),
    "rt_model_get_activation_checkpointing": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_forward": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, c_uint64, c_uint64, handle_out],
    ),
    "rt_model_forward_packed": (
        rt_status,
        [handle, POINTER(c_uint32), POINTER(c_uint32), c_uint64, c_uint64, c_uint64, handle_out],
    ),
    "rt_model_parameters": (rt_status, [handle, handle_out]),
    "rt_model_is_llama_mistral": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_decoder_config": (rt_status, [handle, POINTER(LlamaMistralConfigStruct)]),
    "rt_checkpoint_tensor_name": (
        rt_status,
        [c_int32, c_int32, c_char_p, c_uint32, c_char_p, c_uint64, size_out, POINTER(c_int32)],
    ),
    # Llama / Mistral decoders and GGUF checkpoints.
    "rt_llama_mistral_config_init": (rt_status, [POINTER(LlamaMistralConfigStruct), c_uint64]),
    "rt_llama_mistral_config_preset": (rt_status, [POINTER(LlamaMistralConfigStruct), c_int32]),
    "rt_llama_mistral_model_create": (rt_status, [POINTER(LlamaMistralConfigStruct), handle_out]),
    "rt_llama_mistral_model_load_gguf": (rt_status, [c_char_p, c_uint64, handle_out]),
    "rt_llama_mistral_model_load_gguf_packed": (rt_status, [c_char_p, c_uint64, handle_out]),
    "rt_llama_mistral_model_release": (None, [handle]),
    "rt_llama_mistral_model_config": (rt_status, [handle, POINTER(LlamaMistralConfigStruct)]),
    "rt_llama_mistral_model_to": (rt_status, [handle, c_int32]),
    "rt_llama_mistral_model_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_llama_mistral_model_forward": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, c_uint64, c_uint64, handle_out],
    ),
    "rt_llama_mistral_model_parameters": (rt_status, [handle, handle_out]),
    "rt_llama_mistral_model_as_model": (rt_status, [handle, handle_out]),
    # Tokenizers of pretrained models; GGUF metadata.
    "rt_pretrained_tokenizer_create": (
        rt_status, [POINTER(PretrainedVocabularyStruct), handle_out]),
    "rt_pretrained_tokenizer_load_gguf": (rt_status, [c_char_p, handle_out]),
    "rt_pretrained_tokenizer_release": (None, [handle]),
    "rt_pretrained_tokenizer_vocabulary_size": (rt_status, [handle, size_out]),
    "rt_pretrained_tokenizer_special_ids": (
        rt_status, [handle, POINTER(c_int64), POINTER(c_int64), POINTER(c_int64)]),
    "rt_pretrained_tokenizer_encode": (
        rt_status, [handle, c_char_p, c_uint64, c_int32, POINTER(c_uint32), c_uint64, size_out]),
    "rt_pretrained_tokenizer_decode": (
        rt_status, [handle, POINTER(c_uint32), c_uint64, POINTER(c_uint8), c_uint64, size_out]),
    "rt_pretrained_tokenizer_token_bytes": (
        rt_status, [handle, c_uint32, POINTER(c_uint8), c_uint64, size_out]),
    "rt_pretrained_tokenizer_token_text": (
        rt_status, [handle, c_uint32, POINTER(c_uint8), c_uint64, size_out]),
    "rt_pretrained_tokenizer_info_get": (
        rt_status, [handle, POINTER(PretrainedTokenizerInfoStruct)]),
    "rt_pretrained_tokenizer_export": (
        rt_status, [handle, c_int32, POINTER(c_uint8), c_uint64, size_out]),
    "rt_pretrained_tokenizer_find_token": (
        rt_status, [handle, c_char_p, c_uint64, POINTER(c_int64)]),
    "rt_gguf_metadata_string": (
        rt_status,
        [c_char_p, c_char_p, POINTER(c_int32), POINTER(c_uint8), c_uint64, size_out]),
    # LoRA and packed NF4.
    "rt_lora_config_init": (rt_status, [POINTER(LoraConfigStruct), c_uint64]),
    "rt_model_attach_lora": (rt_status, [handle, POINTER(LoraConfigStruct)]),
    "rt_model_has_lora": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_lora_dropout_key": (rt_status, [handle, POINTER(c_uint64)]),
    "rt_model_set_lora_dropout_key": (rt_status, [handle, c_uint64]),
    "rt_model_lora_dropout_enabled": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_set_lora_dropout_enabled": (rt_status, [handle, c_int32]),
    "rt_model_lora_config": (rt_status, [handle, POINTER(LoraConfigStruct)]),
    "rt_model_lora_parameters": (rt_status, [handle, handle_out]),
    "rt_model_merge_lora": (rt_status, [handle]),
    "rt_model_untie_embeddings": (rt_status, [handle]),
    "rt_model_quantize_linear_weights_nf4": (rt_status, [handle, c_uint64]),
    "rt_model_quantize_linear_weights_nf4_double_quantized": (
        rt_status,
        [handle, c_uint64, c_uint64],
    ),
    "rt_model_quantize_linear_weights": (rt_status, [handle, c_int32]),
    "rt_model_linear_weight_format": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_has_quantized_linear_weights": (rt_status, [handle, POINTER(c_int32)]),
    "rt_model_quantized_memory_stats": (rt_status, [handle, POINTER(QuantizedMemoryStatsStruct)]),
    "rt_model_packed_state_size": (rt_status, [handle, size_out]),
    "rt_model_packed_state_copy": (rt_status, [handle, POINTER(c_uint8), c_uint64, size_out]),
    "rt_model_packed_state_load": (rt_status, [handle, POINTER(c_uint8), c_uint64]),
    # Parameter lists.
    # KV-cached decoding
    "rt_decode_session_options_init": (rt_status, [POINTER(DecodeSessionOptionsStruct), c_uint64]),
    "rt_model_decode_session_create": (
        rt_status,
        [handle, POINTER(DecodeSessionOptionsStruct), handle_out],
    ),
    "rt_decode_session_release": (None, [handle]),
    "rt_decode_session_step": (
        rt_status,
        [handle, c_uint32, POINTER(c_float), c_uint64, size_out],
    ),
    "rt_decode_session_prefill": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, POINTER(c_float), c_uint64, size_out],
    ),
    "rt_decode_session_reset": (rt_status, [handle]),
    "rt_decode_session_size": (rt_status, [handle, size_out]),
    "rt_decode_session_capacity": (rt_status, [handle, size_out]),
    "rt_decode_session_cache_kind": (rt_status, [handle, POINTER(c_int32)]),
    "rt_decode_session_block_size": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_options_init": (rt_status, [POINTER(KvCachePoolOptionsStruct), c_uint64]),
    "rt_model_kv_cache_pool_create": (
        rt_status,
        [handle, POINTER(KvCachePoolOptionsStruct), handle_out],
    ),
    "rt_kv_cache_pool_release": (None, [handle]),
    "rt_kv_cache_pool_session_create": (rt_status, [handle, handle_out]),
    "rt_kv_cache_pool_block_size": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_block_count": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_blocks_per_full_cache": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_free_block_count": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_leased_block_count": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_cached_block_count": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_admission": (rt_status, [handle, c_uint64, POINTER(c_int32)]),
    "rt_kv_cache_pool_session_create_reserved": (rt_status, [handle, c_uint64, handle_out]),
    "rt_kv_cache_pool_reserved_block_count": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_available_block_count": (rt_status, [handle, size_out]),
    "rt_decode_session_reserved_block_count": (rt_status, [handle, size_out]),
    "rt_kv_cache_pool_clear_prefix_cache": (rt_status, [handle]),
    "rt_decode_session_reuse_prefix": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, size_out],
    ),
    "rt_decode_sessions_step": (
        rt_status,
        [
            POINTER(c_void_p),
            c_uint64,
            POINTER(c_uint32),
            POINTER(c_uint64),
            c_uint64,
            POINTER(c_float),
            c_uint64,
            size_out,
        ],
    ),
    "rt_f32_rows_argmax": (
        rt_status,
        [POINTER(c_float), c_uint64, c_uint64, POINTER(c_uint32), POINTER(c_uint8)],
    ),
    "rt_sampling_options_init": (rt_status, [POINTER(SamplingOptionsStruct), c_uint64]),
    "rt_sample_f32_row": (
        rt_status,
        [
            POINTER(c_float),
            c_uint64,
            POINTER(SamplingOptionsStruct),
            POINTER(c_uint32),
            c_uint64,
            c_uint64,
            POINTER(c_uint8),
            c_uint64,
            POINTER(c_uint32),
        ],
    ),
    "rt_decode_sessions_step_sample": (
        rt_status,
        [
            POINTER(c_void_p),
            c_uint64,
            POINTER(c_uint32),
            POINTER(c_uint64),
            c_uint64,
            POINTER(SamplingRowStruct),
            POINTER(c_uint32),
            POINTER(c_uint8),
            POINTER(c_double),
            POINTER(c_uint32),
            POINTER(c_double),
        ],
    ),
    "rt_f32_row_log_probabilities": (
        rt_status,
        [
            POINTER(c_float),
            c_uint64,
            c_uint32,
            c_uint64,
            POINTER(c_double),
            POINTER(c_uint32),
            POINTER(c_double),
        ],
    ),
    "rt_parameter_list_release": (None, [handle]),
    "rt_parameter_list_count": (rt_status, [handle, size_out]),
    "rt_parameter_list_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_parameter_list_name": (rt_status, [handle, c_uint64, POINTER(c_char), c_uint64, size_out]),
    "rt_parameter_list_rank": (rt_status, [handle, c_uint64, size_out]),
    "rt_parameter_list_shape": (
        rt_status,
        [handle, c_uint64, POINTER(c_uint64), c_uint64, size_out],
    ),
    "rt_parameter_list_numel": (rt_status, [handle, c_uint64, size_out]),
    "rt_parameter_list_total_numel": (rt_status, [handle, size_out]),
    "rt_parameter_list_copy_to_host_f32": (
        rt_status,
        [handle, POINTER(c_float), c_uint64, size_out],
    ),
    "rt_parameter_list_load_from_host_f32": (rt_status, [handle, POINTER(c_float), c_uint64]),
    "rt_parameter_list_load_from_bytes": (
        rt_status,
        [handle, c_uint64, c_int32, POINTER(c_uint8), c_uint64],
    ),
    # Autograd.
    "rt_variable_release": (None, [handle]),
    "rt_variable_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_variable_rank": (rt_status, [handle, size_out]),
    "rt_variable_shape": (rt_status, [handle, POINTER(c_uint64), c_uint64, size_out]),
    "rt_variable_numel": (rt_status, [handle, size_out]),
    "rt_variable_copy_to_host_f32": (rt_status, [handle, POINTER(c_float), c_uint64, size_out]),
    "rt_variable_backward": (rt_status, [handle]),
    "rt_variable_backward_scaled": (rt_status, [handle, c_float, c_uint32]),
    "rt_cross_entropy": (rt_status, [handle, POINTER(c_uint32), c_uint64, handle_out]),
    "rt_cross_entropy_time_range": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, c_uint64, c_uint64, handle_out],
    ),
    "rt_cross_entropy_masked": (
        rt_status,
        [handle, POINTER(c_uint32), c_uint64, POINTER(c_uint8), c_uint64, handle_out],
    ),
    # Programmed models.
    "rt_multilinear_map_create_dense": (
        rt_status,
        [c_uint64, POINTER(c_uint64), c_uint64, POINTER(c_double), c_uint64, handle_out],
    ),
    "rt_multilinear_map_create_sparse": (
        rt_status,
        [
            c_uint64,
            POINTER(c_uint64),
            c_uint64,
            POINTER(c_uint64),
            POINTER(c_double),
            c_uint64,
            handle_out,
        ],
    ),
    "rt_multilinear_map_release": (None, [handle]),
    "rt_multilinear_map_output_dimension": (rt_status, [handle, size_out]),
    "rt_multilinear_map_arity": (rt_status, [handle, size_out]),
    "rt_multilinear_map_input_dimensions": (
        rt_status,
        [handle, POINTER(c_uint64), c_uint64, size_out],
    ),
    "rt_multilinear_map_values": (rt_status, [handle, POINTER(c_double), c_uint64, size_out]),
    "rt_program_augmented_model_config_init": (
        rt_status,
        [POINTER(ProgramAugmentedModelConfigStruct), c_uint64],
    ),
    "rt_program_branch_config_init": (rt_status, [POINTER(ProgramBranchConfigStruct), c_uint64]),
    "rt_neural_lowering_options_init": (
        rt_status,
        [POINTER(NeuralLoweringOptionsStruct), c_uint64],
    ),
    "rt_program_augmented_forward_options_init": (
        rt_status,
        [POINTER(ProgramForwardOptionsStruct), c_uint64],
    ),
    "rt_program_augmented_model_create": (
        rt_status,
        [
            POINTER(ProgramAugmentedModelConfigStruct),
            handle,
            POINTER(ProgramBranchConfigStruct),
            POINTER(NeuralLoweringOptionsStruct),
            handle_out,
        ],
    ),
    "rt_program_augmented_model_release": (None, [handle]),
    "rt_program_augmented_model_get_config": (
        rt_status,
        [handle, POINTER(ProgramAugmentedModelConfigStruct)],
    ),
    "rt_program_augmented_model_to": (rt_status, [handle, c_int32]),
    "rt_program_augmented_model_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_program_augmented_model_has_program": (rt_status, [handle, POINTER(c_int32)]),
    "rt_program_augmented_model_parameters": (rt_status, [handle, handle_out]),
    "rt_program_augmented_model_forward": (
        rt_status,
        [
            handle,
            POINTER(c_uint32),
            c_uint64,
            c_uint64,
            POINTER(ProgramForwardOptionsStruct),
            handle_out,
            handle_out,
        ],
    ),
    "rt_representation_trace_release": (None, [handle]),
    "rt_representation_trace_count": (rt_status, [handle, size_out]),
    "rt_representation_trace_name": (
        rt_status,
        [handle, c_uint64, POINTER(c_char), c_uint64, size_out],
    ),
    "rt_representation_trace_find": (rt_status, [handle, c_char_p, size_out]),
    "rt_representation_trace_rank": (rt_status, [handle, c_uint64, size_out]),
    "rt_representation_trace_shape": (
        rt_status,
        [handle, c_uint64, POINTER(c_uint64), c_uint64, size_out],
    ),
    "rt_representation_trace_numel": (rt_status, [handle, c_uint64, size_out]),
    "rt_representation_trace_copy_f32": (
        rt_status,
        [handle, c_uint64, POINTER(c_float), c_uint64, size_out],
    ),
    # Adam.
    "rt_adam_options_init": (rt_status, [POINTER(AdamOptionsStruct), c_uint64]),
    "rt_adam_create": (rt_status, [handle, POINTER(AdamOptionsStruct), handle_out]),
    # 2.14: ZeRO-1
    "rt_adam_create_sharded": (rt_status, [handle, handle, POINTER(AdamOptionsStruct),
                                           handle_out]),
    "rt_adam_sharded_state_bytes": (rt_status, [handle, size_out, size_out]),
    "rt_adam_release": (None, [handle]),
    "rt_adam_backend": (rt_status, [handle, POINTER(c_int32)]),
    "rt_adam_step_count": (rt_status, [handle, size_out]),
    "rt_adam_parameter_count": (rt_status, [handle, size_out]),
    "rt_adam_state_storage": (rt_status, [handle, POINTER(c_int32)]),
    "rt_adam_state_page_size": (rt_status, [handle, size_out]),
    "rt_adam_state_page_count": (rt_status, [handle, size_out]),
    "rt_adam_state_payload_bytes": (rt_status, [handle, size_out]),
    "rt_adam_step": (rt_status, [handle, POINTER(AdamStepStatsStruct)]),
    "rt_adam_zero_gradients": (rt_status, [handle]),
    "rt_adam_state_get": (rt_status, [handle, POINTER(AdamStateStruct)]),
    "rt_adam_state_copy_to_host_f32": (
        rt_status,
        [handle, POINTER(c_float), POINTER(c_float), POINTER(c_float), c_uint64],
    ),
    "rt_adam_state_load_from_host_f32": (
        rt_status,
        [
            handle,
            POINTER(AdamStateStruct),
            POINTER(c_float),
            POINTER(c_float),
            POINTER(c_float),
            c_uint64,
        ],
    ),
    # Data parallelism (MPI builds; the functions exist, and report "not compiled in", in all).
    "rt_distributed_compiled_in": (rt_status, [POINTER(c_int32)]),
    "rt_process_group_create": (rt_status, [c_uint64, handle_out]),
    "rt_process_group_create_single": (rt_status, [handle_out]),
    "rt_process_group_release": (None, [handle]),
    "rt_process_group_rank": (rt_status, [handle, POINTER(c_int32)]),
    "rt_process_group_world_size": (rt_status, [handle, POINTER(c_int32)]),
    "rt_process_group_barrier": (rt_status, [handle]),
    "rt_process_group_allreduce_sum_f64": (rt_status, [handle, POINTER(c_double), c_uint64]),
    "rt_process_group_broadcast_bytes": (
        rt_status,
        [handle, POINTER(c_uint8), c_uint64, c_int32],
    ),
    "rt_process_group_allgather_u64": (
        rt_status,
        [handle, c_uint64, POINTER(c_uint64), c_uint64, size_out],
    ),
    "rt_process_group_set_bucket_bytes": (rt_status, [handle, c_uint64]),
    "rt_process_group_communication": (rt_status, [handle, size_out, POINTER(c_double)]),
    "rt_data_parallel_synchronize_parameters": (rt_status, [handle, handle]),
    "rt_data_parallel_reduce_gradients": (rt_status, [handle, handle, c_double, POINTER(c_double)]),
    # 2.14: the reduction overlapped with backward
    "rt_data_parallel_backward_and_reduce": (rt_status, [handle, handle, handle, c_double, c_float,
                                                         c_uint32, POINTER(c_double)]),
    "rt_data_parallel_parameter_hash": (rt_status, [handle, size_out]),
}


def declare_prototypes(library: ctypes.CDLL) -> None:
    """Set ``restype``/``argtypes`` of every ``rt_`` function on ``library``.

    Raises ``AttributeError`` naming the first function the library does not export.
    """
    for name, (result_type, argument_types) in PROTOTYPES.items():
        function = getattr(library, name)
        function.restype = result_type
        function.argtypes = argument_types
