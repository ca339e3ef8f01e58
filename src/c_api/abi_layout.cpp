// Compile-time guards for what ABI 2.9 has published: numeric values shared with the engine's
// enums, and the size and field offsets of every versioned struct. A change that would
// renumber a value or move a field fails the build here instead of breaking old clients.

#include <cstddef>

#include "riftco_transformer/c_api.h"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/data/tokenizer.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/attention.hpp"
#include "riftco_transformer/optim/adam_options.hpp"
#include "riftco_transformer/programmed/program_augmented_model.hpp"
#include "riftco_transformer/serving/kv_cache.hpp"

namespace {

using namespace riftco_transformer;

template <typename Enum>
constexpr bool same_value(int c_value, Enum engine_value) {
    return c_value == static_cast<int>(engine_value);
}

static_assert(RT_ABI_VERSION == ((RT_ABI_VERSION_MAJOR << 16) | RT_ABI_VERSION_MINOR));

static_assert(RT_STATUS_OK == 0 && RT_STATUS_INVALID_ARGUMENT == 1 && RT_STATUS_OUT_OF_RANGE == 2 &&
              RT_STATUS_OVERFLOW == 3 && RT_STATUS_BACKEND_UNAVAILABLE == 4 &&
              RT_STATUS_OUT_OF_MEMORY == 5 && RT_STATUS_RUNTIME_ERROR == 6 &&
              RT_STATUS_UNKNOWN_ERROR == 255);

// The handles convert these values with a cast, so the engine's enums must agree.
static_assert(same_value(RT_BACKEND_CPU, ExecutionBackend::Cpu) && RT_BACKEND_CPU == 0);
static_assert(same_value(RT_BACKEND_METAL, ExecutionBackend::Metal) && RT_BACKEND_METAL == 1);
static_assert(same_value(RT_BACKEND_CUDA, ExecutionBackend::Cuda) && RT_BACKEND_CUDA == 2);
static_assert(same_value(RT_BACKEND_TPU, ExecutionBackend::Tpu) && RT_BACKEND_TPU == 3);
static_assert(same_value(RT_BACKEND_PJRT, ExecutionBackend::Pjrt) && RT_BACKEND_PJRT == 4);
static_assert(same_value(RT_TOKENIZER_METHOD_BYTE, TokenizerMethod::Byte));
static_assert(same_value(RT_TOKENIZER_METHOD_BPE, TokenizerMethod::Bpe));
static_assert(same_value(RT_ATTENTION_MATERIALIZED, AttentionKind::Materialized));
static_assert(same_value(RT_ATTENTION_FLASH, AttentionKind::Flash));
static_assert(same_value(RT_ACTIVATION_CHECKPOINTING_DISABLED, ActivationCheckpointing::Disabled));
static_assert(same_value(RT_ACTIVATION_CHECKPOINTING_TRANSFORMER_BLOCK,
                         ActivationCheckpointing::TransformerBlock));
static_assert(same_value(RT_ADAM_STATE_CONTIGUOUS, AdamStateStorage::Contiguous));
static_assert(same_value(RT_ADAM_STATE_PAGED, AdamStateStorage::Paged));

static_assert(RT_LORA_TARGET_QUERY == lora_target_bit(LoraTarget::Query));
static_assert(RT_LORA_TARGET_KEY == lora_target_bit(LoraTarget::Key));
static_assert(RT_LORA_TARGET_VALUE == lora_target_bit(LoraTarget::Value));
static_assert(RT_LORA_TARGET_OUTPUT == lora_target_bit(LoraTarget::Output));
static_assert(RT_LORA_TARGET_FEED_FORWARD_EXPAND == lora_target_bit(LoraTarget::FeedForwardExpand));
static_assert(RT_LORA_TARGET_FEED_FORWARD_PROJECT ==
              lora_target_bit(LoraTarget::FeedForwardProject));
static_assert(RT_LORA_TARGET_LANGUAGE_MODEL_HEAD == lora_target_bit(LoraTarget::LanguageModelHead));
static_assert(RT_LORA_TARGETS_DEFAULT == lora_default_targets &&
              RT_LORA_TARGETS_ALL_LINEAR == 0x7F);
static_assert(RT_LORA_TARGET_FEED_FORWARD_GATE == lora_target_bit(LoraTarget::FeedForwardGate) &&
              RT_LORA_TARGET_FEED_FORWARD_UP == lora_target_bit(LoraTarget::FeedForwardUp) &&
              RT_LORA_TARGET_FEED_FORWARD_DOWN == lora_target_bit(LoraTarget::FeedForwardDown) &&
              RT_LORA_TARGETS_KNOWN == lora_known_targets);

static_assert(same_value(RT_PROGRAM_INPUT_WHOLE_SOURCE, ProgramInputSource::WholeSource));
static_assert(same_value(RT_PROGRAM_INPUT_SOURCE_POSITION, ProgramInputSource::SourcePosition));
static_assert(same_value(RT_LOWERING_AUTO, LoweringStrategy::Auto));
static_assert(same_value(RT_LOWERING_DENSE, LoweringStrategy::Dense));
static_assert(same_value(RT_LOWERING_LINEAR, LoweringStrategy::Linear));
static_assert(same_value(RT_LOWERING_LINEAR_ATTENTION, LoweringStrategy::LinearAttention));
static_assert(same_value(RT_LOWERING_UNSUPPORTED_REJECT, UnsupportedLoweringPolicy::Reject));
static_assert(same_value(RT_LOWERING_UNSUPPORTED_DENSE_FALLBACK,
                         UnsupportedLoweringPolicy::DenseFallback));
static_assert(same_value(RT_COEFFICIENT_PRECISION_EXACT, CoefficientPrecision::ExactFloat32));
static_assert(same_value(RT_COEFFICIENT_PRECISION_ROUNDED, CoefficientPrecision::Rounded));
static_assert(same_value(RT_COEFFICIENT_INIT_COMPILED, CoefficientInitialization::Compiled));
static_assert(same_value(RT_COEFFICIENT_INIT_RANDOM_UNIFORM,
                         CoefficientInitialization::RandomUniform));

static_assert(same_value(RT_KV_CACHE_CONTIGUOUS, KeyValueCacheKind::Contiguous) &&
              RT_KV_CACHE_CONTIGUOUS == 0);
static_assert(same_value(RT_KV_CACHE_PAGED, KeyValueCacheKind::Paged) && RT_KV_CACHE_PAGED == 1);

// Struct layouts: explicit reserved words, no tail padding.
static_assert(sizeof(rt_decode_session_options) == 24 &&
              offsetof(rt_decode_session_options, kind) == 8 &&
              offsetof(rt_decode_session_options, reserved) == 12 &&
              offsetof(rt_decode_session_options, block_size) == 16);
static_assert(same_value(RT_KV_ADMIT, KeyValueCachePool::Admission::Admit) &&
              same_value(RT_KV_WAIT, KeyValueCachePool::Admission::Wait) &&
              same_value(RT_KV_REJECT, KeyValueCachePool::Admission::Reject));
static_assert(sizeof(rt_sampling_options) == 72 &&
              offsetof(rt_sampling_options, temperature) == 8 &&
              offsetof(rt_sampling_options, top_p) == 16 &&
              offsetof(rt_sampling_options, min_p) == 24 &&
              offsetof(rt_sampling_options, repetition_penalty) == 32 &&
              offsetof(rt_sampling_options, presence_penalty) == 40 &&
              offsetof(rt_sampling_options, frequency_penalty) == 48 &&
              offsetof(rt_sampling_options, top_k) == 56 &&
              offsetof(rt_sampling_options, seed) == 64);
static_assert(
    sizeof(rt_sampling_row) == 80 && offsetof(rt_sampling_row, options) == 8 &&
    offsetof(rt_sampling_row, context) == 16 && offsetof(rt_sampling_row, context_count) == 24 &&
    offsetof(rt_sampling_row, prompt_length) == 32 && offsetof(rt_sampling_row, mask) == 40 &&
    offsetof(rt_sampling_row, draw_index) == 48 &&
    offsetof(rt_sampling_row, vocabulary_limit) == 56 && offsetof(rt_sampling_row, sample) == 64 &&
    offsetof(rt_sampling_row, log_probability) == 68 &&
    offsetof(rt_sampling_row, top_count) == 72 && offsetof(rt_sampling_row, reserved) == 76);
static_assert(sizeof(rt_kv_cache_pool_options) == 32 &&
              offsetof(rt_kv_cache_pool_options, block_size) == 8 &&
              offsetof(rt_kv_cache_pool_options, block_count) == 16 &&
              offsetof(rt_kv_cache_pool_options, prefix_caching) == 24);
static_assert(sizeof(rt_program_augmented_model_config) == 64 &&
              offsetof(rt_program_augmented_model_config, attention) == 56 &&
              offsetof(rt_program_augmented_model_config, random_seed) == 60);
static_assert(sizeof(rt_program_input_layout) == 24 &&
              offsetof(rt_program_input_layout, position) == 8 &&
              offsetof(rt_program_input_layout, projection_group) == 16);
static_assert(sizeof(rt_program_branch_config) == 64 &&
              offsetof(rt_program_branch_config, inputs) == 40 &&
              offsetof(rt_program_branch_config, input_count) == 48 &&
              offsetof(rt_program_branch_config, merge_bias) == 60);
static_assert(sizeof(rt_neural_lowering_options) == 48 &&
              offsetof(rt_neural_lowering_options, random_scale) == 24 &&
              offsetof(rt_neural_lowering_options, attention_query_axis) == 36 &&
              offsetof(rt_neural_lowering_options, max_coefficient_elements) == 40);
static_assert(sizeof(rt_program_steering) == 48 && offsetof(rt_program_steering, scales) == 16 &&
              offsetof(rt_program_steering, offsets) == 32);
static_assert(sizeof(rt_program_augmented_forward_options) == 64 &&
              offsetof(rt_program_augmented_forward_options, batch_roll_shift) == 16 &&
              offsetof(rt_program_augmented_forward_options, steering) == 24 &&
              offsetof(rt_program_augmented_forward_options, ablated_program_inputs) == 40 &&
              offsetof(rt_program_augmented_forward_options, ablate_program_output) == 56);
static_assert(sizeof(rt_lora_config) == 56 && offsetof(rt_lora_config, rank) == 8 &&
              offsetof(rt_lora_config, alpha) == 16 &&
              offsetof(rt_lora_config, random_seed) == 20 &&
              offsetof(rt_lora_config, targets) == 24 && offsetof(rt_lora_config, reserved) == 32 &&
              // 2.13: rsLoRA after the 40-byte layout
              offsetof(rt_lora_config, rank_stabilized) == 40 &&
              offsetof(rt_lora_config, reserved2) == 44 &&
              // 2.15: dropout after the 48-byte layout
              offsetof(rt_lora_config, dropout) == 48 && offsetof(rt_lora_config, reserved3) == 52);
static_assert(sizeof(rt_quantized_memory_stats) == 96 &&
              offsetof(rt_quantized_memory_stats, weight_count) == 8 &&
              offsetof(rt_quantized_memory_stats, resident_payload_bytes) == 40 &&
              offsetof(rt_quantized_memory_stats, double_quantized_weight_count) == 88);
static_assert(sizeof(rt_bpe_merge_rule) == 12);
static_assert(sizeof(rt_tokenizer_options) == 32 && offsetof(rt_tokenizer_options, method) == 8 &&
              offsetof(rt_tokenizer_options, vocabulary_size) == 16 &&
              offsetof(rt_tokenizer_options, minimum_pair_frequency) == 24);
static_assert(sizeof(rt_transformer_config) == 72 &&
              offsetof(rt_transformer_config, feed_forward_activation) == 64 &&
              offsetof(rt_transformer_config, tie_embeddings) == 68 &&
              offsetof(rt_transformer_config, vocabulary_size) == 8 &&
              offsetof(rt_transformer_config, feed_forward_width) == 48 &&
              offsetof(rt_transformer_config, random_seed) == 56 &&
              offsetof(rt_transformer_config, layer_norm_epsilon) == 60);
static_assert(sizeof(rt_adam_options) == 88 && offsetof(rt_adam_options, learning_rate) == 8 &&
              offsetof(rt_adam_options, maximum_gradient_norm) == 24 &&
              offsetof(rt_adam_options, reserved) == 28 &&
              offsetof(rt_adam_options, state_storage) == 32 &&
              offsetof(rt_adam_options, page_size) == 40 &&
              // 2.13: weight decay and the schedule after the 48-byte 2.4 layout
              offsetof(rt_adam_options, weight_decay) == 48 &&
              offsetof(rt_adam_options, schedule) == 56 &&
              offsetof(rt_adam_options, reserved3) == 60 &&
              offsetof(rt_adam_options, warmup_steps) == 64 &&
              offsetof(rt_adam_options, total_steps) == 72 &&
              offsetof(rt_adam_options, minimum_fraction) == 80);
static_assert(same_value(RT_LEARNING_RATE_SCHEDULE_CONSTANT, LearningRateScheduleKind::Constant) &&
              same_value(RT_LEARNING_RATE_SCHEDULE_WARMUP_COSINE,
                         LearningRateScheduleKind::WarmupCosine) &&
              same_value(RT_LEARNING_RATE_SCHEDULE_WARMUP_LINEAR,
                         LearningRateScheduleKind::WarmupLinear));
// 2.13 appends the step's learning rate after the 32-byte layout.
static_assert(sizeof(rt_adam_step_stats) == 40 && offsetof(rt_adam_step_stats, step) == 8 &&
              offsetof(rt_adam_step_stats, clip_scale) == 24 &&
              offsetof(rt_adam_step_stats, learning_rate) == 32);
static_assert(sizeof(rt_adam_state) == 40 && offsetof(rt_adam_state, step_count) == 8 &&
              offsetof(rt_adam_state, value_count) == 32);

// Llama/Mistral (2.8): architecture values and the config layout.
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA, DecoderArchitecture::Llama) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA == 0);
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_MISTRAL, DecoderArchitecture::Mistral) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_MISTRAL == 1);
// 2.10: the other families and the choices appended after the first published 96 bytes.
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2, DecoderArchitecture::Qwen2) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2 == 2);
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN3, DecoderArchitecture::Qwen3) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN3 == 3);
// 2.11: Gemma 2 and the soft caps after the 2.10 layout.
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA2, DecoderArchitecture::Gemma2) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA2 == 4);
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA3, DecoderArchitecture::Gemma3) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA3 == 5);
static_assert(same_value(RT_LLAMA_MISTRAL_ARCHITECTURE_PHI3, DecoderArchitecture::Phi3) &&
              RT_LLAMA_MISTRAL_ARCHITECTURE_PHI3 == 6);
static_assert(same_value(RT_GATED_ACTIVATION_SILU, GatedActivation::Silu) &&
              same_value(RT_GATED_ACTIVATION_GELU_TANH, GatedActivation::GeluTanh));
static_assert(same_value(RT_ROPE_SCALING_NONE, RopeScalingKind::None) &&
              same_value(RT_ROPE_SCALING_LINEAR, RopeScalingKind::Linear) &&
              same_value(RT_ROPE_SCALING_LLAMA3, RopeScalingKind::Llama3) &&
              same_value(RT_ROPE_SCALING_FREQUENCY_FACTORS, RopeScalingKind::FrequencyFactors) &&
              same_value(RT_ROPE_SCALING_YARN, RopeScalingKind::Yarn) && RT_ROPE_SCALING_YARN == 4);
static_assert(sizeof(rt_llama_mistral_config) == 264);
static_assert(offsetof(rt_llama_mistral_config, positions) == 232 &&
              offsetof(rt_llama_mistral_config, norm) == 236 &&
              offsetof(rt_llama_mistral_config, feed_forward) == 240 &&
              offsetof(rt_llama_mistral_config, plain_activation) == 244 &&
              offsetof(rt_llama_mistral_config, output_bias) == 248 &&
              offsetof(rt_llama_mistral_config, feed_forward_bias) == 252 &&
              offsetof(rt_llama_mistral_config, head_bias) == 256 &&
              offsetof(rt_llama_mistral_config, reserved) == 260);
static_assert(offsetof(rt_llama_mistral_config, rope_frequency_factors) == 216 &&
              offsetof(rt_llama_mistral_config, rope_frequency_factor_count) == 224);
static_assert(offsetof(rt_llama_mistral_config, attention_logit_softcap) == 184 &&
              offsetof(rt_llama_mistral_config, final_logit_softcap) == 188 &&
              offsetof(rt_llama_mistral_config, rope_yarn_beta_fast) == 192 &&
              offsetof(rt_llama_mistral_config, rope_yarn_beta_slow) == 200 &&
              offsetof(rt_llama_mistral_config, rope_yarn_attention_factor) == 208);
static_assert(offsetof(rt_llama_mistral_config, head_width) == 96 &&
              offsetof(rt_llama_mistral_config, query_key_value_bias) == 104 &&
              offsetof(rt_llama_mistral_config, post_block_norms) == 116 &&
              offsetof(rt_llama_mistral_config, feed_forward_activation) == 120 &&
              offsetof(rt_llama_mistral_config, embedding_scale) == 124 &&
              offsetof(rt_llama_mistral_config, attention_scale) == 128 &&
              offsetof(rt_llama_mistral_config, rope_scaling) == 132 &&
              offsetof(rt_llama_mistral_config, sliding_window_period) == 136 &&
              offsetof(rt_llama_mistral_config, rope_local_theta) == 144 &&
              offsetof(rt_llama_mistral_config, rope_scaling_factor) == 152 &&
              offsetof(rt_llama_mistral_config, rope_original_context) == 176);
static_assert(offsetof(rt_llama_mistral_config, architecture) == 8 &&
              offsetof(rt_llama_mistral_config, random_seed) == 12 &&
              offsetof(rt_llama_mistral_config, vocabulary_size) == 16 &&
              offsetof(rt_llama_mistral_config, feed_forward_width) == 64 &&
              offsetof(rt_llama_mistral_config, rms_norm_epsilon) == 72 &&
              offsetof(rt_llama_mistral_config, tie_embeddings) == 76 &&
              offsetof(rt_llama_mistral_config, rope_theta) == 80 &&
              offsetof(rt_llama_mistral_config, sliding_window) == 88);

}  // namespace
