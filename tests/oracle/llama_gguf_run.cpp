// riftco_llama_gguf_run: loads a Llama/Mistral GGUF file through the importer and either
// writes the logits of a token sequence or greedily continues it, for the Python oracle
// (tests/oracle/llama_gguf_parity.py) to compare with its own numpy implementation.
//
//   riftco_llama_gguf_run MODEL.gguf logits OUT.f32 ID,ID,...   -> OUT.f32 = logits [T, V]
//   riftco_llama_gguf_run MODEL.gguf generate N ID,ID,...       -> prints N greedy ids
//   riftco_llama_gguf_run MODEL.gguf decode-logits OUT.f32 ID,...  -> OUT.f32 = logits [T, V]
//       from a decode session (paged cache): the first id prefilled, every later one decoded
//   riftco_llama_gguf_run MODEL.gguf config                      -> prints the config
// Options before the command: --context C (maximum context, default 512), --nf4,
// --attention flash|materialized (default flash).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "riftco_transformer/interchange/llama_gguf.hpp"
#include "riftco_transformer/serving/decode_session.hpp"

namespace {

std::vector<std::uint32_t> parse_ids(const std::string& text) {
    std::vector<std::uint32_t> ids;
    std::stringstream stream(text);
    std::string item;
    while (std::getline(stream, item, ','))
        ids.push_back(static_cast<std::uint32_t>(std::stoul(item)));
    return ids;
}

std::uint32_t argmax(const std::vector<float>& row) {
    return static_cast<std::uint32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

int main(int argc, char** argv) {
    using namespace riftco_transformer;
    try {
        std::vector<std::string> args(argv + 1, argv + argc);
        LlamaGgufOptions options;
        options.maximum_context = 512;
        bool nf4 = false;
        while (!args.empty() && args[0].rfind("--", 0) == 0) {
            if (args[0] == "--context" && args.size() > 1) {
                options.maximum_context = std::stoul(args[1]);
                args.erase(args.begin(), args.begin() + 2);
            } else if (args[0] == "--attention" && args.size() > 1) {
                if (args[1] != "flash" && args[1] != "materialized")
                    throw std::invalid_argument("--attention must be flash or materialized");
                options.attention =
                    args[1] == "flash" ? AttentionKind::Flash : AttentionKind::Materialized;
                args.erase(args.begin(), args.begin() + 2);
            } else if (args[0] == "--nf4") {
                nf4 = true;
                args.erase(args.begin());
            } else {
                throw std::invalid_argument("unknown option " + args[0]);
            }
        }
        if (args.size() < 2)
            throw std::invalid_argument("usage: MODEL.gguf logits|generate|config ...");
        const GgufFile file = GgufFile::open(args[0]);
        const std::string& command = args[1];
        if (command == "config") {
            const DecoderConfig c = llama_config_from_gguf(file, options);
            std::cout << "vocabulary_size " << c.vocabulary_size << "\nmodel_width "
                      << c.model_width << "\nquery_head_count " << c.query_head_count
                      << "\nkey_value_head_count " << c.key_value_head_count << "\nblock_count "
                      << c.block_count << "\nfeed_forward_width " << c.feed_forward_width
                      << "\nrope_theta " << c.rope_theta << "\nrms_norm_epsilon "
                      << c.rms_norm_epsilon << "\ntie_embeddings " << c.tie_embeddings << "\n";
            return 0;
        }
        auto model = load_llama_from_gguf(file, options);
        if (nf4)
            model->quantize_nf4();
        const std::size_t V = model->config().vocabulary_size;
        if (command == "logits" && args.size() == 4) {
            const std::vector<std::uint32_t> ids = parse_ids(args[3]);
            const std::vector<float> logits =
                model->forward(ids, {1, ids.size()}).value().to_host();
            std::ofstream out(args[2], std::ios::binary);
            out.write(reinterpret_cast<const char*>(logits.data()),
                      static_cast<std::streamsize>(logits.size() * sizeof(float)));
            return out ? 0 : 1;
        }
        if (command == "decode-logits" && args.size() == 4) {
            const std::vector<std::uint32_t> ids = parse_ids(args[3]);
            DecodeSession session(*model, KeyValueCacheKind::Paged, 16);
            std::vector<float> logits = session.prefill({ids.data(), 1}).to_host();
            for (std::size_t t = 1; t < ids.size(); ++t) {
                const std::vector<float> row = session.decode_token(ids[t]).to_host();
                logits.insert(logits.end(), row.begin(), row.end());
            }
            std::ofstream out(args[2], std::ios::binary);
            out.write(reinterpret_cast<const char*>(logits.data()),
                      static_cast<std::streamsize>(logits.size() * sizeof(float)));
            return out ? 0 : 1;
        }
        if (command == "generate" && args.size() == 4) {
            const std::size_t count = std::stoul(args[2]);
            const std::vector<std::uint32_t> prompt = parse_ids(args[3]);
            DecodeSession session(*model, KeyValueCacheKind::Paged, 16);
            std::uint32_t next = argmax(session.prefill(prompt).to_host());
            for (std::size_t i = 0; i < count; ++i) {
                std::cout << next << (i + 1 < count ? "," : "\n");
                if (i + 1 < count)
                    next = argmax(session.decode_token(next).to_host());
            }
            (void)V;
            return 0;
        }
        throw std::invalid_argument("unknown command or wrong arguments: " + command);
    } catch (const std::exception& error) {
        std::cerr << "riftco_llama_gguf_run: " << error.what() << "\n";
        return 2;
    }
}
