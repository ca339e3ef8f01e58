/*
 * The Llama/Mistral handles (2.8), the pretrained-tokenizer and GGUF-metadata functions as a
 * pure C11 client sees them: config init and every config rule (nothing created on a
 * rejection), the rt_model view (forward, LoRA on the gated feed-forward, decode sessions,
 * rt_model_config refusing), tokenizers from plain arrays (encode, decode, export round trip,
 * errors), and GGUF errors on files that are not there.
 */
#include "c_test_fixtures.h"

static rt_llama_mistral_config tiny_llama_config(void) {
    rt_llama_mistral_config config;
    EXPECT_OK(rt_llama_mistral_config_init(&config, sizeof config));
    config.vocabulary_size = 11;
    config.maximum_context = 8;
    config.model_width = 16;
    config.query_head_count = 4;
    config.key_value_head_count = 2;
    config.block_count = 1;
    config.feed_forward_width = 12;
    return config;
}

/* The config a model created from `config` reads back (full size); the model is released, so
 * the pointer fields of the result must not be followed. */
static rt_llama_mistral_config created_config(const rt_llama_mistral_config* config) {
    rt_llama_mistral_model* model = NULL;
    rt_llama_mistral_config read;
    memset(&read, 0, sizeof read);
    read.struct_size = sizeof read;
    EXPECT_OK(rt_llama_mistral_model_create(config, &model));
    if (model != NULL) {
        EXPECT_OK(rt_llama_mistral_model_config(model, &read));
        rt_llama_mistral_model_release(model);
    }
    return read;
}

static void config_init_sets_the_defaults_and_layout(void) {
    rt_llama_mistral_config config;
    memset(&config, 0xAB, sizeof config);
    EXPECT_OK(rt_llama_mistral_config_init(&config, sizeof config));
    EXPECT_EQ_U64(config.struct_size, sizeof config);
    /* 96 bytes in 2.8, the family choices appended in 2.10 (184), the caps and YaRN in 2.11,
     * the GPT-2 choices in 2.12 */
    EXPECT_EQ_U64(sizeof config, 264);
    EXPECT(config.positions == RT_POSITIONS_ROTARY && config.norm == RT_NORM_RMS &&
           config.feed_forward == RT_FEED_FORWARD_GATED &&
           config.plain_activation == RT_FEED_FORWARD_ACTIVATION_GELU);
    EXPECT(config.output_bias == 0 && config.feed_forward_bias == 0 && config.head_bias == 0 &&
           config.reserved == 0);
    EXPECT(config.rope_frequency_factors == NULL && config.rope_frequency_factor_count == 0);
    EXPECT(config.rope_yarn_beta_fast == 32.0 && config.rope_yarn_beta_slow == 1.0 &&
           config.rope_yarn_attention_factor == 0.0);
    EXPECT(config.attention_logit_softcap == 0.0f && config.final_logit_softcap == 0.0f);
    EXPECT(config.architecture == RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA);
    EXPECT_EQ_U64(config.head_width, 0);
    EXPECT_EQ_U64(config.query_key_value_bias, 0);
    EXPECT_EQ_U64(config.query_key_norm, 0);
    EXPECT_EQ_U64(config.norm_weight_offset, 0);
    EXPECT_EQ_U64(config.post_block_norms, 0);
    EXPECT(config.feed_forward_activation == RT_GATED_ACTIVATION_SILU);
    EXPECT(config.embedding_scale == 0.0f && config.attention_scale == 0.0f);
    EXPECT(config.rope_scaling == RT_ROPE_SCALING_NONE);
    EXPECT_EQ_U64(config.sliding_window_period, 0);
    EXPECT(config.rope_local_theta == 0.0 && config.rope_scaling_factor == 1.0);
    EXPECT(config.rope_low_frequency_factor == 1.0 && config.rope_high_frequency_factor == 4.0);
    EXPECT_EQ_U64(config.rope_original_context, 8192);
    EXPECT_EQ_U64(config.random_seed, 5489);
    EXPECT_EQ_U64(config.vocabulary_size, 0);
    EXPECT(config.rms_norm_epsilon == 1e-5f);
    EXPECT(config.rope_theta == 10000.0);
    EXPECT_EQ_U64(config.sliding_window, 0);
    EXPECT_EQ_U64(config.tie_embeddings, 0);
    EXPECT_STATUS(rt_llama_mistral_config_init(&config, 8), RT_STATUS_INVALID_ARGUMENT);
}

/* A 2.8 client declares the first 96 bytes: init writes only those, create reads them with
 * Llama's choices for the rest (whatever bytes lie past the prefix), config writes only them. */
static void a_2_8_sized_config_still_initialises_and_creates(void) {
    rt_llama_mistral_config config;
    memset(&config, 0xAB, sizeof config);
    EXPECT_OK(rt_llama_mistral_config_init(&config, 96));
    EXPECT_EQ_U64(config.struct_size, 96);
    EXPECT(all_bytes_are((const char*)&config + 96, sizeof config - 96, 0xAB));
    config = tiny_llama_config();
    config.struct_size = 96;
    memset((char*)&config + 96, 0xAB, sizeof config - 96); /* garbage past the prefix */
    rt_llama_mistral_model* model = NULL;
    EXPECT_OK(rt_llama_mistral_model_create(&config, &model));
    rt_llama_mistral_config out;
    memset(&out, 0xCD, sizeof out);
    out.struct_size = 96;
    EXPECT_OK(rt_llama_mistral_model_config(model, &out));
    EXPECT_EQ_U64(out.model_width, 16);
    EXPECT(all_bytes_are((const char*)&out + 96, sizeof out - 96, 0xCD));
    /* The full-size config of that model reads Llama's choices. */
    rt_llama_mistral_config full;
    full.struct_size = sizeof full;
    EXPECT_OK(rt_llama_mistral_model_config(model, &full));
    EXPECT(full.head_width == 0 && full.query_key_norm == 0 && full.post_block_norms == 0 &&
           full.feed_forward_activation == RT_GATED_ACTIVATION_SILU &&
           full.rope_scaling == RT_ROPE_SCALING_NONE);
    /* The preset needs the 2.10 size (it writes the choices). */
    EXPECT_STATUS(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN3),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("struct_size");
    rt_llama_mistral_model_release(model);
}

static void presets_set_each_familys_choices(void) {
    rt_llama_mistral_config config = tiny_llama_config();
    config.sliding_window = 4;
    EXPECT_OK(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA3));
    EXPECT(config.architecture == RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA3);
    EXPECT(config.query_key_norm == 1 && config.norm_weight_offset == 1 &&
           config.post_block_norms == 1 && config.query_key_value_bias == 0);
    EXPECT(config.feed_forward_activation == RT_GATED_ACTIVATION_GELU_TANH);
    EXPECT(config.embedding_scale == 4.0f); /* sqrt(16) */
    EXPECT_EQ_U64(config.sliding_window_period, 6);
    EXPECT(config.rope_local_theta == 10000.0);
    rt_llama_mistral_model* model = NULL;
    EXPECT_OK(rt_llama_mistral_model_create(&config, &model));
    rt_llama_mistral_model_release(model);
    config = tiny_llama_config();
    EXPECT_OK(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2));
    EXPECT(config.query_key_value_bias == 1 && config.query_key_norm == 0);
    const rt_llama_mistral_config before = config;
    EXPECT_STATUS(rt_llama_mistral_config_preset(&config, 8), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("architecture");
    EXPECT(memcmp(&before, &config, sizeof config) == 0); /* unchanged */
    EXPECT_STATUS(rt_llama_mistral_config_preset(NULL, RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2),
                  RT_STATUS_INVALID_ARGUMENT);
    /* 2.11: Gemma 2 (value 4) with both soft caps, a given cap kept. */
    config = tiny_llama_config();
    config.sliding_window = 4;
    config.final_logit_softcap = 12.5f;
    EXPECT_OK(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA2));
    EXPECT(config.architecture == 4);
    EXPECT(config.query_key_norm == 0 && config.norm_weight_offset == 1 &&
           config.post_block_norms == 1);
    EXPECT(config.feed_forward_activation == RT_GATED_ACTIVATION_GELU_TANH);
    EXPECT_EQ_U64(config.sliding_window_period, 2);
    EXPECT(config.attention_logit_softcap == 50.0f && config.final_logit_softcap == 12.5f);
    const rt_llama_mistral_config read = created_config(&config);
    EXPECT(read.attention_logit_softcap == 50.0f && read.final_logit_softcap == 12.5f);
}

/* A 2.10 client declares 184 bytes: the preset writes only those (every choice but the caps),
 * create reads no cap from the bytes past them, and config writes only them. */
static void a_2_10_sized_config_gets_the_choices_without_the_caps(void) {
    rt_llama_mistral_config config = tiny_llama_config();
    config.struct_size = 184;
    config.sliding_window = 4;
    config.attention_logit_softcap = -7.0f; /* garbage past the prefix */
    config.final_logit_softcap = -7.0f;
    EXPECT_OK(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_GEMMA3));
    EXPECT_EQ_U64(config.struct_size, 184);
    EXPECT(config.query_key_norm == 1 && config.sliding_window_period == 6);
    EXPECT(config.attention_logit_softcap == -7.0f && config.final_logit_softcap == -7.0f);
    rt_llama_mistral_model* model = NULL;
    EXPECT_OK(rt_llama_mistral_model_create(&config, &model));
    rt_llama_mistral_config out;
    memset(&out, 0xCD, sizeof out);
    out.struct_size = 184;
    EXPECT_OK(rt_llama_mistral_model_config(model, &out));
    EXPECT(out.query_key_norm == 1);
    EXPECT(all_bytes_are((const char*)&out + 184, sizeof out - 184, 0xCD));
    rt_llama_mistral_model_release(model);
    EXPECT_STATUS(rt_llama_mistral_config_preset(&config, 4 + 100), RT_STATUS_INVALID_ARGUMENT);
    config.struct_size = 183;
    EXPECT_STATUS(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN3),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("184");
}

/* GPT-2 is a preset of the one decoder: the general config with the gpt2 preset builds, from the
 * same seed, the model rt_model_create builds (same parameter names, same values, bit-identical
 * logits), rt_model_decoder_config reads an rt_model_create model back as that config, and a
 * struct too small for the choices cannot take the preset. */
static void gpt2_is_a_preset_of_the_one_decoder(void) {
    rt_llama_mistral_config config;
    EXPECT_OK(rt_llama_mistral_config_init(&config, sizeof config));
    config.vocabulary_size = TINY_VOCABULARY;
    config.maximum_context = TINY_CONTEXT;
    config.model_width = 12; /* head width 3: odd is fine without RoPE */
    config.query_head_count = 4;
    config.key_value_head_count = 4;
    config.block_count = 2;
    config.feed_forward_width = 20;
    config.random_seed = 7;
    EXPECT_OK(rt_llama_mistral_config_preset(&config, RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2));
    EXPECT(config.architecture == RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2);
    EXPECT(config.positions == RT_POSITIONS_LEARNED && config.norm == RT_NORM_LAYER &&
           config.feed_forward == RT_FEED_FORWARD_PLAIN &&
           config.plain_activation == RT_FEED_FORWARD_ACTIVATION_GELU_TANH);
    EXPECT(config.query_key_value_bias == 1 && config.output_bias == 1 &&
           config.feed_forward_bias == 1 && config.head_bias == 1);
    EXPECT(config.query_key_norm == 0 && config.norm_weight_offset == 0 &&
           config.post_block_norms == 0 && config.embedding_scale == 0.0f);
    rt_llama_mistral_model* general = NULL;
    EXPECT_OK(rt_llama_mistral_model_create(&config, &general));
    rt_model* from_general = NULL;
    EXPECT_OK(rt_llama_mistral_model_as_model(general, &from_general));
    rt_llama_mistral_model_release(general);

    rt_transformer_config gpt = tiny_config();
    gpt.model_width = 12;
    gpt.head_count = 4;
    gpt.block_count = 2;
    gpt.feed_forward_width = 20;
    gpt.random_seed = 7;
    gpt.feed_forward_activation = RT_FEED_FORWARD_ACTIVATION_GELU_TANH;
    rt_model* from_gpt = NULL;
    EXPECT_OK(rt_model_create(&gpt, &from_gpt));

    rt_parameter_list* a = parameters_of(from_general);
    rt_parameter_list* b = parameters_of(from_gpt);
    uint64_t count_a = 0;
    uint64_t count_b = 0;
    EXPECT_OK(rt_parameter_list_count(a, &count_a));
    EXPECT_OK(rt_parameter_list_count(b, &count_b));
    EXPECT_EQ_U64(count_a, count_b);
    EXPECT_EQ_U64(count_a, 2 + 2 * 16 + 4); /* embeddings, 16 per block, final norm and head */
    for (uint64_t i = 0; i < count_a && i < count_b; ++i) {
        char name_a[96];
        char name_b[96];
        uint64_t required = 0;
        EXPECT_OK(rt_parameter_list_name(a, i, name_a, sizeof name_a, &required));
        EXPECT_OK(rt_parameter_list_name(b, i, name_b, sizeof name_b, &required));
        EXPECT(strcmp(name_a, name_b) == 0);
    }
    EXPECT_EQ_U64(total_numel(a), total_numel(b));
    float* values_a = copy_parameter_values(a);
    float* values_b = copy_parameter_values(b);
    EXPECT(memcmp(values_a, values_b, total_numel(a) * sizeof(float)) == 0);
    free(values_a);
    free(values_b);
    rt_parameter_list_release(a);
    rt_parameter_list_release(b);
    const uint32_t row[TINY_CONTEXT] = {1, 5, 9, 2, 15, 0, 7, 7};
    float* logits_a = tiny_logits(from_general, row);
    float* logits_b = tiny_logits(from_gpt, row);
    EXPECT(memcmp(logits_a, logits_b, sizeof(float) * TINY_CONTEXT * TINY_VOCABULARY) == 0);
    free(logits_a);
    free(logits_b);

    /* The GPT decoder reads back as the general config it is. */
    rt_llama_mistral_config read;
    memset(&read, 0, sizeof read);
    read.struct_size = sizeof read;
    EXPECT_OK(rt_model_decoder_config(from_gpt, &read));
    EXPECT(memcmp(&read, &config, sizeof read) == 0);
    int32_t is_llama = -1;
    EXPECT_OK(rt_model_is_llama_mistral(from_gpt, &is_llama));
    EXPECT(is_llama == 0);
    EXPECT_OK(rt_model_decoder_config(from_general, &read));
    EXPECT(memcmp(&read, &config, sizeof read) == 0);
    EXPECT_STATUS(rt_model_decoder_config(NULL, &read), RT_STATUS_INVALID_ARGUMENT);
    rt_model_release(from_general);
    rt_model_release(from_gpt);

    /* A 2.11-sized struct cannot hold the GPT-2 choices: refused, nothing written. */
    rt_llama_mistral_config small = tiny_llama_config();
    small.struct_size = 232;
    const rt_llama_mistral_config before = small;
    EXPECT_STATUS(rt_llama_mistral_config_preset(&small, RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("264");
    EXPECT(memcmp(&before, &small, sizeof small) == 0);
}

/* rt_checkpoint_tensor_name: the architecture table through the size-query protocol. */
static void the_architecture_table_names_checkpoint_tensors(void) {
    char name[64];
    uint64_t required = 0;
    int32_t part = 7;
    EXPECT_OK(rt_checkpoint_tensor_name(
        RT_LLAMA_MISTRAL_ARCHITECTURE_QWEN2, RT_CHECKPOINT_FORMAT_HUGGING_FACE,
        "blocks.5.attention.query.bias", 0, name, sizeof name, &required, &part));
    EXPECT(strcmp(name, "model.layers.5.self_attn.q_proj.bias") == 0);
    EXPECT_EQ_U64(required, strlen("model.layers.5.self_attn.q_proj.bias") + 1);
    EXPECT(part == -1);
    EXPECT_OK(rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA,
                                        RT_CHECKPOINT_FORMAT_GGUF, "token_embedding.weight", 0,
                                        NULL, 0, &required, &part));
    EXPECT_EQ_U64(required, strlen("token_embd.weight") + 1);
    EXPECT_OK(rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_PHI3,
                                        RT_CHECKPOINT_FORMAT_GGUF, "blocks.0.attention.key.weight",
                                        1, name, sizeof name, &required, &part));
    EXPECT(strcmp(name, "blk.0.attn_qkv.weight") == 0 && part == 1);
    EXPECT_OK(rt_checkpoint_tensor_name(
        RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2, RT_CHECKPOINT_FORMAT_HUGGING_FACE,
        "blocks.1.feed_forward.expand.bias", 0, name, sizeof name, &required, &part));
    EXPECT(strcmp(name, "h.1.mlp.c_fc.bias") == 0 && part == -1);
    /* No second layout: out of range; not a parameter, unknown values: invalid argument. */
    EXPECT_STATUS(rt_checkpoint_tensor_name(
                      RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA, RT_CHECKPOINT_FORMAT_GGUF,
                      "blocks.0.attention.key.weight", 1, name, sizeof name, &required, &part),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(
        rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA, RT_CHECKPOINT_FORMAT_GGUF,
                                  "blocks.0.nothing", 0, name, sizeof name, &required, &part),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("blocks.0.nothing");
    EXPECT_STATUS(
        rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_GPT2, RT_CHECKPOINT_FORMAT_GGUF,
                                  "token_embedding.weight", 0, name, sizeof name, &required, &part),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(
        rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA, 2, "token_embedding.weight",
                                  0, name, sizeof name, &required, &part),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("format");
    EXPECT_STATUS(rt_checkpoint_tensor_name(-1, RT_CHECKPOINT_FORMAT_GGUF, "token_embedding.weight",
                                            0, name, sizeof name, &required, &part),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(rt_checkpoint_tensor_name(9, RT_CHECKPOINT_FORMAT_GGUF, "token_embedding.weight",
                                            0, name, sizeof name, &required, &part),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(
        rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA, RT_CHECKPOINT_FORMAT_GGUF,
                                  NULL, 0, name, sizeof name, &required, &part),
        RT_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(
        rt_checkpoint_tensor_name(RT_LLAMA_MISTRAL_ARCHITECTURE_LLAMA, RT_CHECKPOINT_FORMAT_GGUF,
                                  "token_embedding.weight", 0, name, 4, &required, &part),
        RT_STATUS_OUT_OF_RANGE); /* too small */
}

/* create with `config` fails with `status`, its message naming `fragment`, and leaves the
 * output pointer untouched. */
#define EXPECT_CREATE_REJECTED(config, status, fragment)                               \
    do {                                                                               \
        rt_llama_mistral_model* untouched = (rt_llama_mistral_model*)0x1;              \
        EXPECT_STATUS(rt_llama_mistral_model_create(&(config), &untouched), (status)); \
        EXPECT_LAST_ERROR_MENTIONS(fragment);                                          \
        EXPECT(untouched == (rt_llama_mistral_model*)0x1);                             \
    } while (0)

static void every_config_rule_is_enforced_before_anything_is_created(void) {
    rt_llama_mistral_config config = tiny_llama_config();
    config.architecture = 8;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "architecture");
    /* 2.12: the GPT-2 choices' values and their combinations */
    config = tiny_llama_config();
    config.positions = 2;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "positions");
    config = tiny_llama_config();
    config.norm = 2;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "norm");
    config = tiny_llama_config();
    config.feed_forward = -1;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "feed_forward");
    config = tiny_llama_config();
    config.plain_activation = 3;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "plain_activation");
    config = tiny_llama_config();
    config.head_bias = 2;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "head_bias");
    config = tiny_llama_config();
    config.reserved = 1;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "reserved");
    config = tiny_llama_config();
    config.positions = RT_POSITIONS_LEARNED;
    config.rope_scaling = RT_ROPE_SCALING_LINEAR;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "rope_scaling");
    config = tiny_llama_config();
    config.norm = RT_NORM_LAYER;
    config.norm_weight_offset = 1;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "norm_weight_offset");
    config = tiny_llama_config();
    config.key_value_head_count = 3;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "key_value_head_count");
    config = tiny_llama_config();
    config.model_width = 12; /* head width 3: RoPE needs it even */
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "even head width");
    config = tiny_llama_config();
    config.rope_theta = -1.0;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "rope_theta");
    config = tiny_llama_config();
    config.tie_embeddings = 2;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "tie_embeddings");
    config = tiny_llama_config();
    config.query_key_norm = 3;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "query_key_norm");
    config = tiny_llama_config();
    config.feed_forward_activation = 9;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "feed_forward_activation");
    config = tiny_llama_config();
    config.rope_scaling = RT_ROPE_SCALING_FREQUENCY_FACTORS; /* without its factors */
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "rope_frequency_factors");
    {
        /* 2.11: the factors given (head width 16/4 = 4: two of them) and read back. */
        const float factors[3] = {1.0f, 8.0f, 2.0f};
        config.rope_frequency_factors = factors;
        config.rope_frequency_factor_count = 3; /* not d/2 = 2 */
        EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "frequency_factors");
        config.rope_frequency_factor_count = 2;
        rt_llama_mistral_model* model = NULL;
        EXPECT_OK(rt_llama_mistral_model_create(&config, &model));
        rt_llama_mistral_config read;
        read.struct_size = sizeof read;
        EXPECT_OK(rt_llama_mistral_model_config(model, &read));
        EXPECT(read.rope_scaling == RT_ROPE_SCALING_FREQUENCY_FACTORS);
        EXPECT_EQ_U64(read.rope_frequency_factor_count, 2);
        EXPECT(read.rope_frequency_factors != NULL && read.rope_frequency_factors != factors);
        EXPECT(read.rope_frequency_factors[0] == 1.0f && read.rope_frequency_factors[1] == 8.0f);
        rt_llama_mistral_model_release(model);
        config.rope_scaling = RT_ROPE_SCALING_NONE; /* factors with another kind */
        EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "rope_frequency_factors");
        config.rope_frequency_factors = NULL;
        EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "rope_frequency_factors");
    }
    config = tiny_llama_config();
    config.rope_scaling = RT_ROPE_SCALING_LLAMA3;
    config.rope_high_frequency_factor = 0.5;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "high_frequency_factor");
    config = tiny_llama_config();
    config.sliding_window_period = 2;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "sliding_window_period");
    config = tiny_llama_config();
    config.rope_scaling = RT_ROPE_SCALING_YARN;
    config.rope_scaling_factor = 4.0;
    config.rope_yarn_beta_fast = 0.5; /* not above beta_slow 1 */
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "beta_fast");
    config.rope_yarn_beta_fast = 32.0;
    config.rope_yarn_attention_factor = -1.0;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "attention_factor");
    config.rope_yarn_attention_factor = 0.0;
    {
        const rt_llama_mistral_config read = created_config(&config);
        EXPECT(read.rope_scaling == RT_ROPE_SCALING_YARN && read.rope_scaling_factor == 4.0 &&
               read.rope_yarn_beta_fast == 32.0 && read.rope_yarn_beta_slow == 1.0);
    }
    config = tiny_llama_config();
    config.attention_logit_softcap = -1.0f;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "attention_logit_softcap");
    config = tiny_llama_config();
    config.final_logit_softcap = -0.5f;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_INVALID_ARGUMENT, "final_logit_softcap");
    config = tiny_llama_config();
    config.block_count = (uint64_t)1 << 40;
    EXPECT_CREATE_REJECTED(config, RT_STATUS_OVERFLOW, "block_count");
}

static void the_model_view_serves_every_rt_model_function(void) {
    rt_llama_mistral_config config = tiny_llama_config();
    config.tie_embeddings = 1;
    config.architecture = RT_LLAMA_MISTRAL_ARCHITECTURE_MISTRAL;
    config.sliding_window = 3;
    rt_llama_mistral_model* llama = NULL;
    EXPECT_OK(rt_llama_mistral_model_create(&config, &llama));
    rt_llama_mistral_config read;
    read.struct_size = sizeof read;
    EXPECT_OK(rt_llama_mistral_model_config(llama, &read));
    EXPECT(memcmp(&read, &config, sizeof read) == 0);

    rt_model* model = NULL;
    EXPECT_OK(rt_llama_mistral_model_as_model(llama, &model));
    rt_llama_mistral_model_release(llama); /* the view keeps the state alive */
    int32_t is_llama = -1;
    EXPECT_OK(rt_model_is_llama_mistral(model, &is_llama));
    EXPECT(is_llama == 1);
    rt_transformer_config gpt;
    gpt.struct_size = sizeof gpt;
    EXPECT_STATUS(rt_model_config(model, &gpt), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("rt_llama_mistral_model_config");

    const uint32_t tokens[5] = {1, 2, 3, 4, 5};
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 5, 1, 5, &logits));
    float full[5 * 11];
    uint64_t required = 0;
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, full, 5 * 11, &required));
    rt_variable_release(logits);
    const uint32_t bad[2] = {1, 11};
    EXPECT_STATUS(rt_model_forward(model, bad, 2, 1, 2, &logits), RT_STATUS_OUT_OF_RANGE);

    /* Decode equals the full forward within the window of 3 and past it (positions 3 and 4
     * see only the last three keys). */
    rt_decode_session_options options;
    EXPECT_OK(rt_decode_session_options_init(&options, sizeof options));
    rt_decode_session* session = NULL;
    EXPECT_OK(rt_model_decode_session_create(model, &options, &session));
    float step[11];
    for (int t = 0; t < 5; ++t) {
        EXPECT_OK(rt_decode_session_step(session, tokens[t], step, 11, &required));
        for (int v = 0; v < 11; ++v)
            EXPECT_NEAR(step[v], full[t * 11 + v], 1e-4);
    }
    uint64_t size = 0;
    EXPECT_OK(rt_decode_session_size(session, &size));
    EXPECT_EQ_U64(size, 5);
    rt_decode_session_release(session);

    rt_lora_config lora;
    EXPECT_OK(rt_lora_config_init(&lora, sizeof lora));
    lora.targets = RT_LORA_TARGET_FEED_FORWARD_GATE | RT_LORA_TARGET_FEED_FORWARD_DOWN;
    EXPECT_OK(rt_model_attach_lora(model, &lora));
    rt_parameter_list* adapters = NULL;
    EXPECT_OK(rt_model_lora_parameters(model, &adapters));
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(adapters, &count));
    EXPECT_EQ_U64(count, 4); /* one block: gate and down, two factors each */
    rt_parameter_list_release(adapters);
    rt_model_release(model);
}

/* rt_model_untie_embeddings: the head appears as the last base parameter, the logits do not
 * move, the configuration reads untied, and NF4 then packs 7N+1 weights. Every refusal leaves
 * the model as it was. */
static void untie_embeddings_appends_a_head_with_the_same_logits(void) {
    rt_llama_mistral_config config = tiny_llama_config();
    config.tie_embeddings = 1;
    rt_llama_mistral_model* llama = NULL;
    EXPECT_OK(rt_llama_mistral_model_create(&config, &llama));
    rt_model* model = NULL;
    EXPECT_OK(rt_llama_mistral_model_as_model(llama, &model));
    const uint32_t tokens[4] = {1, 7, 3, 10};
    float before[4 * 11];
    float after[4 * 11];
    uint64_t required = 0;
    rt_variable* logits = NULL;
    EXPECT_OK(rt_model_forward(model, tokens, 4, 1, 4, &logits));
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, before, 4 * 11, &required));

    /* Pinned by a live variable, then by a parameter list: refused, nothing changed. */
    EXPECT_STATUS(rt_model_untie_embeddings(model), RT_STATUS_RUNTIME_ERROR);
    rt_variable_release(logits);
    rt_parameter_list* list = NULL;
    EXPECT_OK(rt_model_parameters(model, &list));
    uint64_t tied_count = 0;
    EXPECT_OK(rt_parameter_list_count(list, &tied_count));
    EXPECT_STATUS(rt_model_untie_embeddings(model), RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("parameter list");
    rt_parameter_list_release(list);
    rt_llama_mistral_config read;
    read.struct_size = sizeof read;
    EXPECT_OK(rt_llama_mistral_model_config(llama, &read));
    EXPECT_EQ_U64(read.tie_embeddings, 1);

    EXPECT_OK(rt_model_untie_embeddings(model));
    EXPECT_OK(rt_llama_mistral_model_config(llama, &read));
    EXPECT_EQ_U64(read.tie_embeddings, 0);
    EXPECT_OK(rt_model_parameters(model, &list));
    uint64_t count = 0;
    EXPECT_OK(rt_parameter_list_count(list, &count));
    EXPECT_EQ_U64(count, tied_count + 1);
    char name[64];
    EXPECT_OK(rt_parameter_list_name(list, count - 1, name, sizeof name, &required));
    EXPECT(strcmp(name, "language_model_head.weight") == 0);
    rt_parameter_list_release(list);
    EXPECT_OK(rt_model_forward(model, tokens, 4, 1, 4, &logits));
    EXPECT_OK(rt_variable_copy_to_host_f32(logits, after, 4 * 11, &required));
    rt_variable_release(logits);
    EXPECT(memcmp(before, after, sizeof before) == 0);

    EXPECT_STATUS(rt_model_untie_embeddings(model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("not tied");
    EXPECT_OK(rt_model_quantize_linear_weights_nf4(model, 32));
    rt_quantized_memory_stats stats;
    stats.struct_size = sizeof stats;
    EXPECT_OK(rt_model_quantized_memory_stats(model, &stats));
    EXPECT_EQ_U64(stats.weight_count, 7 * config.block_count + 1);
    rt_llama_mistral_model_release(llama);
    rt_model_release(model);

    /* Packed first, or with LoRA attached: refused, still tied. */
    EXPECT_OK(rt_llama_mistral_model_create(&config, &llama));
    EXPECT_OK(rt_llama_mistral_model_as_model(llama, &model));
    EXPECT_OK(rt_model_quantize_linear_weights_nf4(model, 32));
    EXPECT_STATUS(rt_model_untie_embeddings(model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("before quantize_nf4");
    rt_model_release(model);
    rt_llama_mistral_model_release(llama);
    EXPECT_OK(rt_llama_mistral_model_create(&config, &llama));
    EXPECT_OK(rt_llama_mistral_model_as_model(llama, &model));
    rt_lora_config lora;
    EXPECT_OK(rt_lora_config_init(&lora, sizeof lora));
    EXPECT_OK(rt_model_attach_lora(model, &lora));
    EXPECT_STATUS(rt_model_untie_embeddings(model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("before attach_lora");
    EXPECT_OK(rt_llama_mistral_model_config(llama, &read));
    EXPECT_EQ_U64(read.tie_embeddings, 1);
    rt_model_release(model);
    rt_llama_mistral_model_release(llama);
    EXPECT_STATUS(rt_model_untie_embeddings(NULL), RT_STATUS_INVALID_ARGUMENT);
}

/* A byte-level BPE vocabulary: the 256 byte symbols (printable bytes as themselves, the
 * others as U+0100 onward), then "ab" from the merge "a b", then a control token. */
static uint64_t append_utf8(uint8_t* out, uint32_t code) {
    if (code < 0x80) {
        out[0] = (uint8_t)code;
        return 1;
    }
    out[0] = (uint8_t)(0xC0 | (code >> 6));
    out[1] = (uint8_t)(0x80 | (code & 0x3F));
    return 2;
}

static void tokenizers_from_arrays_encode_decode_and_export(void) {
    static uint8_t bytes[256 * 2 + 16];
    static uint64_t offsets[259];
    uint64_t length = 0;
    uint32_t next_extra = 0x100;
    offsets[0] = 0;
    for (uint32_t byte = 0; byte < 256; ++byte) {
        const int printable =
            (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
        length += append_utf8(bytes + length, printable ? byte : next_extra++);
        offsets[byte + 1] = length;
    }
    memcpy(bytes + length, "ab", 2);
    length += 2;
    offsets[257] = length;
    memcpy(bytes + length, "<|end|>", 7);
    length += 7;
    offsets[258] = length;
    int32_t types[258];
    for (int i = 0; i < 258; ++i)
        types[i] = 1;
    types[257] = 3;
    const uint8_t merge_bytes[] = "a b";
    const uint64_t merge_offsets[2] = {0, 3};

    rt_pretrained_vocabulary vocabulary;
    memset(&vocabulary, 0, sizeof vocabulary);
    vocabulary.struct_size = sizeof vocabulary;
    vocabulary.model = RT_PRETRAINED_MODEL_BYTE_LEVEL_BPE;
    vocabulary.pretokenizer = RT_PRETOKENIZER_GPT2;
    vocabulary.token_count = 258;
    vocabulary.token_bytes = bytes;
    vocabulary.token_offsets = offsets;
    vocabulary.token_types = types;
    vocabulary.merge_count = 1;
    vocabulary.merge_bytes = merge_bytes;
    vocabulary.merge_offsets = merge_offsets;
    vocabulary.bos_id = -1;
    vocabulary.eos_id = 257;
    vocabulary.unknown_id = -1;
    rt_pretrained_tokenizer* tokenizer = NULL;
    EXPECT_OK(rt_pretrained_tokenizer_create(&vocabulary, &tokenizer));

    const char text[] = "ab<|end|>";
    uint32_t ids[16];
    uint64_t required = 0;
    EXPECT_OK(rt_pretrained_tokenizer_encode(tokenizer, text, 9, RT_SPECIAL_TOKENS_PARSE, ids, 16,
                                             &required));
    EXPECT_EQ_U64(required, 2);
    EXPECT_EQ_U64(ids[0], 256);
    EXPECT_EQ_U64(ids[1], 257);
    EXPECT_OK(rt_pretrained_tokenizer_encode(tokenizer, text, 9, RT_SPECIAL_TOKENS_AS_TEXT, ids, 16,
                                             &required));
    EXPECT(required > 2); /* the control token's text is tokenized as plain text */
    /* A capacity below the count: out of range, nothing written. */
    ids[0] = 999;
    EXPECT_STATUS(rt_pretrained_tokenizer_encode(tokenizer, text, 9, RT_SPECIAL_TOKENS_PARSE, ids,
                                                 1, &required),
                  RT_STATUS_OUT_OF_RANGE);
    EXPECT_EQ_U64(ids[0], 999);
    const uint32_t decode_ids[2] = {256, 257};
    uint8_t decoded[32];
    EXPECT_OK(rt_pretrained_tokenizer_decode(tokenizer, decode_ids, 2, decoded, 32, &required));
    EXPECT_EQ_U64(required, 9);
    EXPECT(memcmp(decoded, text, 9) == 0);
    const uint32_t past[1] = {258};
    EXPECT_STATUS(rt_pretrained_tokenizer_decode(tokenizer, past, 1, decoded, 32, &required),
                  RT_STATUS_OUT_OF_RANGE);
    int64_t bos = 0, eos = 0, unknown = 0, found = 0;
    EXPECT_OK(rt_pretrained_tokenizer_special_ids(tokenizer, &bos, &eos, &unknown));
    EXPECT(bos == -1 && eos == 257 && unknown == -1);
    EXPECT_OK(rt_pretrained_tokenizer_find_token(tokenizer, "ab", 2, &found));
    EXPECT(found == 256);
    EXPECT_OK(rt_pretrained_tokenizer_find_token(tokenizer, "zz", 2, &found));
    EXPECT(found == -1);

    rt_pretrained_tokenizer_info info;
    info.struct_size = sizeof info;
    EXPECT_OK(rt_pretrained_tokenizer_info_get(tokenizer, &info));
    EXPECT_EQ_U64(info.token_count, 258);
    EXPECT_EQ_U64(info.merge_count, 1);
    EXPECT(info.pretokenizer == RT_PRETOKENIZER_GPT2 && info.eos_id == 257);
    uint8_t merges[16];
    EXPECT_OK(rt_pretrained_tokenizer_export(tokenizer, RT_PRETRAINED_PART_MERGES, merges, 16,
                                             &required));
    EXPECT_EQ_U64(required, 7); /* uint32 length 3, then "a b" */
    EXPECT(merges[0] == 3 && merges[1] == 0 && memcmp(merges + 4, "a b", 3) == 0);
    EXPECT_STATUS(rt_pretrained_tokenizer_export(tokenizer, 9, merges, 16, &required),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("part");
    rt_pretrained_tokenizer_release(tokenizer);

    /* A merge naming a token that does not exist, and decreasing offsets: named, nothing made. */
    const uint8_t unknown_merge[] = "a q";
    vocabulary.merge_bytes = unknown_merge;
    tokenizer = (rt_pretrained_tokenizer*)0x1;
    EXPECT_STATUS(rt_pretrained_tokenizer_create(&vocabulary, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT(tokenizer == (rt_pretrained_tokenizer*)0x1);
    vocabulary.merge_bytes = merge_bytes;
    offsets[5] = offsets[4] - 1;
    EXPECT_STATUS(rt_pretrained_tokenizer_create(&vocabulary, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("token_offsets");
    vocabulary.model = 5;
    EXPECT_STATUS(rt_pretrained_tokenizer_create(&vocabulary, &tokenizer),
                  RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("model");
}

static void gguf_functions_name_a_missing_file(void) {
    rt_llama_mistral_model* model = NULL;
    EXPECT_STATUS(rt_llama_mistral_model_load_gguf("/nonexistent/model.gguf", 0, &model),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_LAST_ERROR_MENTIONS("/nonexistent/model.gguf");
    EXPECT(model == NULL);
    rt_pretrained_tokenizer* tokenizer = NULL;
    EXPECT_STATUS(rt_pretrained_tokenizer_load_gguf("/nonexistent/model.gguf", &tokenizer),
                  RT_STATUS_RUNTIME_ERROR);
    int32_t present = -1;
    uint64_t required = 0;
    EXPECT_STATUS(rt_gguf_metadata_string("/nonexistent/model.gguf", "general.name", &present, NULL,
                                          0, &required),
                  RT_STATUS_RUNTIME_ERROR);
    EXPECT_STATUS(rt_llama_mistral_model_load_gguf(NULL, 0, &model), RT_STATUS_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_MENTIONS("path");
}

int main(void) {
    RUN_TEST(config_init_sets_the_defaults_and_layout);
    RUN_TEST(a_2_8_sized_config_still_initialises_and_creates);
    RUN_TEST(presets_set_each_familys_choices);
    RUN_TEST(a_2_10_sized_config_gets_the_choices_without_the_caps);
    RUN_TEST(every_config_rule_is_enforced_before_anything_is_created);
    RUN_TEST(gpt2_is_a_preset_of_the_one_decoder);
    RUN_TEST(the_architecture_table_names_checkpoint_tensors);
    RUN_TEST(the_model_view_serves_every_rt_model_function);
    RUN_TEST(untie_embeddings_appends_a_head_with_the_same_logits);
    RUN_TEST(tokenizers_from_arrays_encode_decode_and_export);
    RUN_TEST(gguf_functions_name_a_missing_file);
    return finish_tests();
}
