/*
 * riftco_transformer stable C ABI, version 2.13 (docs/ARCHITECTURE.md, 'The C ABI').
 *
 * Conventions that hold for every function below:
 * - Only rt_ functions/types and RT_ constants. Fixed-width integers everywhere; backends,
 *   methods and policies are int32_t values that are never renumbered (only appended).
 * - Status-returning functions catch every C++ exception and return an RT_STATUS_* code.
 *   They clear the calling thread's error text on entry and set it on failure;
 *   rt_last_error() returns it (at most 1023 bytes, valid until the next status-returning
 *   call on that thread: copy it at once). A failing call changes nothing: its outputs are
 *   untouched and the handles it was given keep their state.
 * - Handles are opaque. Every successful create/derive yields one handle that is released
 *   exactly once with its rt_*_release (void, NULL is a no-op).
 * - Versioned structs start with uint64_t struct_size. Initialise with the matching
 *   rt_*_init(&s, sizeof s), then edit fields. A struct_size below the first published
 *   size of that struct is RT_STATUS_INVALID_ARGUMENT; a larger one is accepted and only the
 *   prefix this library knows is read or written. reserved fields must be zero.
 * - Variable-size outputs use (out, capacity, *required): every input is validated, then
 *   *required is set, then capacity is checked. out == NULL with capacity == 0 is a size
 *   query (RT_STATUS_OK); out == NULL with capacity > 0 is RT_STATUS_INVALID_ARGUMENT; a
 *   capacity below *required is RT_STATUS_OUT_OF_RANGE and out is untouched. Text outputs
 *   count their terminating NUL. Input pointers may be NULL only together with a zero count.
 * - Host data only crosses by copy: no function returns a pointer into tensor storage.
 * - Threading: the raw handles contain no locks. Callers serialise calls that touch the same
 *   handle, or handles derived from the same model, and never release a handle while a call
 *   that uses it is in flight. Independent handles may be used from different threads.
 * - Model-derived handles (parameter lists, variables, Adam) share ownership of the model's
 *   state: they stay valid after rt_model_release. A context may be released while its
 *   tensors live.
 */
#ifndef RIFTCO_TRANSFORMER_C_API_H
#define RIFTCO_TRANSFORMER_C_API_H

#include <stdint.h>

#if defined(_WIN32)
#define RT_CALL __cdecl
#if defined(RIFTCO_TRANSFORMER_C_API_BUILDING)
#define RT_API __declspec(dllexport)
#else
#define RT_API __declspec(dllimport)
#endif
#else
#define RT_CALL
#define RT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versioning --------------------------------------------------------------------------
 * (major << 16) | minor. A client accepts a library with the same major and a minor at least
 * its own; minors only add.
 * 2.15 also adds LoRA dropout on the adapter input: rt_lora_config's dropout (and reserved3),
 * appended after its 48-byte 2.13 layout, and rt_model_lora_dropout_key /
 * rt_model_set_lora_dropout_key, rt_model_lora_dropout_enabled /
 * rt_model_set_lora_dropout_enabled (docs/ARCHITECTURE.md, 'LoRA').
 * 2.13 adds, without renumbering a value or moving a field of 2.12 (the fine-tuning issue):
 * - rt_adam_options' weight_decay (AdamW) and learning-rate schedule (schedule, warmup_steps,
 *   total_steps, minimum_fraction: RT_LEARNING_RATE_SCHEDULE_*), appended after its 48-byte
 *   2.4 layout; rt_adam_step_stats' learning_rate, appended after its 32-byte layout;
 * - rt_variable_backward_scaled: backward with a seed other than 1 that can add into the
 *   pending gradients instead of replacing them (gradient accumulation over micro-batches);
 * - rt_model_forward_packed: packed rows, attention within document boundaries;
 * - rt_lora_config's rank_stabilized (rsLoRA), appended after its 40-byte layout.
 * 2.12 adds, without renumbering a value or moving a field of 2.11:
 * - GPT-2 as a preset of the one decoder (RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2) and
 *   rt_llama_mistral_config's positions, norm, feed_forward, plain_activation, output_bias,
 *   feed_forward_bias and head_bias, appended after its 232-byte 2.11 layout; an rt_model made
 *   by rt_model_create is that decoder too (rt_model_decoder_config reads its general config);
 * - rt_checkpoint_tensor_name: the one architecture table of checkpoint tensor names.
 * 2.11 adds, without renumbering a value or moving a field of 2.10:
 * - the rotary family Gemma 2 (RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA2, the value 2.10 kept) and
 *   rt_llama_mistral_config's attention_logit_softcap and final_logit_softcap, appended after
 *   its 184-byte 2.10 layout; GGUF loading of gemma2;
 * - YaRN RoPE scaling (RT_ROPE_SCALING_YARN, rope_yarn_beta_fast, rope_yarn_beta_slow,
 *   rope_yarn_attention_factor after the soft caps; GGUF rope.scaling.type "yarn");
 * - rope_frequency_factors / rope_frequency_factor_count: RT_ROPE_SCALING_FREQUENCY_FACTORS
 *   can be given (a fine-tuned Llama 3 GGUF model re-created from its factors) and is read
 *   back with its factors.
 * 2.10 adds, without renumbering a value or moving a field of 2.9:
 * - the rotary families Qwen 2 (RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2), Qwen 3, Gemma 3 (text)
 *   and Phi-3, and rt_llama_mistral_config's family choices, appended after its first
 *   published 96-byte layout (head width, q/k/v biases, QK-norm, (1 + w) norms, post-block
 *   norms, GeGLU, embedding and attention scales, window period, local RoPE base, RoPE
 *   scaling);
 * - rt_llama_mistral_config_preset; GGUF loading of qwen2, qwen3, gemma3 and phi3;
 * - the pre-tokenizer RT_PRETOKENIZER_QWEN2 (GGUF tokenizer.ggml.pre "qwen2").
 * 2.9 adds, without renumbering a value or moving a field of 2.8:
 * - the backend value RT_BACKEND_PJRT (4), any PJRT plugin named by
 *   RIFTCO_TRANSFORMER_PJRT_PLUGIN;
 * - rt_transformer_config.feed_forward_activation (RT_FEED_FORWARD_ACTIVATION_*) and
 *   .tie_embeddings, appended after its first published 64-byte layout;
 * - rt_cross_entropy_masked;
 * - rt_model_untie_embeddings;
 * - data parallelism over MPI: rt_distributed_compiled_in, rt_process_group_* and
 *   rt_data_parallel_*. */
#define RT_ABI_VERSION_MAJOR 2
#define RT_ABI_VERSION_MINOR 15
#define RT_ABI_VERSION 0x0002000fu

RT_API uint32_t RT_CALL rt_abi_version(void);

/* ---- Status and errors ------------------------------------------------------------------ */
typedef int32_t rt_status;
#define RT_STATUS_OK 0
#define RT_STATUS_INVALID_ARGUMENT 1    /* a bad value, shape, pointer or struct */
#define RT_STATUS_OUT_OF_RANGE 2        /* an index or id past its bound; capacity too small */
#define RT_STATUS_OVERFLOW 3            /* a size or numeric result that does not fit */
#define RT_STATUS_BACKEND_UNAVAILABLE 4 /* an explicitly requested backend cannot run here */
#define RT_STATUS_OUT_OF_MEMORY 5
/* RT_STATUS_RUNTIME_ERROR: a broken contract of call order (a stale or consumed graph, a
 * pinned model) or another runtime failure. */
#define RT_STATUS_RUNTIME_ERROR 6
#define RT_STATUS_UNKNOWN_ERROR 255

/* Lower-case name ("ok", "invalid_argument", ...); any other value: "unrecognized status".
 * Never NULL; static storage. */
RT_API const char* RT_CALL rt_status_string(rt_status status);
/* The calling thread's last error text ("" after a successful call). Never NULL. */
RT_API const char* RT_CALL rt_last_error(void);

/* ---- Backends --------------------------------------------------------------------------- */
#define RT_BACKEND_CPU 0
#define RT_BACKEND_METAL 1
#define RT_BACKEND_CUDA 2
#define RT_BACKEND_TPU 3
/* Any PJRT plugin, the one named by RIFTCO_TRANSFORMER_PJRT_PLUGIN (appended in 2.9). */
#define RT_BACKEND_PJRT 4

/* *out_available = 1 when the backend was compiled in and can run here, else 0. An unknown
 * value is RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_backend_is_available(int32_t backend, int32_t* out_available);
/* Stable name ("cpu", "metal", "cuda", "tpu", "pjrt"), NUL-terminated, size-query protocol. */
RT_API rt_status RT_CALL rt_backend_name(int32_t backend, char* out, uint64_t capacity,
                                         uint64_t* required);
/* Why the backend cannot run ("" when it can), NUL-terminated, size-query protocol. */
RT_API rt_status RT_CALL rt_backend_unavailability_reason(int32_t backend, char* out,
                                                          uint64_t capacity, uint64_t* required);
/* What the CPU backend runs ("gemm=<library and kernel family>; packed=<the packed-weight
 * kernels' instruction set per format (2.15)>; threads=<n>"), NUL-terminated, size-query
 * protocol. Added in 2.8 without changing any existing function or layout. */
RT_API rt_status RT_CALL rt_cpu_info(char* out, uint64_t capacity, uint64_t* required);

/* ---- Tokenizers (immutable) ------------------------------------------------------------- */
typedef struct rt_tokenizer rt_tokenizer;

#define RT_TOKENIZER_METHOD_BYTE 0 /* the corpus's distinct bytes, sorted */
#define RT_TOKENIZER_METHOD_BPE 1  /* 256 byte tokens plus learned merges */

typedef struct rt_tokenizer_options {
    uint64_t struct_size;
    int32_t method;                  /* init: RT_TOKENIZER_METHOD_BYTE */
    uint32_t reserved;               /* must be 0 */
    uint64_t vocabulary_size;        /* BPE maximum, in [256, 2^32-1]; init 512 */
    uint64_t minimum_pair_frequency; /* BPE, >= 1; init 2 */
} rt_tokenizer_options;

typedef struct rt_bpe_merge_rule {
    uint32_t left;
    uint32_t right;
    uint32_t result;
} rt_bpe_merge_rule;

RT_API rt_status RT_CALL rt_tokenizer_options_init(rt_tokenizer_options* options,
                                                   uint64_t struct_size);
/* Byte tokenizer over the corpus's distinct bytes (corpus non-empty). */
RT_API rt_status RT_CALL rt_tokenizer_create(const uint8_t* corpus, uint64_t corpus_size,
                                             rt_tokenizer** out);
/* options == NULL means the byte method. The byte method ignores vocabulary_size and
 * minimum_pair_frequency. */
RT_API rt_status RT_CALL rt_tokenizer_create_with_options(const uint8_t* corpus,
                                                          uint64_t corpus_size,
                                                          const rt_tokenizer_options* options,
                                                          rt_tokenizer** out);
/* Exact restoration: vocabulary[id] is the byte of token id (1 to 256 distinct bytes, in any
 * order: the order given is the id order). */
RT_API rt_status RT_CALL rt_tokenizer_create_from_byte_vocabulary(const uint8_t* vocabulary,
                                                                  uint64_t count,
                                                                  rt_tokenizer** out);
/* Exact restoration of a BPE merge table (rule i creates id 256 + i). */
RT_API rt_status RT_CALL rt_tokenizer_create_from_bpe_merges(const rt_bpe_merge_rule* rules,
                                                             uint64_t count, rt_tokenizer** out);
RT_API void RT_CALL rt_tokenizer_release(rt_tokenizer* tokenizer);

RT_API rt_status RT_CALL rt_tokenizer_get_method(const rt_tokenizer* tokenizer,
                                                 int32_t* out_method);
RT_API rt_status RT_CALL rt_tokenizer_vocabulary_size(const rt_tokenizer* tokenizer,
                                                      uint64_t* out_size);
/* BPE only (byte tokenizers: RT_STATUS_INVALID_ARGUMENT). */
RT_API rt_status RT_CALL rt_tokenizer_bpe_merge_count(const rt_tokenizer* tokenizer,
                                                      uint64_t* out_count);
RT_API rt_status RT_CALL rt_tokenizer_bpe_merge_rule(const rt_tokenizer* tokenizer, uint64_t index,
                                                     rt_bpe_merge_rule* out_rule);
/* Byte only: the byte of every id, size-query protocol (count = vocabulary size). */
RT_API rt_status RT_CALL rt_tokenizer_vocabulary(const rt_tokenizer* tokenizer, uint8_t* out,
                                                 uint64_t capacity, uint64_t* required);
/* The bytes of one token (id >= vocabulary size: RT_STATUS_OUT_OF_RANGE). */
RT_API rt_status RT_CALL rt_tokenizer_token_bytes(const rt_tokenizer* tokenizer, uint32_t id,
                                                  uint8_t* out, uint64_t capacity,
                                                  uint64_t* required);
/* Binary-safe encode. Never produces more ids than input bytes, so capacity = byte_count
 * always suffices. A byte the byte tokenizer never saw: RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_tokenizer_encode(const rt_tokenizer* tokenizer, const uint8_t* bytes,
                                             uint64_t byte_count, uint32_t* out, uint64_t capacity,
                                             uint64_t* required);
/* Binary-safe decode (an unknown id: RT_STATUS_OUT_OF_RANGE). */
RT_API rt_status RT_CALL rt_tokenizer_decode(const rt_tokenizer* tokenizer, const uint32_t* ids,
                                             uint64_t id_count, uint8_t* out, uint64_t capacity,
                                             uint64_t* required);

/* ---- Contexts and tensors (immutable, float32, row-major) ------------------------------- */
typedef struct rt_context rt_context;
typedef struct rt_tensor rt_tensor;

/* An unavailable backend: RT_STATUS_BACKEND_UNAVAILABLE; never falls back. */
RT_API rt_status RT_CALL rt_context_create(int32_t backend, rt_context** out);
RT_API void RT_CALL rt_context_release(rt_context* context);
RT_API rt_status RT_CALL rt_context_backend(const rt_context* context, int32_t* out_backend);

/* rank 0 is a scalar (shape may be NULL); every dimension > 0; count == product(shape);
 * every value is copied. */
RT_API rt_status RT_CALL rt_tensor_create_f32(const rt_context* context, const uint64_t* shape,
                                              uint64_t rank, const float* values, uint64_t count,
                                              rt_tensor** out);
RT_API rt_status RT_CALL rt_tensor_zeros_f32(const rt_context* context, const uint64_t* shape,
                                             uint64_t rank, rt_tensor** out);
RT_API void RT_CALL rt_tensor_release(rt_tensor* tensor);
RT_API rt_status RT_CALL rt_tensor_backend(const rt_tensor* tensor, int32_t* out_backend);
RT_API rt_status RT_CALL rt_tensor_rank(const rt_tensor* tensor, uint64_t* out_rank);
RT_API rt_status RT_CALL rt_tensor_shape(const rt_tensor* tensor, uint64_t* out, uint64_t capacity,
                                         uint64_t* required);
RT_API rt_status RT_CALL rt_tensor_numel(const rt_tensor* tensor, uint64_t* out_numel);
RT_API rt_status RT_CALL rt_tensor_copy_to_host_f32(const rt_tensor* tensor, float* out,
                                                    uint64_t capacity, uint64_t* required);
/* [..., M, K] x [..., K, N] -> [..., M, N] on the inputs' (shared) backend; mixed backends:
 * RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_tensor_matmul(const rt_tensor* left, const rt_tensor* right,
                                          rt_tensor** out);

/* ---- Decoder-only transformer ----------------------------------------------------------- */
typedef struct rt_model rt_model;
typedef struct rt_parameter_list rt_parameter_list;
typedef struct rt_variable rt_variable;

#define RT_ATTENTION_MATERIALIZED 0
#define RT_ATTENTION_FLASH 1
#define RT_ACTIVATION_CHECKPOINTING_DISABLED 0
#define RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK 1
/* rt_transformer_config.feed_forward_activation */
#define RT_FEED_FORWARD_ACTIVATION_GELU 0 /* exact erf GELU (the GPT decoder's default) */
#define RT_FEED_FORWARD_ACTIVATION_RELU 1
#define RT_FEED_FORWARD_ACTIVATION_GELU_TANH 2 /* GPT-2's tanh approximation */

typedef struct rt_transformer_config {
    uint64_t struct_size;
    uint64_t vocabulary_size;    /* V, init 0 (must be set) */
    uint64_t maximum_context;    /* C, init 0 */
    uint64_t model_width;        /* D, init 0 */
    uint64_t head_count;         /* H, init 0; D % H == 0 */
    uint64_t block_count;        /* N, init 0 */
    uint64_t feed_forward_width; /* F, init 0 */
    uint32_t random_seed;        /* init 5489 */
    float layer_norm_epsilon;    /* init 1e-5 */
    /* Appended after the first published layout (64 bytes, still accepted: a shorter
     * struct_size leaves these at their init values). */
    uint32_t feed_forward_activation; /* RT_FEED_FORWARD_ACTIVATION_*, init GELU */
    uint32_t tie_embeddings;          /* 0 (init) or 1: the head reads the token embedding; no head
                                       * parameters, no head bias, no head LoRA target */
} rt_transformer_config;

RT_API rt_status RT_CALL rt_transformer_config_init(rt_transformer_config* config,
                                                    uint64_t struct_size);
/* A new model on CPU, materialized attention, checkpointing disabled. */
RT_API rt_status RT_CALL rt_model_create(const rt_transformer_config* config, rt_model** out);
RT_API void RT_CALL rt_model_release(rt_model* model);
/* The configuration the model was created with (caller sets out->struct_size). */
RT_API rt_status RT_CALL rt_model_config(const rt_model* model, rt_transformer_config* out);
/* Transactional transfer. Rejected (RT_STATUS_RUNTIME_ERROR) while any variable or Adam
 * optimizer derived from the model is alive; an unavailable backend is
 * RT_STATUS_BACKEND_UNAVAILABLE. Either way nothing changes. */
RT_API rt_status RT_CALL rt_model_to(rt_model* model, int32_t backend);
RT_API rt_status RT_CALL rt_model_backend(const rt_model* model, int32_t* out_backend);
RT_API rt_status RT_CALL rt_model_set_full_sequence_attention(rt_model* model, int32_t attention);
RT_API rt_status RT_CALL rt_model_get_full_sequence_attention(const rt_model* model,
                                                              int32_t* out_attention);
RT_API rt_status RT_CALL rt_model_set_activation_checkpointing(rt_model* model,
                                                               int32_t checkpointing);
RT_API rt_status RT_CALL rt_model_get_activation_checkpointing(const rt_model* model,
                                                               int32_t* out_checkpointing);
/* tokens [batch, time] row-major -> logits variable [batch, time, V]. batch > 0,
 * 0 < time <= C and count == batch*time (else RT_STATUS_INVALID_ARGUMENT); every id < V
 * (else RT_STATUS_OUT_OF_RANGE). */
RT_API rt_status RT_CALL rt_model_forward(rt_model* model, const uint32_t* tokens, uint64_t count,
                                          uint64_t batch, uint64_t time, rt_variable** out);
/* 2.13: packed rows (several documents, e.g. fine-tuning examples, one after another in a
 * row). positions [batch, time] (count of them, as tokens) holds each token's position inside
 * its document: every row starts at 0 and each next position is 0 (a new document) or the
 * previous + 1. Positions (RoPE or the learned table) restart in every document and attention
 * never crosses a boundary, in both attention kinds, so each document gets the logits it gets
 * alone (up to rounding). rt_model_forward's rules; a position breaking the rule above:
 * RT_STATUS_INVALID_ARGUMENT naming the row and token. Materialized attention runs on every
 * backend; flash attention needs a kernel with document bounds (the CPU's and PJRT's; CUDA and
 * Metal: RT_STATUS_INVALID_ARGUMENT naming the backend). */
RT_API rt_status RT_CALL rt_model_forward_packed(rt_model* model, const uint32_t* tokens,
                                                 const uint32_t* positions, uint64_t count,
                                                 uint64_t batch, uint64_t time, rt_variable** out);
/* The model's base parameters in their canonical order. While LoRA adapters are attached they
 * are frozen (an Adam over them is RT_STATUS_INVALID_ARGUMENT); packed NF4 projection weights
 * are not parameters and are not listed. */
RT_API rt_status RT_CALL rt_model_parameters(rt_model* model, rt_parameter_list** out);

/* ---- LoRA and packed NF4 (docs/ARCHITECTURE.md, 'LoRA' and 'NF4') -------------------------
 * Target mask bits (uint64): a projection is adapted when its bit is set. */
#define RT_LORA_TARGET_QUERY ((uint64_t)1 << 0)
#define RT_LORA_TARGET_KEY ((uint64_t)1 << 1)
#define RT_LORA_TARGET_VALUE ((uint64_t)1 << 2)
#define RT_LORA_TARGET_OUTPUT ((uint64_t)1 << 3)
#define RT_LORA_TARGET_FEED_FORWARD_EXPAND ((uint64_t)1 << 4)
#define RT_LORA_TARGET_FEED_FORWARD_PROJECT ((uint64_t)1 << 5)
#define RT_LORA_TARGET_LANGUAGE_MODEL_HEAD ((uint64_t)1 << 6)
#define RT_LORA_TARGETS_DEFAULT (RT_LORA_TARGET_QUERY | RT_LORA_TARGET_VALUE)
#define RT_LORA_TARGETS_ALL_LINEAR ((uint64_t)0x7F)
/* The gated feed-forward of Llama/Mistral models (additive): gate, up, down. */
#define RT_LORA_TARGET_FEED_FORWARD_GATE ((uint64_t)1 << 7)
#define RT_LORA_TARGET_FEED_FORWARD_UP ((uint64_t)1 << 8)
#define RT_LORA_TARGET_FEED_FORWARD_DOWN ((uint64_t)1 << 9)
#define RT_LORA_TARGETS_KNOWN ((uint64_t)0x3FF)

typedef struct rt_lora_config {
    uint64_t struct_size;
    uint64_t rank;        /* init 4; 0 < rank <= min(in, out) of every selected projection */
    float alpha;          /* init 8.0; alpha and alpha/rank finite and > 0 */
    uint32_t random_seed; /* init 5489: the adapters' std::mt19937 */
    uint64_t targets;     /* init RT_LORA_TARGETS_DEFAULT; bits outside 0x3FF are invalid */
    uint64_t reserved;    /* must be 0 */
    /* 2.13 (a 40-byte struct leaves these at their init values) */
    uint32_t rank_stabilized; /* 0 (init): scale alpha/rank; 1: alpha/sqrt(rank) (rsLoRA) */
    uint32_t reserved2;       /* must be 0 */
    /* 2.15 (a 48-byte struct reads dropout 0) */
    float dropout;      /* init 0: p in [0, 1), inverted dropout on the adapter input while
                         * training (a forward that records gradients) */
    uint32_t reserved3; /* must be 0 */
} rt_lora_config;

/* Byte accounting of the packed weights, summed over the model (all zero when none is
 * packed). Caller sets struct_size. */
typedef struct rt_quantized_memory_stats {
    uint64_t struct_size;
    uint64_t weight_count;
    uint64_t packed_code_bytes;        /* ceil(N/2) per weight */
    uint64_t scale_bytes;              /* every scale-metadata byte */
    uint64_t logical_payload_bytes;    /* packed_code_bytes + scale_bytes */
    uint64_t resident_payload_bytes;   /* every byte the backend holds (mirrors included) */
    uint64_t fp32_equivalent_bytes;    /* 4N per weight */
    uint64_t fp32_scale_bytes;         /* legacy scales: 4M */
    uint64_t scale_code_bytes;         /* double-quantized: M */
    uint64_t second_level_scale_bytes; /* double-quantized: 4*ceil(M/C) */
    uint64_t scale_offset_bytes;       /* double-quantized: 4 */
    uint64_t double_quantized_weight_count;
} rt_quantized_memory_stats;

RT_API rt_status RT_CALL rt_lora_config_init(rt_lora_config* config, uint64_t struct_size);
/* Attaches adapters to the selected projections, block-major (q, k, v, o, expand, project per
 * block, then the head), and freezes every base parameter. Once per model lifetime:
 * RT_STATUS_RUNTIME_ERROR for a second attach, an attach after merge, or while a variable or
 * Adam optimizer of the model is alive; RT_STATUS_INVALID_ARGUMENT for the config rules or a
 * mask that selects nothing. Atomic: on failure no adapter stays attached. Initially
 * output-preserving (B = 0). */
RT_API rt_status RT_CALL rt_model_attach_lora(rt_model* model, const rt_lora_config* config);
/* *out = 1 while adapters are attached and not merged. */
RT_API rt_status RT_CALL rt_model_has_lora(const rt_model* model, int32_t* out);
/* The attached config (RT_STATUS_RUNTIME_ERROR if none was ever attached). */
RT_API rt_status RT_CALL rt_model_lora_config(const rt_model* model, rt_lora_config* out);
/* 2.15: the LoRA dropout key. Every training forward (one that records gradients) of a model
 * with adapter dropout > 0 draws its masks from (random_seed, key, projection index, element)
 * and then increments the key; save it with a training checkpoint and set it back on resume
 * for bit-identical masks. 0 on a new model; any value may be set, with or without adapters. */
RT_API rt_status RT_CALL rt_model_lora_dropout_key(const rt_model* model, uint64_t* out);
RT_API rt_status RT_CALL rt_model_set_lora_dropout_key(rt_model* model, uint64_t key);
/* 2.15: evaluation mode for LoRA dropout. rt_model_forward always records a graph, so an
 * evaluation (a validation loss) sets 0 first: no forward then applies dropout or advances the
 * key, until 1 (the initial value) is set again. Any other value: RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_model_lora_dropout_enabled(const rt_model* model, int32_t* out);
RT_API rt_status RT_CALL rt_model_set_lora_dropout_enabled(rt_model* model, int32_t enabled);
/* The active adapter factors ("<proj>.lora_a.weight", "<proj>.lora_b.weight"), block order
 * then the head: the list to give Adam for adapter-only training. The base list of
 * rt_model_parameters is unchanged by LoRA. */
RT_API rt_status RT_CALL rt_model_lora_parameters(rt_model* model, rt_parameter_list** out);
/* One-way, transactional: W <- W + scale*B*A; packed weights are dequantized (plus their
 * delta), restoring the dense schema; the base becomes trainable again. RT_STATUS_RUNTIME_ERROR
 * without an attached adapter, after a merge, or while a variable, Adam optimizer or adapter
 * parameter list of the model is alive. */
RT_API rt_status RT_CALL rt_model_merge_lora(rt_model* model);
/* Gives a model with tied embeddings (GPT or Llama/Mistral) its own head: the base parameter
 * "language_model_head.weight" (plus a zero "language_model_head.bias" for GPT) is appended,
 * a copy of the embedding table, so logits are unchanged; the configuration then reads
 * tie_embeddings 0, and quantize packs the head (6N+1 / 7N+1 weights) and LoRA may target it.
 * RT_STATUS_INVALID_ARGUMENT when not tied, with LoRA attached or once packed;
 * RT_STATUS_RUNTIME_ERROR while a variable, optimizer, decode session or parameter list of
 * the model is alive. Nothing changes on error. */
RT_API rt_status RT_CALL rt_model_untie_embeddings(rt_model* model);
/* Packs every projection weight (GPT: 6N, plus the head unless tied; Llama/Mistral: 7N, plus
 * the head unless tied) as NF4 with float32 block scales, or with
 * double-quantized scales; block sizes are powers of two in 32..4096. Must run before
 * attach_lora and only once (RT_STATUS_INVALID_ARGUMENT otherwise); RT_STATUS_RUNTIME_ERROR
 * while a variable, Adam optimizer or parameter list of the model is alive. Transactional. */
RT_API rt_status RT_CALL rt_model_quantize_linear_weights_nf4(rt_model* model, uint64_t block_size);
RT_API rt_status RT_CALL rt_model_quantize_linear_weights_nf4_double_quantized(
    rt_model* model, uint64_t block_size, uint64_t scale_block_size);
/* Weight formats of packed projections (2.15): NF4, and GGUF's block formats, bit for bit
 * (32-element blocks, 256 for the K formats; a row's width must be a multiple of the block). */
#define RT_WEIGHT_FORMAT_NF4 0
#define RT_WEIGHT_FORMAT_Q8_0 1
#define RT_WEIGHT_FORMAT_Q4_0 2
#define RT_WEIGHT_FORMAT_Q4_1 3
#define RT_WEIGHT_FORMAT_Q5_0 4
#define RT_WEIGHT_FORMAT_Q4_K 5
#define RT_WEIGHT_FORMAT_Q5_K 6
#define RT_WEIGHT_FORMAT_Q6_K 7
#define RT_WEIGHT_FORMAT_F16 8  /* dense binary16 values, in blocks of 32 */
#define RT_WEIGHT_FORMAT_BF16 9 /* dense bfloat16 values, in blocks of 32 */
/* Packs every projection weight (as the NF4 functions do) in a GGUF block format with ggml's
 * reference rounding (2.15). format RT_WEIGHT_FORMAT_Q8_0, _Q4_0, _Q4_1, _Q5_0, _F16 or _BF16; NF4,
 * the K formats (they come from GGUF files only) and unknown values, an in-features width that is
 * not a multiple of 32, a second packing or one after attach_lora: RT_STATUS_INVALID_ARGUMENT
 * naming the value or projection; a model on a backend that lacks the format:
 * RT_STATUS_RUNTIME_ERROR naming both. Transactional. */
RT_API rt_status RT_CALL rt_model_quantize_linear_weights(rt_model* model, int32_t format);
/* *out = the RT_WEIGHT_FORMAT_* of the packed weights (the projections and a packed
 * embedding table), -2 when they are in several formats (a GGUF file may mix them), or -1
 * while the projections are dense (2.15). */
RT_API rt_status RT_CALL rt_model_linear_weight_format(const rt_model* model, int32_t* out);
RT_API rt_status RT_CALL rt_model_has_quantized_linear_weights(const rt_model* model, int32_t* out);
RT_API rt_status RT_CALL rt_model_quantized_memory_stats(const rt_model* model,
                                                         rt_quantized_memory_stats* out);
/* The packed weights in their canonical byte form ("RTNF4ST1", see nn/packed_state.hpp), for
 * exact-resume checkpoints: size query, copy (size-query protocol), and a transactional load
 * into an already packed model whose weight count, shapes, block sizes and scale encodings
 * match (RT_STATUS_INVALID_ARGUMENT otherwise; RT_STATUS_RUNTIME_ERROR on a model that is not
 * packed or while a variable of it is alive). Loading leaves adapters untouched. */
RT_API rt_status RT_CALL rt_model_packed_state_size(const rt_model* model, uint64_t* out_size);
RT_API rt_status RT_CALL rt_model_packed_state_copy(const rt_model* model, uint8_t* out,
                                                    uint64_t capacity, uint64_t* required);
RT_API rt_status RT_CALL rt_model_packed_state_load(rt_model* model, const uint8_t* bytes,
                                                    uint64_t count);

/* ---- KV-cached decoding (docs/ARCHITECTURE.md, 'Decoding and KV caches') -----------------
 * A decode session is one request's sequence over a model: each step runs ONE position
 * (embedding at position = size, every block, the head) against the keys and values cached
 * for the earlier ones, and returns that position's logits. Positions are learned and
 * absolute, so a session never rolls over: a step past its capacity (= the model's maximum
 * context) is RT_STATUS_OUT_OF_RANGE; roll over with reset + a prefill of the newest tokens.
 * Every step is one transaction: on any failure the session's size and the pool's pages are
 * unchanged.
 * Pinning: while any session of a model is alive, rt_model_to, NF4 conversion, LoRA attach and
 * merge, parameter and packed-state loads, Adam steps and Adam state loads on that model are
 * RT_STATUS_RUNTIME_ERROR. A session records the model's parameter epoch: a step after the
 * parameters changed anyway is RT_STATUS_RUNTIME_ERROR (stale session).
 * Sessions and pools share ownership of the model's state (they outlive rt_model_release). */
typedef struct rt_decode_session rt_decode_session;
typedef struct rt_kv_cache_pool rt_kv_cache_pool;

#define RT_KV_CACHE_CONTIGUOUS 0 /* one page of maximum_context positions (reference) */
#define RT_KV_CACHE_PAGED 1      /* pages of block_size positions, leased lazily */

typedef struct rt_decode_session_options {
    uint64_t struct_size;
    int32_t kind;        /* init RT_KV_CACHE_PAGED */
    uint32_t reserved;   /* must be 0 */
    uint64_t block_size; /* init 16; > 0 (ignored by RT_KV_CACHE_CONTIGUOUS) */
} rt_decode_session_options;

RT_API rt_status RT_CALL rt_decode_session_options_init(rt_decode_session_options* options,
                                                        uint64_t struct_size);
/* A session with a private cache sized for one full context (options NULL: the defaults). */
RT_API rt_status RT_CALL rt_model_decode_session_create(rt_model* model,
                                                        const rt_decode_session_options* options,
                                                        rt_decode_session** out);
RT_API void RT_CALL rt_decode_session_release(rt_decode_session* session);
/* Feeds `token` at position size and writes that position's V logits. logits must not be NULL
 * and capacity must be >= V (*required = V is set first; a smaller capacity is
 * RT_STATUS_OUT_OF_RANGE); all checks happen before the session changes. token >= V or a full
 * session: RT_STATUS_OUT_OF_RANGE; a pool with no free page: RT_STATUS_RUNTIME_ERROR. */
RT_API rt_status RT_CALL rt_decode_session_step(rt_decode_session* session, uint32_t token,
                                                float* logits, uint64_t capacity,
                                                uint64_t* required);
/* Batched prefill: feeds count > 0 tokens at positions size.. in ONE pass over the model and
 * writes the V logits of the last one (same output rules as step). */
RT_API rt_status RT_CALL rt_decode_session_prefill(rt_decode_session* session,
                                                   const uint32_t* tokens, uint64_t count,
                                                   float* logits, uint64_t capacity,
                                                   uint64_t* required);
/* Forgets every position and returns every page (the allocation of a private pool stays). */
RT_API rt_status RT_CALL rt_decode_session_reset(rt_decode_session* session);
RT_API rt_status RT_CALL rt_decode_session_size(const rt_decode_session* session, uint64_t* out);
/* The model's maximum context. */
RT_API rt_status RT_CALL rt_decode_session_capacity(const rt_decode_session* session,
                                                    uint64_t* out);
RT_API rt_status RT_CALL rt_decode_session_cache_kind(const rt_decode_session* session,
                                                      int32_t* out);
/* Positions per page (a contiguous cache reports the maximum context). */
RT_API rt_status RT_CALL rt_decode_session_block_size(const rt_decode_session* session,
                                                      uint64_t* out);

/* A pool of K/V pages shared by many sessions of one model: the continuous-batching layout.
 * block_count 0 means exactly one full context (ceil(C / block_size) pages); a nonzero count
 * below that is RT_STATUS_INVALID_ARGUMENT. */
typedef struct rt_kv_cache_pool_options {
    uint64_t struct_size;
    uint64_t block_size;  /* init 16; > 0 */
    uint64_t block_count; /* init 0 */
    /* 2.15, prefix caching: 1 publishes every page a session of the pool fills, so that later
     * sessions of the same model, structure and parameters adopt it by reference
     * (rt_decode_session_reuse_prefix); init 0 (off). Other values: RT_STATUS_INVALID_ARGUMENT.
     * A 2.14-sized struct reads 0. */
    uint64_t prefix_caching;
} rt_kv_cache_pool_options;

RT_API rt_status RT_CALL rt_kv_cache_pool_options_init(rt_kv_cache_pool_options* options,
                                                       uint64_t struct_size);
RT_API rt_status RT_CALL rt_model_kv_cache_pool_create(rt_model* model,
                                                       const rt_kv_cache_pool_options* options,
                                                       rt_kv_cache_pool** out);
RT_API void RT_CALL rt_kv_cache_pool_release(rt_kv_cache_pool* pool);
/* A paged session leasing from the pool (which it keeps alive). A pool made before the model
 * moved to another backend: RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_kv_cache_pool_session_create(rt_kv_cache_pool* pool,
                                                         rt_decode_session** out);
RT_API rt_status RT_CALL rt_kv_cache_pool_block_size(const rt_kv_cache_pool* pool, uint64_t* out);
RT_API rt_status RT_CALL rt_kv_cache_pool_block_count(const rt_kv_cache_pool* pool, uint64_t* out);
RT_API rt_status RT_CALL rt_kv_cache_pool_blocks_per_full_cache(const rt_kv_cache_pool* pool,
                                                                uint64_t* out);
RT_API rt_status RT_CALL rt_kv_cache_pool_free_block_count(const rt_kv_cache_pool* pool,
                                                           uint64_t* out);
RT_API rt_status RT_CALL rt_kv_cache_pool_leased_block_count(const rt_kv_cache_pool* pool,
                                                             uint64_t* out);
/* 2.15, prefix caching. Published pages no session holds (they count as free: a lease evicts
 * the least recently released one when no never-used page is left). */
RT_API rt_status RT_CALL rt_kv_cache_pool_cached_block_count(const rt_kv_cache_pool* pool,
                                                             uint64_t* out);
/* Forgets every published prefix (cached pages become plain free pages). */
RT_API rt_status RT_CALL rt_kv_cache_pool_clear_prefix_cache(rt_kv_cache_pool* pool);

/* 2.15, admission: the pool is a serving engine's one page ledger. A token budget reserves
 * ceil(min(budget, C) / block_size) pages; a session made with one never holds more (a step
 * past it: RT_STATUS_RUNTIME_ERROR) and never meets an exhausted pool. Sessions without a
 * reservation lease and adopt only beyond the reservations. */
#define RT_KV_ADMIT 0  /* the pages are available now */
#define RT_KV_WAIT 1   /* they will be once other reservations end */
#define RT_KV_REJECT 2 /* more pages than the whole pool */
RT_API rt_status RT_CALL rt_kv_cache_pool_admission(const rt_kv_cache_pool* pool,
                                                    uint64_t token_budget, int32_t* out);
/* A paged session holding a reservation for token_budget (> 0) positions, released with the
 * session. RT_STATUS_RUNTIME_ERROR ("pool full"): not available now (RT_KV_WAIT);
 * RT_STATUS_OUT_OF_RANGE: more than the pool (RT_KV_REJECT). *out is untouched on error. */
RT_API rt_status RT_CALL rt_kv_cache_pool_session_create_reserved(rt_kv_cache_pool* pool,
                                                                  uint64_t token_budget,
                                                                  rt_decode_session** out);
/* Pages reserved by living sessions in all, and pages a new reservation can take now (neither
 * reserved nor held by sessions without a reservation). */
RT_API rt_status RT_CALL rt_kv_cache_pool_reserved_block_count(const rt_kv_cache_pool* pool,
                                                               uint64_t* out);
RT_API rt_status RT_CALL rt_kv_cache_pool_available_block_count(const rt_kv_cache_pool* pool,
                                                                uint64_t* out);
/* The pages reserved for a session (0: none). */
RT_API rt_status RT_CALL rt_decode_session_reserved_block_count(const rt_decode_session* session,
                                                                uint64_t* out);
/* An empty session of a prefix-caching pool takes, by reference, the published pages holding the
 * longest whole-page prefix of prompt[0, count - 1) (the last token is always left to feed) and
 * writes the positions it now holds to *reused (0 without a match, for count < 2, or for a pool
 * without prefix caching); the caller then feeds prompt[*reused..]. Pages are adopted only from
 * sessions of the same model structure and parameter epoch. RT_STATUS_RUNTIME_ERROR: the session
 * is not empty, or stale; RT_STATUS_OUT_OF_RANGE: an id >= V. Nothing changes on error. */
RT_API rt_status RT_CALL rt_decode_session_reuse_prefix(rt_decode_session* session,
                                                        const uint32_t* prompt, uint64_t count,
                                                        uint64_t* reused);
/* One batched step over session_count distinct sessions of one model, of one shared pool (one
 * attention call per layer for all) or of several (private or contiguous caches): session i
 * is fed token_counts[i] > 0 tokens, taken in order from `tokens` (sum of the counts of them),
 * all in ONE pass over the model. Writes session_count * V logits, row i being the logits of
 * session i's last new position (*required = that count; logits must not be NULL). On any
 * failure no session changed. */
RT_API rt_status RT_CALL rt_decode_sessions_step(rt_decode_session* const* sessions,
                                                 uint64_t session_count, const uint32_t* tokens,
                                                 const uint64_t* token_counts, uint64_t token_total,
                                                 float* logits, uint64_t capacity,
                                                 uint64_t* required);

/* Per row of a host [rows, width] float matrix (a batch of logits): the index of its first
 * maximum (ties go to the lowest index; NaN never wins) and whether every value is finite
 * (1) or not (0). For samplers that need no more than that, so a client need not scan V
 * values in its own language. rows * width must fit; width > 0; values NULL only with
 * rows 0; argmax and finite may each be NULL when not wanted. */
RT_API rt_status RT_CALL rt_f32_rows_argmax(const float* values, uint64_t rows, uint64_t width,
                                            uint32_t* argmax, uint8_t* finite);

/* 2.15, sampling at C speed (docs/ARCHITECTURE.md, 'Sampling'): the rules, in order, of the
 * Python package's reference samplers, which compute the same ids bit for bit: the mask, the
 * repetition penalty (distinct context ids), presence/frequency penalties (ids generated after
 * prompt_length), greedy at temperature 0 (the first maximum), top-k, weights exp((v - h) / T),
 * top-p (a ranked prefix against top_p times the total), min-p, then the draw of
 * u = splitmix64-derived uniform of (seed, draw_index) walking kept ids in ascending order. */
typedef struct rt_sampling_options {
    uint64_t struct_size;
    double temperature;        /* init 0: greedy; else finite and > 0 */
    double top_p;              /* init 1 (off); in (0, 1] */
    double min_p;              /* init 0 (off); in [0, 1] */
    double repetition_penalty; /* init 1 (off); finite and > 0 */
    double presence_penalty;   /* init 0; in [-2, 2] */
    double frequency_penalty;  /* init 0; in [-2, 2] */
    uint64_t top_k;            /* init 0 (off); at most the vocabulary */
    uint64_t seed;             /* init 0 */
} rt_sampling_options;

RT_API rt_status RT_CALL rt_sampling_options_init(rt_sampling_options* options,
                                                  uint64_t struct_size);
/* One id from `vocabulary` finite logits. context (context_count ids below the vocabulary,
 * prompt first: prompt_length of them) feeds the penalties; mask is NULL or `vocabulary` bytes
 * (0: never drawn); draw_index numbers the seed's draws (a request's k-th token: k). Any rule
 * broken, named with its value (options NULL: greedy): RT_STATUS_INVALID_ARGUMENT, and *token
 * is untouched. */
RT_API rt_status RT_CALL rt_sample_f32_row(const float* logits, uint64_t vocabulary,
                                           const rt_sampling_options* options,
                                           const uint32_t* context, uint64_t context_count,
                                           uint64_t prompt_length, const uint8_t* mask,
                                           uint64_t draw_index, uint32_t* token);
/* 2.15, one batched step that samples on the library's side: what row i's sampler needs. */
#define RT_MAX_TOP_LOGPROBS 20
typedef struct rt_sampling_row {
    uint64_t struct_size;
    const rt_sampling_options* options; /* NULL: greedy */
    const uint32_t* context;            /* the penalties' ids, prompt first (NULL: none) */
    uint64_t context_count;
    uint64_t prompt_length;    /* <= context_count */
    const uint8_t* mask;       /* NULL, or vocabulary_limit bytes (0: never drawn) */
    uint64_t draw_index;       /* the request's k-th draw */
    uint64_t vocabulary_limit; /* sample and score ids below it (a padded vocabulary); 0: V */
    uint32_t sample;           /* 1: choose an id; 0: the row only feeds tokens */
    uint32_t log_probability;  /* 1: the chosen id's log-probability of the raw logits */
    uint32_t top_count;        /* most likely alternatives wanted, <= RT_MAX_TOP_LOGPROBS */
    uint32_t reserved;         /* must be 0 */
} rt_sampling_row;

/* rt_decode_sessions_step's batched step, then each row sampled by its rt_sampling_row, in
 * parallel over rows, the logits never copied out. Every row is checked (with
 * rt_sample_f32_row's rules, named "rows[i]") before the step runs, so a refused call changes
 * no session. Outputs, per row i: ids[i] (required); log_probabilities[i] (NULL unless some row
 * asks); top_ids / top_log_probabilities[i * RT_MAX_TOP_LOGPROBS + j] (NULL unless some row
 * asks); sampled[i]: 1 when an id was chosen, 0 for a feed-only row, 2 when the row's logits
 * were not all finite (the step still happened: the caller fails that request). */
RT_API rt_status RT_CALL rt_decode_sessions_step_sample(
    rt_decode_session* const* sessions, uint64_t session_count, const uint32_t* tokens,
    const uint64_t* token_counts, uint64_t token_total, const rt_sampling_row* rows, uint32_t* ids,
    uint8_t* sampled, double* log_probabilities, uint32_t* top_ids, double* top_log_probabilities);

/* The log-softmax of `vocabulary` finite logits at `token` (in double), and the top_count most
 * likely ids with theirs, most likely first (ties: the lower id first) into top_ids and
 * top_log_probabilities (each NULL only when top_count is 0). */
RT_API rt_status RT_CALL rt_f32_row_log_probabilities(const float* logits, uint64_t vocabulary,
                                                      uint32_t token, uint64_t top_count,
                                                      double* log_probability, uint32_t* top_ids,
                                                      double* top_log_probabilities);

/* ---- Parameter lists --------------------------------------------------------------------
 * Flat order: list order, then each tensor's row-major order. */
RT_API void RT_CALL rt_parameter_list_release(rt_parameter_list* list);
RT_API rt_status RT_CALL rt_parameter_list_count(const rt_parameter_list* list, uint64_t* out);
RT_API rt_status RT_CALL rt_parameter_list_backend(const rt_parameter_list* list,
                                                   int32_t* out_backend);
RT_API rt_status RT_CALL rt_parameter_list_name(const rt_parameter_list* list, uint64_t index,
                                                char* out, uint64_t capacity, uint64_t* required);
RT_API rt_status RT_CALL rt_parameter_list_rank(const rt_parameter_list* list, uint64_t index,
                                                uint64_t* out_rank);
RT_API rt_status RT_CALL rt_parameter_list_shape(const rt_parameter_list* list, uint64_t index,
                                                 uint64_t* out, uint64_t capacity,
                                                 uint64_t* required);
RT_API rt_status RT_CALL rt_parameter_list_numel(const rt_parameter_list* list, uint64_t index,
                                                 uint64_t* out_numel);
RT_API rt_status RT_CALL rt_parameter_list_total_numel(const rt_parameter_list* list,
                                                       uint64_t* out_numel);
RT_API rt_status RT_CALL rt_parameter_list_copy_to_host_f32(const rt_parameter_list* list,
                                                            float* out, uint64_t capacity,
                                                            uint64_t* required);
/* Transactional: count == total numel and every value finite, else nothing changes.
 * Rejected (RT_STATUS_RUNTIME_ERROR) while a variable or Adam optimizer of the model is
 * alive. Clears gradients and advances the model's parameter epoch. */
RT_API rt_status RT_CALL rt_parameter_list_load_from_host_f32(rt_parameter_list* list,
                                                              const float* values, uint64_t count);

/* ---- Autograd ---------------------------------------------------------------------------
 * Graphs are single-use: a successful backward consumes the graph (a second backward is
 * RT_STATUS_RUNTIME_ERROR), and an Adam step or parameter load makes every older graph fail
 * at backward with RT_STATUS_RUNTIME_ERROR. Values stay readable after either. */
RT_API void RT_CALL rt_variable_release(rt_variable* variable);
RT_API rt_status RT_CALL rt_variable_backend(const rt_variable* variable, int32_t* out_backend);
RT_API rt_status RT_CALL rt_variable_rank(const rt_variable* variable, uint64_t* out_rank);
RT_API rt_status RT_CALL rt_variable_shape(const rt_variable* variable, uint64_t* out,
                                           uint64_t capacity, uint64_t* required);
RT_API rt_status RT_CALL rt_variable_numel(const rt_variable* variable, uint64_t* out_numel);
RT_API rt_status RT_CALL rt_variable_copy_to_host_f32(const rt_variable* variable, float* out,
                                                      uint64_t capacity, uint64_t* required);
/* Scalar variables only (implicit seed 1); replaces the gradients of the parameters it
 * reaches. */
RT_API rt_status RT_CALL rt_variable_backward(rt_variable* variable);
/* 2.13: rt_variable_backward with the scalar seed `scale` (finite; 1 is rt_variable_backward
 * bit for bit) and, when accumulate is 1, gradients ADDED to the pending ones of the parameters
 * it reaches instead of replacing them (accumulate 0: replaced). Gradient accumulation:
 * backward each micro-batch's mean loss with scale = its share of the counted targets and
 * accumulate = 1, then one rt_adam_step. A scale that is not finite, or accumulate > 1:
 * RT_STATUS_INVALID_ARGUMENT; the graph rules are rt_variable_backward's. */
RT_API rt_status RT_CALL rt_variable_backward_scaled(rt_variable* variable, float scale,
                                                     uint32_t accumulate);
/* Mean cross-entropy of logits [..., V] against one target per leading position
 * (count == numel / V, every target < V) -> scalar variable. */
RT_API rt_status RT_CALL rt_cross_entropy(const rt_variable* logits, const uint32_t* targets,
                                          uint64_t count, rt_variable** out);
/* Mean cross-entropy of logits [B, T, V] over the same time slice
 * [time_offset, time_offset + time_count) of every row (B*time_count positions) -> scalar
 * variable of the same graph. targets hold one id per position, B*T of them row-major; all
 * are checked, only the slice's contribute, and backward gives the logits an exactly zero
 * gradient outside the slice. Logits of rank != 3, time_count == 0 or count != B*T:
 * RT_STATUS_INVALID_ARGUMENT; time_offset + time_count > T (no wraparound) or a target
 * >= V: RT_STATUS_OUT_OF_RANGE. One of the 2.5 (programmed family) additions: no version
 * change. */
RT_API rt_status RT_CALL rt_cross_entropy_time_range(const rt_variable* logits,
                                                     const uint32_t* targets, uint64_t count,
                                                     uint64_t time_offset, uint64_t time_count,
                                                     rt_variable** out);
/* Mean cross-entropy of logits [..., V] over the positions a mask selects (a response-only
 * loss): count targets (one per position, all checked < V) and mask_count == count flags,
 * each 0 or 1; the mean runs over the M flagged positions and backward gives the others an
 * exactly zero gradient. A count or mask_count mismatch, a flag > 1 or M == 0:
 * RT_STATUS_INVALID_ARGUMENT; a target >= V: RT_STATUS_OUT_OF_RANGE. An additive 2.9
 * function (the workflows issue). */
RT_API rt_status RT_CALL rt_cross_entropy_masked(const rt_variable* logits, const uint32_t* targets,
                                                 uint64_t count, const uint8_t* mask,
                                                 uint64_t mask_count, rt_variable** out);

/* ---- Programmed models (ABI 2.5 family; docs/ARCHITECTURE.md, 'Programmed models') -------
 * Multilinear maps are immutable output-major double tensors T[O, d_1, ..., d_k]; a
 * program-augmented model copies and lowers one at creation. The model's parameter lists,
 * variables and Adam optimizers follow the rt_model rules (pins, epochs, single-use graphs). */
typedef struct rt_multilinear_map rt_multilinear_map;
typedef struct rt_program_augmented_model rt_program_augmented_model;
typedef struct rt_representation_trace rt_representation_trace;

#define RT_PROGRAM_INPUT_WHOLE_SOURCE 0
#define RT_PROGRAM_INPUT_SOURCE_POSITION 1
#define RT_LOWERING_AUTO 0
#define RT_LOWERING_DENSE 1
#define RT_LOWERING_LINEAR 2
#define RT_LOWERING_LINEAR_ATTENTION 3
#define RT_LOWERING_UNSUPPORTED_REJECT 0
#define RT_LOWERING_UNSUPPORTED_DENSE_FALLBACK 1
#define RT_COEFFICIENT_PRECISION_EXACT 0
#define RT_COEFFICIENT_PRECISION_ROUNDED 1
#define RT_COEFFICIENT_INIT_COMPILED 0
#define RT_COEFFICIENT_INIT_RANDOM_UNIFORM 1

/* Dense: exactly O * prod(d_i) finite doubles. Sparse: `count` distinct flat output-major
 * indices with non-zero finite values (none: the zero map). O and every d_i > 0 (an arity of
 * 0 is a constant map); more than 2^24 elements is RT_STATUS_OVERFLOW, checked before any
 * allocation; an index past the elements is RT_STATUS_OUT_OF_RANGE; other rules
 * RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_multilinear_map_create_dense(uint64_t output_dimension,
                                                         const uint64_t* input_dimensions,
                                                         uint64_t arity, const double* values,
                                                         uint64_t count, rt_multilinear_map** out);
RT_API rt_status RT_CALL rt_multilinear_map_create_sparse(uint64_t output_dimension,
                                                          const uint64_t* input_dimensions,
                                                          uint64_t arity, const uint64_t* indices,
                                                          const double* values, uint64_t count,
                                                          rt_multilinear_map** out);
RT_API void RT_CALL rt_multilinear_map_release(rt_multilinear_map* map);
RT_API rt_status RT_CALL rt_multilinear_map_output_dimension(const rt_multilinear_map* map,
                                                             uint64_t* out);
RT_API rt_status RT_CALL rt_multilinear_map_arity(const rt_multilinear_map* map, uint64_t* out);
RT_API rt_status RT_CALL rt_multilinear_map_input_dimensions(const rt_multilinear_map* map,
                                                             uint64_t* out, uint64_t capacity,
                                                             uint64_t* required);
/* Every element, output-major (size-query protocol). */
RT_API rt_status RT_CALL rt_multilinear_map_values(const rt_multilinear_map* map, double* out,
                                                   uint64_t capacity, uint64_t* required);

typedef struct rt_program_augmented_model_config {
    uint64_t struct_size;
    uint64_t vocabulary_size;        /* init 512 */
    uint64_t context_length;         /* init 128: every forward takes exactly this many */
    uint64_t model_width;            /* init 64 */
    uint64_t head_count;             /* init 4 */
    uint64_t feed_forward_width;     /* init 256 */
    uint64_t attention_branch_count; /* init 2 */
    int32_t attention;               /* RT_ATTENTION_*, init materialized */
    uint32_t random_seed;            /* init 42 */
} rt_program_augmented_model_config;

typedef struct rt_program_input_layout {
    int32_t source;            /* RT_PROGRAM_INPUT_* */
    uint32_t reserved;         /* must be 0 */
    uint64_t position;         /* a span row (source_position); 0 for whole_source */
    uint64_t projection_group; /* equal groups share one learned projection */
} rt_program_input_layout;

typedef struct rt_program_branch_config {
    uint64_t struct_size;
    uint64_t source_offset;
    uint64_t source_length;
    uint64_t target_offset;
    uint64_t output_length;                /* init 1 */
    const rt_program_input_layout* inputs; /* one per map argument */
    uint64_t input_count;
    uint32_t input_projection_bias; /* 0 or 1, init 0 */
    uint32_t merge_bias;            /* 0 or 1, init 0 */
} rt_program_branch_config;

typedef struct rt_neural_lowering_options {
    uint64_t struct_size;
    int32_t strategy;                  /* RT_LOWERING_*, init auto */
    int32_t unsupported_policy;        /* RT_LOWERING_UNSUPPORTED_*, init reject */
    int32_t precision;                 /* RT_COEFFICIENT_PRECISION_*, init exact */
    int32_t initialization;            /* RT_COEFFICIENT_INIT_*, init compiled */
    float random_scale;                /* init 0.02 */
    uint32_t random_seed;              /* init 42 */
    uint32_t trainable;                /* 0 or 1, init 0: a frozen leaf, not a parameter */
    int32_t attention_query_axis;      /* -1 (init): unset, axis 1; else 1 or 2 */
    uint64_t max_coefficient_elements; /* init 2^24 */
} rt_neural_lowering_options;

typedef struct rt_program_steering {
    uint64_t input_index;
    uint64_t position;   /* a row of that input: a span row for whole_source, 0 otherwise */
    const float* scales; /* model_width values, or NULL with count 0 (identity) */
    uint64_t scale_count;
    const float* offsets; /* model_width values, or NULL with count 0 (zero) */
    uint64_t offset_count;
} rt_program_steering;

typedef struct rt_program_augmented_forward_options {
    uint64_t struct_size;
    uint32_t capture_representations;      /* 0 or 1, init 0 */
    uint32_t batch_roll_learned_attention; /* 0 or 1, init 0 */
    uint64_t batch_roll_shift;             /* init 1, > 0 */
    const rt_program_steering* steering;
    uint64_t steering_count;
    const uint64_t* ablated_program_inputs; /* unique input indices */
    uint64_t ablated_program_input_count;
    uint32_t ablate_program_output; /* 0 or 1, init 0 */
    uint32_t reserved;              /* must be 0 */
} rt_program_augmented_forward_options;

RT_API rt_status RT_CALL rt_program_augmented_model_config_init(
    rt_program_augmented_model_config* config, uint64_t struct_size);
RT_API rt_status RT_CALL rt_program_branch_config_init(rt_program_branch_config* config,
                                                       uint64_t struct_size);
RT_API rt_status RT_CALL rt_neural_lowering_options_init(rt_neural_lowering_options* options,
                                                         uint64_t struct_size);
RT_API rt_status RT_CALL rt_program_augmented_forward_options_init(
    rt_program_augmented_forward_options* options, uint64_t struct_size);
/* A new model on CPU. map, branch and lowering are all NULL (a learned-only model) or all
 * non-NULL (RT_STATUS_INVALID_ARGUMENT otherwise); the map is copied and lowered here. */
RT_API rt_status RT_CALL rt_program_augmented_model_create(
    const rt_program_augmented_model_config* config, const rt_multilinear_map* map,
    const rt_program_branch_config* branch, const rt_neural_lowering_options* lowering,
    rt_program_augmented_model** out);
RT_API void RT_CALL rt_program_augmented_model_release(rt_program_augmented_model* model);
RT_API rt_status RT_CALL rt_program_augmented_model_get_config(
    const rt_program_augmented_model* model, rt_program_augmented_model_config* out);
/* Transactional, as rt_model_to (rejected while a variable or optimizer pins the model). */
RT_API rt_status RT_CALL rt_program_augmented_model_to(rt_program_augmented_model* model,
                                                       int32_t backend);
RT_API rt_status RT_CALL rt_program_augmented_model_backend(const rt_program_augmented_model* model,
                                                            int32_t* out_backend);
/* clang-format off */
RT_API rt_status RT_CALL rt_program_augmented_model_has_program(
    const rt_program_augmented_model* model, int32_t* out);
/* clang-format on */
RT_API rt_status RT_CALL rt_program_augmented_model_parameters(rt_program_augmented_model* model,
                                                               rt_parameter_list** out);
/* tokens [batch, context_length] -> logits variable [batch, T, V]; options may be NULL (the
 * defaults). out_trace must be non-NULL exactly when options->capture_representations is 1
 * (RT_STATUS_INVALID_ARGUMENT otherwise); it then receives an owning trace. */
RT_API rt_status RT_CALL rt_program_augmented_model_forward(
    rt_program_augmented_model* model, const uint32_t* tokens, uint64_t count, uint64_t batch,
    const rt_program_augmented_forward_options* options, rt_variable** out_logits,
    rt_representation_trace** out_trace);

/* Traces own detached host copies: they outlive the model and the graph. */
RT_API void RT_CALL rt_representation_trace_release(rt_representation_trace* trace);
RT_API rt_status RT_CALL rt_representation_trace_count(const rt_representation_trace* trace,
                                                       uint64_t* out);
RT_API rt_status RT_CALL rt_representation_trace_name(const rt_representation_trace* trace,
                                                      uint64_t index, char* out, uint64_t capacity,
                                                      uint64_t* required);
/* The index of `name` (NUL-terminated); RT_STATUS_OUT_OF_RANGE when absent. */
RT_API rt_status RT_CALL rt_representation_trace_find(const rt_representation_trace* trace,
                                                      const char* name, uint64_t* out_index);
RT_API rt_status RT_CALL rt_representation_trace_rank(const rt_representation_trace* trace,
                                                      uint64_t index, uint64_t* out_rank);
RT_API rt_status RT_CALL rt_representation_trace_shape(const rt_representation_trace* trace,
                                                       uint64_t index, uint64_t* out,
                                                       uint64_t capacity, uint64_t* required);
RT_API rt_status RT_CALL rt_representation_trace_numel(const rt_representation_trace* trace,
                                                       uint64_t index, uint64_t* out_numel);
RT_API rt_status RT_CALL rt_representation_trace_copy_f32(const rt_representation_trace* trace,
                                                          uint64_t index, float* out,
                                                          uint64_t capacity, uint64_t* required);

/* ---- Adam ------------------------------------------------------------------------------- */
typedef struct rt_adam rt_adam;

#define RT_ADAM_STATE_CONTIGUOUS 0
#define RT_ADAM_STATE_PAGED 1

/* rt_adam_options.schedule (2.13): the rate of step t (1-based) is learning_rate * factor(t).
 * CONSTANT: 1 (warmup_steps, total_steps and minimum_fraction must be 0). With W =
 * warmup_steps, T = total_steps > W and f = minimum_fraction in [0, 1]: t <= W: t / W; t > T:
 * f; between, WARMUP_COSINE: f + (1 - f) * (1 + cos(pi (t - W) / (T - W))) / 2 and
 * WARMUP_LINEAR: f + (1 - f) * (1 - (t - W) / (T - W)). */
#define RT_LEARNING_RATE_SCHEDULE_CONSTANT 0
#define RT_LEARNING_RATE_SCHEDULE_WARMUP_COSINE 1
#define RT_LEARNING_RATE_SCHEDULE_WARMUP_LINEAR 2

typedef struct rt_adam_options {
    uint64_t struct_size;        /* >= 32 (the 2.3 prefix ends at reserved) */
    float learning_rate;         /* init 1e-3, finite > 0 */
    float beta1;                 /* init 0.9, in (0, 1) */
    float beta2;                 /* init 0.999, in (0, 1) */
    float epsilon;               /* init 1e-8, finite > 0 */
    float maximum_gradient_norm; /* init 1.0, > 0 (+inf disables clipping) */
    uint32_t reserved;           /* must be 0 */
    /* 2.4 */
    int32_t state_storage; /* init RT_ADAM_STATE_CONTIGUOUS */
    uint32_t reserved2;    /* must be 0 */
    uint64_t page_size;    /* elements per moment page, > 0; init 4096 */
    /* 2.13 (a 48-byte struct leaves these at their init values) */
    double weight_decay;     /* AdamW's decoupled decay, finite >= 0; init 0 (plain Adam) */
    int32_t schedule;        /* RT_LEARNING_RATE_SCHEDULE_*; init CONSTANT */
    uint32_t reserved3;      /* must be 0 */
    uint64_t warmup_steps;   /* init 0 */
    uint64_t total_steps;    /* init 0 */
    double minimum_fraction; /* init 0 */
} rt_adam_options;

typedef struct rt_adam_step_stats {
    uint64_t struct_size;
    uint64_t step;        /* the step count after this update */
    double gradient_norm; /* global norm before clipping */
    double clip_scale;    /* factor applied to every gradient (1 when not clipped) */
    /* 2.13 (written when struct_size covers it) */
    double learning_rate; /* the scheduled rate this step used */
} rt_adam_step_stats;

typedef struct rt_adam_state {
    uint64_t struct_size;
    uint64_t step_count;
    double beta1_power; /* beta1^step_count */
    double beta2_power;
    uint64_t value_count; /* N: scalars of all parameters (each array below holds N floats) */
} rt_adam_state;

RT_API rt_status RT_CALL rt_adam_options_init(rt_adam_options* options, uint64_t struct_size);
/* options == NULL means the defaults. The list's parameters are copied (the optimizer keeps
 * the model state alive). Pins the model: rt_model_to and parameter loads are rejected while
 * the optimizer lives. */
RT_API rt_status RT_CALL rt_adam_create(const rt_parameter_list* parameters,
                                        const rt_adam_options* options, rt_adam** out);
RT_API void RT_CALL rt_adam_release(rt_adam* adam);
RT_API rt_status RT_CALL rt_adam_backend(const rt_adam* adam, int32_t* out_backend);
RT_API rt_status RT_CALL rt_adam_step_count(const rt_adam* adam, uint64_t* out_count);
RT_API rt_status RT_CALL rt_adam_parameter_count(const rt_adam* adam, uint64_t* out_count);
RT_API rt_status RT_CALL rt_adam_state_storage(const rt_adam* adam, int32_t* out_storage);
RT_API rt_status RT_CALL rt_adam_state_page_size(const rt_adam* adam, uint64_t* out_page_size);
RT_API rt_status RT_CALL rt_adam_state_page_count(const rt_adam* adam, uint64_t* out_page_count);
RT_API rt_status RT_CALL rt_adam_state_payload_bytes(const rt_adam* adam, uint64_t* out_bytes);
/* One transactional update; advances the model's parameter epoch. A parameter without a
 * pending gradient (backward did not reach it, or none ran since the last step) takes a zero
 * gradient: its moments decay and it still moves while they are non-zero. stats may be NULL;
 * when given, stats->struct_size must be set. */
RT_API rt_status RT_CALL rt_adam_step(rt_adam* adam, rt_adam_step_stats* stats);
RT_API rt_status RT_CALL rt_adam_zero_gradients(rt_adam* adam);
/* Logical state for exact resume (needs a clean step boundary: no pending gradients). */
RT_API rt_status RT_CALL rt_adam_state_get(const rt_adam* adam, rt_adam_state* out_state);
/* Copies parameter values and both moments (N floats each; capacity >= N, else
 * RT_STATUS_OUT_OF_RANGE with nothing written). */
RT_API rt_status RT_CALL rt_adam_state_copy_to_host_f32(const rt_adam* adam, float* values,
                                                        float* first_moments, float* second_moments,
                                                        uint64_t capacity);
/* Transactional restore (count == N). Rejected (RT_STATUS_RUNTIME_ERROR) while a variable of
 * the model is alive. Advances the model's parameter epoch. */
RT_API rt_status RT_CALL rt_adam_state_load_from_host_f32(rt_adam* adam, const rt_adam_state* state,
                                                          const float* values,
                                                          const float* first_moments,
                                                          const float* second_moments,
                                                          uint64_t count);

/* ---- Llama / Mistral decoders (2.8) and GGUF checkpoints --------------------------------
 * A Llama/Mistral model (docs/ARCHITECTURE.md, 'The decoder'): token embedding, pre-norm
 * blocks of grouped-query attention with split-half RoPE and a SwiGLU feed-forward, RMSNorm, a
 * bias-free head or tied embeddings; Mistral's sliding window may be shorter than the context
 * (flash, materialized and cached decoding all apply it; a decode pool holds the Hkv key/value
 * heads, which the query heads of a group share). Parameters are named
 * token_embedding.weight, blocks.N.attention_norm.scale,
 * blocks.N.attention.{query,key,value,output}.weight, blocks.N.feed_forward_norm.scale,
 * blocks.N.feed_forward.{gate,up,down}.weight, final_norm.scale, language_model_head.weight
 * (absent when tied).
 * rt_llama_mistral_model_as_model gives an rt_model handle on the SAME model state, through
 * which every rt_model function works (forward, attention and checkpointing policies, LoRA on
 * every projection, NF4, packed state, decode sessions and pools, Adam, parameters); only
 * rt_model_config is the GPT decoder's and answers RT_STATUS_INVALID_ARGUMENT there. */
#define RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA 0
#define RT_LLAMA_MISTRAL_ARCHITECTURE_MISTRAL 1
/* 2.10: the other rotary families, each the decoder with its choices (rt_llama_mistral_config_
 * preset sets them); 2.11: Gemma 2 (attention-logit and final-logit soft-capping). */
#define RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2 2
#define RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN3 3
#define RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA2 4
#define RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA3 5
#define RT_LLAMA_MISTRAL_ARCHITECTURE_PHI3 6
#define RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2 7 /* 2.12 */
/* rt_llama_mistral_config.positions, .norm, .feed_forward (2.12) */
#define RT_POSITIONS_ROTARY 0  /* RoPE inside attention */
#define RT_POSITIONS_LEARNED 1 /* a learned [C,D] table added to the token embedding (GPT-2) */
#define RT_NORM_RMS 0
#define RT_NORM_LAYER 1         /* LayerNorm with scale and bias (GPT-2) */
#define RT_FEED_FORWARD_GATED 0 /* gate/up/down with feed_forward_activation */
#define RT_FEED_FORWARD_PLAIN 1 /* expand/project with plain_activation (GPT-2) */
/* rt_llama_mistral_config.feed_forward_activation (2.10) */
#define RT_GATED_ACTIVATION_SILU 0      /* SwiGLU */
#define RT_GATED_ACTIVATION_GELU_TANH 1 /* GeGLU (Gemma) */
/* rt_llama_mistral_config.rope_scaling (2.10) */
#define RT_ROPE_SCALING_NONE 0
#define RT_ROPE_SCALING_LINEAR 1 /* frequencies divided by rope_scaling_factor */
#define RT_ROPE_SCALING_LLAMA3 2 /* Llama 3.1's piecewise rule */
/* per-frequency divisors (a GGUF file's rope_freqs.weight); given with rope_frequency_factors
 * from 2.11 */
#define RT_ROPE_SCALING_FREQUENCY_FACTORS 3
#define RT_ROPE_SCALING_YARN 4 /* 2.11: YaRN (nn/rotary_embedding.hpp), Qwen 2.5/3 long context */
typedef struct rt_llama_mistral_model rt_llama_mistral_model;
typedef struct rt_llama_mistral_config {
    uint64_t struct_size;
    int32_t architecture;          /* init RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA */
    uint32_t random_seed;          /* init 5489 */
    uint64_t vocabulary_size;      /* V, init 0 (must be set) */
    uint64_t maximum_context;      /* C, init 0 */
    uint64_t model_width;          /* D, init 0; D % Hq == 0 and D/Hq even */
    uint64_t query_head_count;     /* Hq, init 0 */
    uint64_t key_value_head_count; /* Hkv, init 0; Hq % Hkv == 0 */
    uint64_t block_count;          /* N, init 0 */
    uint64_t feed_forward_width;   /* F, init 0 */
    float rms_norm_epsilon;        /* init 1e-5 */
    uint32_t tie_embeddings;       /* 0 or 1, init 0 */
    double rope_theta;             /* init 10000 */
    uint64_t sliding_window;       /* 0 = none (init); a window >= C is dense attention */
    /* 2.10: the family choices; every init value is Llama's (nn/model headers give the rules). */
    uint64_t head_width;              /* d, 0 = D/Hq (init); even */
    uint32_t query_key_value_bias;    /* 0/1: biases on q, k, v (Qwen 2) */
    uint32_t query_key_norm;          /* 0/1: RMSNorm over each head of q and k (Qwen 3, Gemma 3) */
    uint32_t norm_weight_offset;      /* 0/1: RMSNorm as x^(1 + w) (Gemma) */
    uint32_t post_block_norms;        /* 0/1: post-attention and post-FFN norms (Gemma) */
    int32_t feed_forward_activation;  /* RT_GATED_ACTIVATION_*, init SILU */
    float embedding_scale;            /* 0 = none (init); Gemma sqrt(D) */
    float attention_scale;            /* 0 = 1/sqrt(d) (init) */
    int32_t rope_scaling;             /* RT_ROPE_SCALING_*, init NONE */
    uint64_t sliding_window_period;   /* p: layer i dense when (i+1) % p == 0; 0 = every layer */
    double rope_local_theta;          /* RoPE base of windowed layers, 0 = rope_theta (init) */
    double rope_scaling_factor;       /* LINEAR, LLAMA3, YARN; init 1 */
    double rope_low_frequency_factor; /* LLAMA3; init 1 */
    double rope_high_frequency_factor; /* LLAMA3; init 4 */
    uint64_t rope_original_context;    /* LLAMA3, YARN; init 8192 */
    /* 2.11: Gemma 2's soft caps c (scores or logits z become c*tanh(z/c)); 0 = none (init). */
    float attention_logit_softcap; /* every attention score (Gemma 2: 50) */
    float final_logit_softcap;     /* the logits (Gemma 2: 30) */
    /* 2.11: YaRN (RT_ROPE_SCALING_YARN, with rope_scaling_factor and rope_original_context). */
    double rope_yarn_beta_fast;        /* init 32; > beta_slow */
    double rope_yarn_beta_slow;        /* init 1; > 0 */
    double rope_yarn_attention_factor; /* cos/sin factor m, 0 = 0.1*ln(factor) + 1 (init) */
    /* 2.11: RT_ROPE_SCALING_FREQUENCY_FACTORS' head_width/2 divisors (GGUF's rope_freqs.weight):
     * read by create when that kind is given (NULL and 0 otherwise, init); written by
     * rt_llama_mistral_model_config pointing into the model, valid until it is released. */
    const float* rope_frequency_factors;
    uint64_t rope_frequency_factor_count;
    /* 2.12: the GPT-2 choices; every init value is Llama's. */
    int32_t positions;          /* RT_POSITIONS_*, init ROTARY */
    int32_t norm;               /* RT_NORM_*, init RMS */
    int32_t feed_forward;       /* RT_FEED_FORWARD_GATED/PLAIN, init GATED */
    int32_t plain_activation;   /* RT_FEED_FORWARD_ACTIVATION_* of the plain one, init GELU */
    uint32_t output_bias;       /* 0/1: a bias on the attention output projection */
    uint32_t feed_forward_bias; /* 0/1: biases on every feed-forward projection */
    uint32_t head_bias;         /* 0/1: a bias on the untied head (not read while tied) */
    uint32_t reserved;          /* must be 0 */
} rt_llama_mistral_config;

RT_API rt_status RT_CALL rt_llama_mistral_config_init(rt_llama_mistral_config* config,
                                                      uint64_t struct_size);
/* 2.10: sets config->architecture and the family's choices over the dimensions already in
 * *config (Qwen 2: q/k/v biases; Qwen 3: QK-norm; Gemma 2 (2.11): (1 + w) norms, post-block
 * norms, GeGLU, embedding scale sqrt(D), window period 2 (with a sliding_window), soft caps 50
 * and 30 unless set; Gemma 3: QK-norm, (1 + w) norms, post-block
 * norms, GeGLU, embedding scale sqrt(D), window period 6 (with a sliding_window) and local RoPE
 * base 10000 unless set;
 * Llama, Mistral, Phi-3: none; GPT-2 (2.12): learned positions, LayerNorm, the plain
 * feed-forward with tanh-GELU, biases on q/k/v, output, feed-forward and head). The struct must
 * declare at least the 2.10 size (184 bytes; a 2.10-sized struct gets every choice but the soft
 * caps), and the 2.12 size (264 bytes) for GPT-2; an unknown architecture, or GPT-2 in a smaller
 * struct: RT_STATUS_INVALID_ARGUMENT, *config unchanged. */
RT_API rt_status RT_CALL rt_llama_mistral_config_preset(rt_llama_mistral_config* config,
                                                        int32_t architecture);
/* A new model on CPU with random weights (draws: embedding; the position table with learned
 * positions; per block q, k, v, o, then gate, up, down (gated) or expand, project (plain);
 * head), materialized attention, checkpointing disabled. */
RT_API rt_status RT_CALL rt_llama_mistral_model_create(const rt_llama_mistral_config* config,
                                                       rt_llama_mistral_model** out);
/* A model read from a GGUF file (general.architecture llama, mistral, qwen2, qwen3, gemma3 or
 * phi3 (2.10), gemma2 (2.11); every weight
 * dequantized to float32; llama.cpp's RoPE row permutation of Q/K undone), on CPU with flash
 * attention. maximum_context 0
 * takes the file's context_length. A malformed or unsupported file is
 * RT_STATUS_RUNTIME_ERROR naming the field; an unreadable one too. */
RT_API rt_status RT_CALL rt_llama_mistral_model_load_gguf(const char* path,
                                                          uint64_t maximum_context,
                                                          rt_llama_mistral_model** out);
/* As rt_llama_mistral_model_load_gguf, but every projection keeps the file's block format
 * (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, F16 or BF16: the file's bytes, never expanded to
 * float32; an embedding table in one of them stays packed too; the norms are float32), as if packed
 * by rt_model_quantize_linear_weights (2.15). A projection of any other type:
 * RT_STATUS_INVALID_ARGUMENT naming the tensor and its type. */
RT_API rt_status RT_CALL rt_llama_mistral_model_load_gguf_packed(const char* path,
                                                                 uint64_t maximum_context,
                                                                 rt_llama_mistral_model** out);
RT_API void RT_CALL rt_llama_mistral_model_release(rt_llama_mistral_model* model);
RT_API rt_status RT_CALL rt_llama_mistral_model_config(const rt_llama_mistral_model* model,
                                                       rt_llama_mistral_config* out);
RT_API rt_status RT_CALL rt_llama_mistral_model_to(rt_llama_mistral_model* model, int32_t backend);
RT_API rt_status RT_CALL rt_llama_mistral_model_backend(const rt_llama_mistral_model* model,
                                                        int32_t* out_backend);
/* As rt_model_forward. */
RT_API rt_status RT_CALL rt_llama_mistral_model_forward(rt_llama_mistral_model* model,
                                                        const uint32_t* tokens, uint64_t count,
                                                        uint64_t batch, uint64_t time,
                                                        rt_variable** out);
RT_API rt_status RT_CALL rt_llama_mistral_model_parameters(rt_llama_mistral_model* model,
                                                           rt_parameter_list** out);
/* An rt_model handle sharing this model's state (release both, in any order). */
RT_API rt_status RT_CALL rt_llama_mistral_model_as_model(rt_llama_mistral_model* model,
                                                         rt_model** out);
/* 1 when the rt_model handle was made as a Llama/Mistral decoder (rt_llama_mistral_model_*),
 * 0 when by rt_model_create (both are the one decoder). */
RT_API rt_status RT_CALL rt_model_is_llama_mistral(const rt_model* model, int32_t* out);
/* 2.12: the general configuration of any rt_model's decoder, the GPT decoder of rt_model_create
 * included (its architecture GPT2; random_seed as created); rope_frequency_factors point into the
 * model. A program-augmented model: RT_STATUS_INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_model_decoder_config(const rt_model* model,
                                                 rt_llama_mistral_config* out);

/* 2.12: the one architecture table (interchange/checkpoint_names.hpp). The name of the tensor
 * that holds our parameter `parameter` (NUL-terminated, e.g. "blocks.3.attention.query.weight")
 * in `format`'s checkpoints of `architecture` (RT_LLAMA_MISTRAL_ARCHITECTURE_*),
 * NUL-terminated into out (size-query protocol), and *out_part its index in a fused tensor
 * (q, k, v or gate, up order; -1: the whole tensor). alternative 0 is the format's usual
 * layout, 1 a second one it allows (Phi-3 GGUF files with fused attn_qkv / ffn_up): no such
 * alternative for the parameter is RT_STATUS_OUT_OF_RANGE. An unknown architecture or format,
 * GPT-2 from GGUF, or a name that is not a parameter of the architecture:
 * RT_STATUS_INVALID_ARGUMENT. GPT-2's Hugging Face names omit the optional "transformer."
 * prefix. */
#define RT_CHECKPOINT_FORMAT_GGUF 0
#define RT_CHECKPOINT_FORMAT_HUGGING_FACE 1
RT_API rt_status RT_CALL rt_checkpoint_tensor_name(int32_t architecture, int32_t format,
                                                   const char* parameter, uint32_t alternative,
                                                   char* out, uint64_t capacity, uint64_t* required,
                                                   int32_t* out_part);

/* ---- Tokenizers of pretrained models ------------------------------------------------------
 * Byte-level BPE in the GPT-2 style (merges by rank inside regex pre-tokens: the GPT-2,
 * Llama 3 and SmolLM patterns) and SentencePiece-style BPE with byte fallback (Llama 2,
 * Mistral). Special and added tokens are cut out of the text before BPE and never merged.
 * Text in and out is UTF-8 bytes (decode may end inside a character: a streaming caller
 * joins pieces before decoding them as UTF-8). */
#define RT_PRETRAINED_MODEL_BYTE_LEVEL_BPE 0
#define RT_PRETRAINED_MODEL_SENTENCEPIECE_BPE 1
#define RT_PRETOKENIZER_GPT2 0
#define RT_PRETOKENIZER_LLAMA3 1
#define RT_PRETOKENIZER_SMOLLM 2
#define RT_PRETOKENIZER_QWEN2 3     /* 2.10: Qwen 2/2.5/3 (Llama 3's pattern, single digits) */
#define RT_SPECIAL_TOKENS_PARSE 0   /* control and added tokens in the text become their ids */
#define RT_SPECIAL_TOKENS_AS_TEXT 1 /* control token text is tokenized as plain text */
typedef struct rt_pretrained_tokenizer rt_pretrained_tokenizer;
/* A vocabulary as plain arrays (from tokenizer.json, say). Strings are UTF-8, packed end to end
 * in *_bytes with count + 1 offsets (offsets[0] = 0, offsets[count] = total bytes); merges are
 * "left right" strings. token_types (1 normal .. 6 byte, GGUF's values) and scores may be NULL;
 * an id field < 0 means none. */
typedef struct rt_pretrained_vocabulary {
    uint64_t struct_size;
    int32_t model;        /* RT_PRETRAINED_MODEL_* */
    int32_t pretokenizer; /* RT_PRETOKENIZER_* (byte-level BPE only) */
    uint64_t token_count;
    const uint8_t* token_bytes;
    const uint64_t* token_offsets;
    const int32_t* token_types;
    const float* scores;
    uint64_t merge_count;
    const uint8_t* merge_bytes;
    const uint64_t* merge_offsets;
    int64_t bos_id;
    int64_t eos_id;
    int64_t unknown_id;
    uint32_t ignore_merges;    /* 0 or 1 */
    uint32_t add_dummy_prefix; /* 0 or 1 (SentencePiece) */
} rt_pretrained_vocabulary;

RT_API rt_status RT_CALL rt_pretrained_tokenizer_create(const rt_pretrained_vocabulary* vocabulary,
                                                        rt_pretrained_tokenizer** out);
/* The tokenizer of a GGUF file's metadata (tokenizer.ggml.*). */
RT_API rt_status RT_CALL rt_pretrained_tokenizer_load_gguf(const char* path,
                                                           rt_pretrained_tokenizer** out);
RT_API void RT_CALL rt_pretrained_tokenizer_release(rt_pretrained_tokenizer* tokenizer);
RT_API rt_status RT_CALL
rt_pretrained_tokenizer_vocabulary_size(const rt_pretrained_tokenizer* tokenizer, uint64_t* out);
/* bos, eos and unknown ids; -1 when the vocabulary has none. */
RT_API rt_status RT_CALL
rt_pretrained_tokenizer_special_ids(const rt_pretrained_tokenizer* tokenizer, int64_t* out_bos,
                                    int64_t* out_eos, int64_t* out_unknown);
/* Variable-size outputs (docs/ARCHITECTURE.md, 'The C ABI'): ids of UTF-8 text; bytes of ids; the
 * bytes of one token as it decodes inside a sequence (for streaming); the vocabulary string of one
 * token. */
RT_API rt_status RT_CALL rt_pretrained_tokenizer_encode(const rt_pretrained_tokenizer* tokenizer,
                                                        const char* text, uint64_t length,
                                                        int32_t special, uint32_t* out,
                                                        uint64_t capacity, uint64_t* required);
RT_API rt_status RT_CALL rt_pretrained_tokenizer_decode(const rt_pretrained_tokenizer* tokenizer,
                                                        const uint32_t* ids, uint64_t count,
                                                        uint8_t* out, uint64_t capacity,
                                                        uint64_t* required);
RT_API rt_status RT_CALL
rt_pretrained_tokenizer_token_bytes(const rt_pretrained_tokenizer* tokenizer, uint32_t id,
                                    uint8_t* out, uint64_t capacity, uint64_t* required);
RT_API rt_status RT_CALL
rt_pretrained_tokenizer_token_text(const rt_pretrained_tokenizer* tokenizer, uint32_t id,
                                   uint8_t* out, uint64_t capacity, uint64_t* required);
/* What rebuilds an identical tokenizer through rt_pretrained_tokenizer_create (artifacts
 * persist it): the scalar fields, and each array as bytes (the variable-size output protocol).
 * Parts: TOKENS and MERGES are strings, each as a little-endian uint32 byte length then its bytes;
 * TOKEN_TYPES int32 values and SCORES float32 values, little-endian (SCORES empty when the
 * vocabulary has none). */
#define RT_PRETRAINED_PART_TOKENS 0
#define RT_PRETRAINED_PART_MERGES 1
#define RT_PRETRAINED_PART_TOKEN_TYPES 2
#define RT_PRETRAINED_PART_SCORES 3
typedef struct rt_pretrained_tokenizer_info {
    uint64_t struct_size;
    int32_t model;
    int32_t pretokenizer; /* -1 for SentencePiece */
    uint64_t token_count;
    uint64_t merge_count;
    int64_t bos_id;
    int64_t eos_id;
    int64_t unknown_id;
    uint32_t ignore_merges;
    uint32_t add_dummy_prefix;
} rt_pretrained_tokenizer_info;
RT_API rt_status RT_CALL rt_pretrained_tokenizer_info_get(const rt_pretrained_tokenizer* tokenizer,
                                                          rt_pretrained_tokenizer_info* out);
RT_API rt_status RT_CALL rt_pretrained_tokenizer_export(const rt_pretrained_tokenizer* tokenizer,
                                                        int32_t part, uint8_t* out,
                                                        uint64_t capacity, uint64_t* required);
/* The id whose vocabulary string is exactly the given bytes, or -1. */
RT_API rt_status RT_CALL rt_pretrained_tokenizer_find_token(
    const rt_pretrained_tokenizer* tokenizer, const char* text, uint64_t length, int64_t* out);

/* ---- GGUF metadata ------------------------------------------------------------------------
 * A string value of a GGUF file's metadata (e.g. tokenizer.chat_template, general.name), or
 * *present = 0 when the key is absent (then out is untouched and *required is 0). Another type
 * under the key is RT_STATUS_RUNTIME_ERROR naming it. */
RT_API rt_status RT_CALL rt_gguf_metadata_string(const char* path, const char* key,
                                                 int32_t* present, uint8_t* out, uint64_t capacity,
                                                 uint64_t* required);

/* ---- Parameters from checkpoint bytes -----------------------------------------------------
 * Loads parameter `index` of the list from `byte_count` bytes holding its numel values,
 * row-major, little-endian, of type `dtype`, converted exactly to float32: F32 bit for bit,
 * F16 exactly (subnormals become normal floats, +-inf stays, a NaN keeps its sign and payload
 * as mantissa << 13), BF16 as its bits << 16. Non-finite values are loaded as they are (unlike
 * rt_parameter_list_load_from_host_f32): whether a checkpoint may hold them is the caller's
 * decision. Errors, each naming what it checks: a NULL list or an unknown dtype or bytes NULL
 * with byte_count > 0 or byte_count != numel * element size (4, 2, 2; the message names the
 * index, parameter, dtype and both sizes) is RT_STATUS_INVALID_ARGUMENT; an index past the
 * list is RT_STATUS_OUT_OF_RANGE; a live variable, Adam optimizer or decode session of the
 * model is RT_STATUS_RUNTIME_ERROR. Transactional for that parameter (nothing changes on any
 * failure); on success clears its gradient and advances the model's parameter epoch. */
#define RT_DTYPE_F32 0
#define RT_DTYPE_F16 1
#define RT_DTYPE_BF16 2
RT_API rt_status RT_CALL rt_parameter_list_load_from_bytes(rt_parameter_list* list, uint64_t index,
                                                           int32_t dtype, const uint8_t* bytes,
                                                           uint64_t byte_count);

/* ---- Data parallelism over MPI (RIFTCO_TRANSFORMER_ENABLE_MPI=ON builds) -----------------
 * A process group is the world of the current `mpirun -n R` launch. Every collective has a
 * deadline (timeout_ms): when one has not returned in time (a rank died, stopped or runs a
 * different program) the rank prints which collective timed out and exits with status 3, and
 * the launcher ends the other ranks. An MPI error is RT_STATUS_RUNTIME_ERROR; the group is
 * then broken, and at exit the process ends the MPI job (MPI_Abort) instead of waiting.
 * Builds without MPI: rt_distributed_compiled_in reports 0 and rt_process_group_create is
 * RT_STATUS_RUNTIME_ERROR saying "not compiled in"; rt_process_group_create_single (a world of
 * one, every collective an identity) works in every build. */
typedef struct rt_process_group rt_process_group;
RT_API rt_status RT_CALL rt_distributed_compiled_in(int32_t* out);
/* timeout_ms > 0 (else RT_STATUS_INVALID_ARGUMENT). MPI is initialised on first use. */
RT_API rt_status RT_CALL rt_process_group_create(uint64_t timeout_ms, rt_process_group** out);
RT_API rt_status RT_CALL rt_process_group_create_single(rt_process_group** out);
RT_API void RT_CALL rt_process_group_release(rt_process_group* group);
RT_API rt_status RT_CALL rt_process_group_rank(const rt_process_group* group, int32_t* out);
RT_API rt_status RT_CALL rt_process_group_world_size(const rt_process_group* group, int32_t* out);
RT_API rt_status RT_CALL rt_process_group_barrier(rt_process_group* group);
/* In place: the elementwise sum over ranks (count equal on every rank). */
RT_API rt_status RT_CALL rt_process_group_allreduce_sum_f64(rt_process_group* group, double* values,
                                                            uint64_t count);
/* root's bytes into every rank's buffer; root outside [0, world) is INVALID_ARGUMENT. */
RT_API rt_status RT_CALL rt_process_group_broadcast_bytes(rt_process_group* group, uint8_t* bytes,
                                                          uint64_t count, int32_t root);
/* Every rank's value in rank order, through the (out, capacity, required) protocol. */
RT_API rt_status RT_CALL rt_process_group_allgather_u64(rt_process_group* group, uint64_t value,
                                                        uint64_t* out, uint64_t capacity,
                                                        uint64_t* required);
/* Gradient buckets of at most `bucket_bytes` (>= 4; default 16 MiB). */
RT_API rt_status RT_CALL rt_process_group_set_bucket_bytes(rt_process_group* group,
                                                           uint64_t bucket_bytes);
/* Bytes moved through this group's collectives so far, and the seconds spent in them. */
RT_API rt_status RT_CALL rt_process_group_communication(const rt_process_group* group,
                                                        uint64_t* out_bytes, double* out_seconds);
/* Checks that every rank's list has the same names and shapes (else RT_STATUS_RUNTIME_ERROR
 * on every rank, naming the first differing rank), then loads rank 0's values everywhere.
 * Advances the model's parameter epoch on ranks other than 0. */
RT_API rt_status RT_CALL rt_data_parallel_synchronize_parameters(rt_process_group* group,
                                                                 rt_parameter_list* list);
/* Replaces every trainable parameter's gradient g_r by sum_r(w_r g_r) / sum_r(w_r), where w_r =
 * local_weight is this rank's share of the global batch (its counted targets): the gradient
 * of the global batch's mean loss on every rank. local_weight finite and >= 0 (else
 * INVALID_ARGUMENT); weights summing to 0 is RT_STATUS_RUNTIME_ERROR. out_total_weight may be
 * NULL. */
RT_API rt_status RT_CALL rt_data_parallel_reduce_gradients(rt_process_group* group,
                                                           rt_parameter_list* list,
                                                           double local_weight,
                                                           double* out_total_weight);
/* 2.14: rt_data_parallel_reduce_gradients overlapped with backward: runs the backward of the
 * one-element `loss` (seed seed_scale, finite; accumulate 0 replaces gradients, 1 adds) and
 * averages the list's gradients while backward still runs (each bucket starts its
 * non-blocking allreduce once backward has finished all its gradients), with the same
 * buckets and collectives as rt_data_parallel_reduce_gradients, so the result is
 * bit-identical to rt_variable_backward_scaled followed by it. The graph rules of
 * rt_variable_backward apply (single use, parameter epoch); loss and list must come from
 * the same model (INVALID_ARGUMENT). */
RT_API rt_status RT_CALL rt_data_parallel_backward_and_reduce(
    rt_process_group* group, rt_parameter_list* list, rt_variable* loss, double local_weight,
    float seed_scale, uint32_t accumulate, double* out_total_weight);
/* 2.14, ZeRO-1: an Adam whose moments are sharded over the ranks of `group` (every rank
 * passes the same list; whole parameters, largest first to the least-loaded rank). It is an
 * rt_adam like any other, except that rt_adam_step, rt_adam_state_get,
 * rt_adam_state_copy_to_host_f32 and rt_adam_state_load_from_host_f32 are collectives (every
 * rank calls them, in the same order): a step clips with the global gradient norm, updates
 * this rank's share and gathers every value; the state functions speak the whole list's
 * logical state, so a state moves between world sizes and to or from an unsharded rt_adam.
 * Creation is collective too. The optimizer keeps the group alive. rt_adam_state_payload_bytes
 * and rt_adam_state_page_count report this rank's share. */
RT_API rt_status RT_CALL rt_adam_create_sharded(rt_process_group* group,
                                                const rt_parameter_list* parameters,
                                                const rt_adam_options* options, rt_adam** out);
/* The moment bytes this process holds, and what an unsharded optimizer holds (2·N·4). */
RT_API rt_status RT_CALL rt_adam_sharded_state_bytes(const rt_adam* adam, uint64_t* out_held_bytes,
                                                     uint64_t* out_unsharded_bytes);
/* A 64-bit FNV-1a hash of the list's values (replica checks). */
RT_API rt_status RT_CALL rt_data_parallel_parameter_hash(const rt_parameter_list* list,
                                                         uint64_t* out);

#ifdef __cplusplus
}
#endif

#endif /* RIFTCO_TRANSFORMER_C_API_H */
