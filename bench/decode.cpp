// KV-cached decoding throughput on the PyTorch yardstick's configs (tiny, small, gpt2; random
// init, as /work/shared/bench/torch_anchor.py --bench decode does), one JSON line per figure.
// tools/bench_decode.py runs it beside the anchor (and llama.cpp) and prints the ratios.
//
//   riftco_bench_decode --config tiny|small|gpt2 [--prompt 16] [--gen 128] [--reps 3]
//                       [--prefill 128] [--streams 1,4,8] [--stream-steps 32]
//                       [--cache paged|contiguous]
//
// Lines:
//   decode     greedy generation of batch 1: a --prompt-token prefill yields the first token,
//              then --gen single-token steps (capped at C − prompt, as the anchor caps);
//              tokens/s = gen / median seconds of the steps over --reps runs
//   prefill    one --prefill-token prompt in one batched pass: median seconds, tokens/s
//   streams    aggregate decode throughput of S concurrent sessions in one shared pool, each
//              step one decode_batch over all S (what the continuous-batching scheduler runs):
//              tokens/s = S·steps / seconds
//   kernels    the CPU backend's GEMM library and kernel family, the few-row GEMV kernel that
//              the decode-shape projections run, and the paged-attention path
//   bandwidth  weight bytes one decode step reads (every projection, the head, one embedding
//              row); the copy bandwidth (memcpy of 256 MiB, read+write bytes) and the read
//              bandwidth (the bench's threads summing 512 MiB, best of 5) measured here; and
//              the token rate the read bandwidth bounds decode at

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/backend/cpu/gemv.hpp"
#include "riftco_transformer/core/threading.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/serving/decode_session.hpp"

namespace {

using namespace riftco_transformer;
using Clock = std::chrono::steady_clock;

struct Config {
    const char* name;
    TransformerDimensions dimensions;
};

const Config configs[] = {
    {"tiny", {256, 128, 128, 4, 4, 512}},
    {"small", {8192, 256, 512, 8, 6, 2048}},
    {"gpt2", {50257, 1024, 768, 12, 12, 3072}},
};

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::uint32_t argmax(const std::vector<float>& logits, std::size_t offset, std::size_t count) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < count; ++i) {
        if (logits[offset + i] > logits[offset + best]) {
            best = i;
        }
    }
    return static_cast<std::uint32_t>(best);
}

std::vector<std::size_t> parse_list(const std::string& text) {
    std::vector<std::size_t> values;
    std::size_t start = 0;
    while (start < text.size()) {
        const std::size_t comma = text.find(',', start);
        values.push_back(std::stoul(text.substr(start, comma - start)));
        start = comma == std::string::npos ? text.size() : comma + 1;
    }
    return values;
}

}  // namespace

int main(int argc, char** argv) {
    std::string config_name = "tiny";
    std::size_t prompt_length = 16;
    std::size_t generate = 128;
    std::size_t repetitions = 3;
    std::size_t prefill_length = 128;
    std::string streams_text = "1,4,8";
    std::size_t stream_steps = 32;
    KeyValueCacheKind kind = KeyValueCacheKind::Paged;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                throw std::invalid_argument(std::string(arg) + " needs a value");
            }
            return argv[++i];
        };
        if (arg == "--config") {
            config_name = value();
        } else if (arg == "--prompt") {
            prompt_length = std::stoul(value());
        } else if (arg == "--gen") {
            generate = std::stoul(value());
        } else if (arg == "--reps") {
            repetitions = std::stoul(value());
        } else if (arg == "--prefill") {
            prefill_length = std::stoul(value());
        } else if (arg == "--streams") {
            streams_text = value();
        } else if (arg == "--stream-steps") {
            stream_steps = std::stoul(value());
        } else if (arg == "--cache") {
            const std::string cache = value();
            kind = cache == "contiguous" ? KeyValueCacheKind::Contiguous : KeyValueCacheKind::Paged;
        } else {
            std::fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    const Config* config = nullptr;
    for (const Config& c : configs) {
        if (config_name == c.name) {
            config = &c;
        }
    }
    if (config == nullptr) {
        std::fprintf(stderr, "unknown --config %s (tiny, small, gpt2)\n", config_name.c_str());
        return 2;
    }
    const TransformerDimensions& d = config->dimensions;
    std::mt19937 generator(1234);
    const DecoderOnlyTransformer model(d, generator);
    const std::size_t V = d.vocabulary_size;
    std::vector<std::uint32_t> prompt(std::max(prompt_length, prefill_length));
    for (auto& token : prompt) {
        token = static_cast<std::uint32_t>(generator() % V);
    }
    const char* kind_name = key_value_cache_kind_name(kind).data();
    const std::size_t threads = cpu_thread_count();
    const char* attention_choice = std::getenv("RIFTCO_TRANSFORMER_PAGED_ATTENTION");
    const bool reference_attention =
        attention_choice != nullptr && std::string_view(attention_choice) == "reference";
    std::printf(
        "{\"bench\":\"kernels\",\"cpu\":\"%s\",\"few_row_gemv\":\"%s (m <= %zu)\","
        "\"paged_attention\":\"%s\"}\n",
        cpu_info().c_str(), detail::gemv_kernel_name(), detail::gemv_max_rows,
        reference_attention ? "reference" : "fast (vectorised, threaded over request x head)");

    // decode, batch 1
    const std::size_t steps = std::min(generate, d.maximum_context - prompt_length);
    std::vector<double> step_seconds;
    for (std::size_t run = 0; run <= repetitions; ++run) {  // run 0 warms up
        DecodeSession session(model, kind);
        auto logits = session.prefill({prompt.data(), prompt_length}).to_host();
        std::uint32_t next = argmax(logits, 0, V);
        const auto start = Clock::now();
        for (std::size_t s = 0; s < (run == 0 ? std::min<std::size_t>(8, steps) : steps); ++s) {
            logits = session.decode_token(next).to_host();
            next = argmax(logits, 0, V);
        }
        if (run > 0) {
            step_seconds.push_back(seconds_since(start));
        }
    }
    const double decode_s = median(step_seconds);
    std::printf(
        "{\"bench\":\"decode\",\"config\":\"%s\",\"cache\":\"%s\",\"threads\":%zu,"
        "\"prompt\":%zu,\"decode_steps\":%zu,\"reps\":%zu,\"decode_s_median\":%.5f,"
        "\"tokens_per_s\":%.2f,\"ms_per_token\":%.3f}\n",
        config->name, kind_name, threads, prompt_length, steps, repetitions, decode_s,
        static_cast<double>(steps) / decode_s, 1000.0 * decode_s / static_cast<double>(steps));
    std::fflush(stdout);

    // prefill
    if (prefill_length > 0 && prefill_length <= d.maximum_context) {
        std::vector<double> prefill_seconds;
        for (std::size_t run = 0; run <= repetitions; ++run) {
            DecodeSession session(model, kind);
            const auto start = Clock::now();
            static_cast<void>(session.prefill({prompt.data(), prefill_length}).to_host());
            if (run > 0) {
                prefill_seconds.push_back(seconds_since(start));
            }
        }
        const double prefill_s = median(prefill_seconds);
        std::printf(
            "{\"bench\":\"prefill\",\"config\":\"%s\",\"cache\":\"%s\",\"threads\":%zu,"
            "\"prompt\":%zu,\"prefill_s_median\":%.5f,\"tokens_per_s\":%.1f}\n",
            config->name, kind_name, threads, prefill_length, prefill_s,
            static_cast<double>(prefill_length) / prefill_s);
        std::fflush(stdout);
    }

    // concurrent streams through one shared pool
    for (const std::size_t streams : parse_list(streams_text)) {
        const std::size_t per_stream = prompt_length + stream_steps + 1;
        if (streams == 0 || per_stream > d.maximum_context) {
            continue;
        }
        const std::size_t block = default_key_value_block_size;
        const auto pages = [block](std::size_t positions) {
            return (positions + block - 1) / block;
        };
        auto pool = make_key_value_cache_pool(
            model, block, std::max(streams * pages(per_stream), pages(d.maximum_context)));
        std::vector<double> run_seconds;
        for (std::size_t run = 0; run <= repetitions; ++run) {
            std::vector<DecodeSession> sessions;
            sessions.reserve(streams);
            std::vector<DecodeWork> work;
            std::vector<std::vector<std::uint32_t>> prompts(streams);
            for (std::size_t s = 0; s < streams; ++s) {
                sessions.emplace_back(model, pool);
                prompts[s].assign(prompt.begin(), prompt.begin() + prompt_length);
                prompts[s][0] = static_cast<std::uint32_t>((s * 7919) % V);  // distinct streams
                work.push_back({&sessions[s], prompts[s]});
            }
            auto logits = decode_batch(work).to_host();
            std::vector<std::uint32_t> next(streams);
            const std::size_t timed =
                run == 0 ? std::min<std::size_t>(4, stream_steps) : stream_steps;
            const auto start = Clock::now();
            for (std::size_t step = 0; step < timed; ++step) {
                for (std::size_t s = 0; s < streams; ++s) {
                    next[s] = argmax(logits, s * V, V);
                    work[s] = {&sessions[s], {&next[s], 1}};
                }
                logits = decode_batch(work).to_host();
            }
            if (run > 0) {
                run_seconds.push_back(seconds_since(start));
            }
        }
        const double seconds = median(run_seconds);
        std::printf(
            "{\"bench\":\"streams\",\"config\":\"%s\",\"threads\":%zu,\"streams\":%zu,"
            "\"steps\":%zu,\"seconds_median\":%.5f,\"tokens_per_s\":%.2f}\n",
            config->name, threads, streams, stream_steps, seconds,
            static_cast<double>(streams * stream_steps) / seconds);
        std::fflush(stdout);
    }

    // bandwidth bound
    const std::size_t D = d.model_width;
    const std::size_t F = d.feed_forward_width;
    const std::size_t weight_floats =
        d.block_count * (4 * D * D + 2 * D * F + 9 * D + F) + V * D + V + 2 * D + 2 * D;
    const std::size_t weight_bytes = weight_floats * sizeof(float);
    const std::size_t copy_bytes = std::size_t{256} << 20U;
    std::vector<char> source(copy_bytes, 1);
    std::vector<char> target(copy_bytes, 0);
    std::vector<double> copy_seconds;
    for (int run = 0; run < 5; ++run) {
        const auto start = Clock::now();
        std::memcpy(target.data(), source.data(), copy_bytes);
        copy_seconds.push_back(seconds_since(start));
        source[static_cast<std::size_t>(run)] =
            target[copy_bytes - 1 - static_cast<std::size_t>(run)];
    }
    const double copy_bandwidth = 2.0 * static_cast<double>(copy_bytes) / median(copy_seconds);
    // Read bandwidth, what streaming weights needs: `threads` threads each summing its slice
    // of 512 MiB of floats (beyond any cache), best of 5.
    const std::size_t read_floats = (std::size_t{512} << 20U) / sizeof(float);
    std::vector<float> weights_like(read_floats, 1.0F);
    double best_read = 0.0;
    for (int run = 0; run < 5; ++run) {
        std::vector<double> sums(threads, 0.0);
        const auto start = Clock::now();
        std::vector<std::thread> workers;
        for (std::size_t t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                const std::size_t begin = read_floats * t / threads;
                const std::size_t end = read_floats * (t + 1) / threads;
                float lanes[16] = {};
                for (std::size_t i = begin; i + 16 <= end; i += 16) {
                    for (std::size_t l = 0; l < 16; ++l) {
                        lanes[l] += weights_like[i + l];
                    }
                }
                for (const float lane : lanes) {
                    sums[t] += lane;
                }
            });
        }
        for (std::thread& worker : workers) {
            worker.join();
        }
        const double seconds = seconds_since(start);
        if (sums[0] > 0.0) {
            best_read =
                std::max(best_read, static_cast<double>(read_floats * sizeof(float)) / seconds);
        }
    }
    const double bound = best_read / static_cast<double>(weight_bytes);
    std::printf(
        "{\"bench\":\"bandwidth\",\"config\":\"%s\",\"weight_bytes_per_token\":%zu,"
        "\"copy_bandwidth_bytes_per_s\":%.0f,\"read_bandwidth_bytes_per_s\":%.0f,"
        "\"bandwidth_bound_tokens_per_s\":%.2f,\"decode_fraction_of_bound\":%.3f}\n",
        config->name, weight_bytes, copy_bandwidth, best_read, bound,
        (static_cast<double>(steps) / decode_s) / bound);
    return 0;
}
