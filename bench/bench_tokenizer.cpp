// BPE throughput report: trains the fast trainer on a ~10 MB corpus (the bundled texts
// repeated), encodes and decodes that corpus, and times the literal references on a prefix to
// show the speedup. Prints figures; the exit status is nonzero only if an output differs from
// its reference (a benchmark never judges time).
//
//   riftco_bench_tokenizer [--corpus-dir DIR] [--megabytes 10] [--merges 4096]
//                          [--reference-kilobytes 200] [--reference-merges 256]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/data/bpe_reference.hpp"
#include "riftco_transformer/data/bpe_tokenizer.hpp"
#include "riftco_transformer/data/bpe_training.hpp"

#ifndef RIFTCO_TRANSFORMER_DEFAULT_CORPUS_DIR
#define RIFTCO_TRANSFORMER_DEFAULT_CORPUS_DIR "data/corpus"
#endif

namespace {

using riftco_transformer::BpeMergeRule;
using riftco_transformer::BpeTokenizer;
using riftco_transformer::TokenId;
using Bytes = std::vector<std::uint8_t>;
using Clock = std::chrono::steady_clock;

struct Settings {
    std::filesystem::path corpus_directory = RIFTCO_TRANSFORMER_DEFAULT_CORPUS_DIR;
    std::size_t corpus_bytes = std::size_t{10} * 1000 * 1000;
    std::uint64_t merges = 4096;
    std::size_t reference_bytes = std::size_t{200} * 1000;
    std::uint64_t reference_merges = 256;
};

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

double peak_resident_mib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// Every *.txt of `directory` in name order, concatenated and repeated to exactly `size` bytes.
Bytes build_corpus(const std::filesystem::path& directory, std::size_t size) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
        if (entry.is_regular_file() && entry.path().extension() == ".txt") {
            files.push_back(entry.path());
        }
    }
    std::sort(files.begin(), files.end());
    Bytes unit;
    for (const auto& file : files) {
        std::ifstream stream(file, std::ios::binary);
        unit.insert(unit.end(), std::istreambuf_iterator<char>(stream),
                    std::istreambuf_iterator<char>());
        std::printf("  source  %s (%zu bytes)\n", file.filename().c_str(),
                    static_cast<std::size_t>(std::filesystem::file_size(file)));
    }
    if (unit.empty()) {
        std::fprintf(stderr, "no .txt files with content in %s\n", directory.c_str());
        std::exit(2);
    }
    Bytes corpus;
    corpus.reserve(size);
    while (corpus.size() < size) {
        const std::size_t take = std::min(unit.size(), size - corpus.size());
        corpus.insert(corpus.end(), unit.begin(), unit.begin() + static_cast<std::ptrdiff_t>(take));
    }
    return corpus;
}

Settings parse(int argc, char** argv) {
    Settings settings;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "missing value after %s\n", argv[i]);
            std::exit(2);
        }
        const char* value = argv[++i];
        if (flag == "--corpus-dir") {
            settings.corpus_directory = value;
        } else if (flag == "--megabytes") {
            settings.corpus_bytes = static_cast<std::size_t>(std::atof(value) * 1e6);
        } else if (flag == "--merges") {
            settings.merges = std::strtoull(value, nullptr, 10);
        } else if (flag == "--reference-kilobytes") {
            settings.reference_bytes = static_cast<std::size_t>(std::atof(value) * 1e3);
        } else if (flag == "--reference-merges") {
            settings.reference_merges = std::strtoull(value, nullptr, 10);
        } else {
            std::fprintf(stderr, "unknown option %s\n", argv[i - 1]);
            std::exit(2);
        }
    }
    return settings;
}

}  // namespace

int main(int argc, char** argv) {
    const Settings settings = parse(argc, argv);
    int status = 0;

    std::printf("corpus\n");
    const Bytes corpus = build_corpus(settings.corpus_directory, settings.corpus_bytes);
    std::printf("  total   %zu bytes (%.2f MB)\n\n", corpus.size(),
                static_cast<double>(corpus.size()) / 1e6);

    // ---- fast trainer and priority-queue encoder on the whole corpus ----
    auto start = Clock::now();
    const std::vector<BpeMergeRule> rules =
        riftco_transformer::learn_bpe_merges(corpus, {256 + settings.merges, 2});
    const double train_seconds = seconds_since(start);
    std::printf("fast trainer (incremental pair counts + indexed heap)\n");
    std::printf("  learn   %zu merges (cap %llu, min frequency 2) in %.3f s\n", rules.size(),
                static_cast<unsigned long long>(settings.merges), train_seconds);

    start = Clock::now();
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(rules);
    std::printf("  build   tokenizer tables in %.3f s\n", seconds_since(start));

    start = Clock::now();
    const std::vector<TokenId> ids = tokenizer.encode_bytes(corpus);
    const double encode_seconds = seconds_since(start);
    std::printf("priority-queue encoder\n");
    std::printf(
        "  encode  %zu bytes -> %zu tokens (%.2f bytes/token) in %.3f s: %.2f MB/s, "
        "%.0f tokens/s\n",
        corpus.size(), ids.size(),
        static_cast<double>(corpus.size()) / static_cast<double>(ids.size()), encode_seconds,
        static_cast<double>(corpus.size()) / 1e6 / encode_seconds,
        static_cast<double>(ids.size()) / encode_seconds);

    start = Clock::now();
    const Bytes decoded = tokenizer.decode_bytes(ids);
    const double decode_seconds = seconds_since(start);
    std::printf("  decode  %zu tokens in %.3f s: %.0f tokens/s, round trip %s\n", ids.size(),
                decode_seconds, static_cast<double>(ids.size()) / decode_seconds,
                decoded == corpus ? "exact" : "DIFFERS");
    if (decoded != corpus) {
        status = 1;
    }

    // ---- literal references on a prefix ----
    const std::size_t prefix_size = std::min(settings.reference_bytes, corpus.size());
    const std::span<const std::uint8_t> prefix(corpus.data(), prefix_size);
    std::printf("\nreferences on a %zu-byte prefix\n", prefix_size);
    const riftco_transformer::BpeTrainingOptions prefix_options{256 + settings.reference_merges, 2};
    start = Clock::now();
    const std::vector<BpeMergeRule> reference_rules =
        riftco_transformer::learn_bpe_merges_reference(prefix, prefix_options);
    const double reference_train_seconds = seconds_since(start);
    start = Clock::now();
    const std::vector<BpeMergeRule> fast_rules =
        riftco_transformer::learn_bpe_merges(prefix, prefix_options);
    const double fast_train_seconds = seconds_since(start);
    std::printf("  learn   %zu merges: reference %.3f s, fast %.4f s (%.0fx), merges %s\n",
                reference_rules.size(), reference_train_seconds, fast_train_seconds,
                reference_train_seconds / fast_train_seconds,
                fast_rules == reference_rules ? "identical" : "DIFFER");
    if (fast_rules != reference_rules) {
        status = 1;
    }

    start = Clock::now();
    const std::vector<TokenId> reference_ids =
        riftco_transformer::encode_bpe_reference(prefix, rules);
    const double reference_encode_seconds = seconds_since(start);
    start = Clock::now();
    const std::vector<TokenId> fast_ids = tokenizer.encode_bytes(prefix);
    const double fast_encode_seconds = seconds_since(start);
    std::printf(
        "  encode  with all %zu merges: reference %.3f s, priority queue %.4f s (%.0fx), "
        "ids %s\n",
        rules.size(), reference_encode_seconds, fast_encode_seconds,
        reference_encode_seconds / fast_encode_seconds,
        fast_ids == reference_ids ? "identical" : "DIFFER");
    if (fast_ids != reference_ids) {
        status = 1;
    }

    std::printf("\npeak resident memory %.0f MiB\n", peak_resident_mib());
    return status;
}
