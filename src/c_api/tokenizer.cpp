// Tokenizer handles: creation through the factory (stable method values), exact restoration,
// queries, and binary-safe encode/decode.

#include <vector>

#include "c_api/boundary.hpp"
#include "c_api/handles.hpp"
#include "riftco_transformer/data/tokenizer_factory.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::c_api;

namespace {

constexpr rt_tokenizer_options default_tokenizer_options() {
    rt_tokenizer_options options{};
    options.struct_size = sizeof(rt_tokenizer_options);
    options.method = RT_TOKENIZER_METHOD_BYTE;
    options.vocabulary_size = default_bpe_vocabulary_size;
    options.minimum_pair_frequency = default_minimum_pair_frequency;
    return options;
}

void publish(std::shared_ptr<const Tokenizer> tokenizer, rt_tokenizer** out) {
    *out = new rt_tokenizer{std::move(tokenizer)};
}

const Tokenizer& tokenizer_of(const rt_tokenizer* handle) {
    return *require_handle(handle, "tokenizer").tokenizer;
}

}  // namespace

extern "C" {

rt_status rt_tokenizer_options_init(rt_tokenizer_options* options, uint64_t struct_size) {
    return guarded(__func__, [&] {
        initialise_struct(options, struct_size, sizeof(rt_tokenizer_options),
                          default_tokenizer_options(), "options");
    });
}

rt_status rt_tokenizer_create(const uint8_t* corpus, uint64_t corpus_size, rt_tokenizer** out) {
    return guarded(__func__, [&] {
        const auto bytes = input_array(corpus, corpus_size, "corpus");
        require_pointer(out, "out");
        publish(create_tokenizer(bytes), out);
    });
}

rt_status rt_tokenizer_create_with_options(const uint8_t* corpus, uint64_t corpus_size,
                                           const rt_tokenizer_options* options,
                                           rt_tokenizer** out) {
    return guarded(__func__, [&] {
        const auto bytes = input_array(corpus, corpus_size, "corpus");
        const rt_tokenizer_options given =
            options == nullptr ? default_tokenizer_options()
                               : read_struct(options, sizeof(rt_tokenizer_options),
                                             default_tokenizer_options(), "options");
        if (given.reserved != 0) {
            throw std::invalid_argument("options->reserved must be 0 (got " +
                                        std::to_string(given.reserved) + ")");
        }
        require_pointer(out, "out");
        TokenizerOptions native;
        native.method = tokenizer_method_from_value(given.method);
        if (native.method == TokenizerMethod::Bpe) {
            native.vocabulary_size = given.vocabulary_size;
            native.minimum_pair_frequency = given.minimum_pair_frequency;
        }
        publish(create_tokenizer(bytes, native), out);
    });
}

rt_status rt_tokenizer_create_from_byte_vocabulary(const uint8_t* vocabulary, uint64_t count,
                                                   rt_tokenizer** out) {
    return guarded(__func__, [&] {
        const auto bytes = input_array(vocabulary, count, "vocabulary");
        require_pointer(out, "out");
        TokenizerState state;
        state.method = TokenizerMethod::Byte;
        state.byte_vocabulary.assign(bytes.begin(), bytes.end());
        publish(restore_tokenizer(state), out);
    });
}

rt_status rt_tokenizer_create_from_bpe_merges(const rt_bpe_merge_rule* rules, uint64_t count,
                                              rt_tokenizer** out) {
    return guarded(__func__, [&] {
        const auto given = input_array(rules, count, "rules");
        require_pointer(out, "out");
        TokenizerState state;
        state.method = TokenizerMethod::Bpe;
        state.merge_rules.reserve(given.size());
        for (const rt_bpe_merge_rule& rule : given) {
            state.merge_rules.push_back({rule.left, rule.right, rule.result});
        }
        publish(restore_tokenizer(state), out);
    });
}

void rt_tokenizer_release(rt_tokenizer* tokenizer) {
    delete tokenizer;
}

rt_status rt_tokenizer_get_method(const rt_tokenizer* tokenizer, int32_t* out_method) {
    return guarded(__func__, [&] {
        set_output(out_method, static_cast<int32_t>(tokenizer_of(tokenizer).method()),
                   "out_method");
    });
}

rt_status rt_tokenizer_vocabulary_size(const rt_tokenizer* tokenizer, uint64_t* out_size) {
    return guarded(__func__, [&] {
        set_output(out_size, tokenizer_of(tokenizer).vocabulary_size(), "out_size");
    });
}

rt_status rt_tokenizer_bpe_merge_count(const rt_tokenizer* tokenizer, uint64_t* out_count) {
    return guarded(__func__, [&] {
        set_output(out_count, tokenizer_of(tokenizer).merge_count(), "out_count");
    });
}

rt_status rt_tokenizer_bpe_merge_rule(const rt_tokenizer* tokenizer, uint64_t index,
                                      rt_bpe_merge_rule* out_rule) {
    return guarded(__func__, [&] {
        const Tokenizer& native = tokenizer_of(tokenizer);
        require_pointer(out_rule, "out_rule");
        const BpeMergeRule rule = native.merge_rule(to_size(index, "index"));
        *out_rule = {rule.left, rule.right, rule.result};
    });
}

rt_status rt_tokenizer_vocabulary(const rt_tokenizer* tokenizer, uint8_t* out, uint64_t capacity,
                                  uint64_t* required) {
    return guarded(__func__, [&] {
        const std::vector<std::uint8_t> bytes = tokenizer_of(tokenizer).byte_vocabulary();
        write_output<std::uint8_t>(bytes, out, capacity, required);
    });
}

rt_status rt_tokenizer_token_bytes(const rt_tokenizer* tokenizer, uint32_t id, uint8_t* out,
                                   uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const std::vector<std::uint8_t> bytes = tokenizer_of(tokenizer).token_bytes(id);
        write_output<std::uint8_t>(bytes, out, capacity, required);
    });
}

rt_status rt_tokenizer_encode(const rt_tokenizer* tokenizer, const uint8_t* bytes,
                              uint64_t byte_count, uint32_t* out, uint64_t capacity,
                              uint64_t* required) {
    return guarded(__func__, [&] {
        const Tokenizer& native = tokenizer_of(tokenizer);
        const auto input = input_array(bytes, byte_count, "bytes");
        const std::vector<TokenId> ids = native.encode_bytes(input);
        write_output<std::uint32_t>(ids, out, capacity, required);
    });
}

rt_status rt_tokenizer_decode(const rt_tokenizer* tokenizer, const uint32_t* ids, uint64_t id_count,
                              uint8_t* out, uint64_t capacity, uint64_t* required) {
    return guarded(__func__, [&] {
        const Tokenizer& native = tokenizer_of(tokenizer);
        const auto input = input_array(ids, id_count, "ids");
        const std::vector<std::uint8_t> decoded = native.decode_bytes(input);
        write_output<std::uint8_t>(decoded, out, capacity, required);
    });
}

}  // extern "C"
