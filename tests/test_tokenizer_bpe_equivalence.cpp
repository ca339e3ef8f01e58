// The fast BPE trainer (incremental pair counts, indexed heap) and the priority-queue encoder
// against their literal references (bpe_reference.hpp): identical merge tables and identical
// ids on bundled-corpus prefixes, random byte strings with repeats, overlapping runs, binary
// data, degenerate inputs, random valid merge tables, and both position widths.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe_fast.hpp"
#include "riftco_transformer/data/bpe_reference.hpp"
#include "riftco_transformer/data/bpe_tokenizer.hpp"
#include "riftco_transformer/data/bpe_training.hpp"

namespace riftco_transformer {
namespace {

using Bytes = std::vector<std::uint8_t>;
using Rules = std::vector<BpeMergeRule>;

Bytes bytes_of(std::string_view text) {
    return {text.begin(), text.end()};
}

Bytes repeat(std::string_view unit, std::size_t times) {
    Bytes out;
    for (std::size_t i = 0; i < times; ++i) {
        out.insert(out.end(), unit.begin(), unit.end());
    }
    return out;
}

// Deterministic bytes drawn from `alphabet` (a small LCG: reproducible everywhere).
Bytes random_bytes(std::size_t count, const Bytes& alphabet, std::uint32_t seed) {
    Bytes out(count);
    std::uint32_t state = seed;
    for (std::uint8_t& byte : out) {
        state = state * 1664525U + 1013904223U;
        byte = alphabet[(state >> 16U) % alphabet.size()];
    }
    return out;
}

Bytes all_byte_values() {
    Bytes out(256);
    for (std::size_t value = 0; value < 256; ++value) {
        out[value] = static_cast<std::uint8_t>(value);
    }
    return out;
}

// The bundled corpus directory: $RIFTCO_TRANSFORMER_CORPUS_DIR, else data/corpus found from
// the working directory upwards (ctest runs inside the build tree), else beside this file.
std::filesystem::path corpus_directory() {
    if (const char* configured = std::getenv("RIFTCO_TRANSFORMER_CORPUS_DIR")) {
        return configured;
    }
    const std::filesystem::path relative = std::filesystem::path("data") / "corpus";
    for (std::filesystem::path at = std::filesystem::current_path(); !at.empty();
         at = at.parent_path()) {
        if (std::filesystem::is_directory(at / relative)) {
            return at / relative;
        }
        if (at == at.parent_path()) {
            break;
        }
    }
    return std::filesystem::absolute(std::filesystem::path(__FILE__)).parent_path().parent_path() /
           relative;
}

Bytes corpus_prefix(std::string_view file_name, std::size_t length) {
    const std::filesystem::path path = corpus_directory() / file_name;
    std::ifstream stream(path, std::ios::binary);
    if (!stream) {
        ADD_FAILURE() << "cannot open " << path
                      << " (set RIFTCO_TRANSFORMER_CORPUS_DIR to the repository's data/corpus)";
        return {};
    }
    Bytes bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
    EXPECT_GE(bytes.size(), length) << path;
    bytes.resize(std::min(bytes.size(), length));
    return bytes;
}

// Both trainers (and both position widths of the fast one) learn the same table.
::testing::AssertionResult trainers_agree(const Bytes& corpus, BpeTrainingOptions options,
                                          std::size_t minimum_merges = 0) {
    const Rules expected = learn_bpe_merges_reference(corpus, options);
    if (expected.size() < minimum_merges) {
        return ::testing::AssertionFailure()
               << "weak case: only " << expected.size() << " merges learned";
    }
    const Rules fast = learn_bpe_merges(corpus, options);
    const Rules wide = detail::learn_bpe_merges_incremental<std::uint64_t>(corpus, options);
    for (const Rules* actual : {&fast, &wide}) {
        const char* name = actual == &fast ? "fast" : "fast (64-bit positions)";
        if (*actual == expected) {
            continue;
        }
        std::size_t first = 0;
        while (first < actual->size() && first < expected.size() &&
               (*actual)[first] == expected[first]) {
            ++first;
        }
        ::testing::AssertionResult failure = ::testing::AssertionFailure();
        failure << name << " learned " << actual->size() << " merges, reference " << expected.size()
                << "; first difference at rule " << first;
        if (first < actual->size() && first < expected.size()) {
            failure << ": (" << (*actual)[first].left << "," << (*actual)[first].right << ") vs ("
                    << expected[first].left << "," << expected[first].right << ")";
        }
        return failure;
    }
    return ::testing::AssertionSuccess();
}

// The priority-queue encoder gives the reference's ids, at both position widths, and the
// tokenizer decodes them back.
::testing::AssertionResult encoders_agree(const Rules& rules, const Bytes& text) {
    const std::vector<TokenId> expected = encode_bpe_reference(text, rules);
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(rules);
    const std::vector<TokenId> fast = tokenizer.encode_bytes(text);
    const detail::BpeRankTable ranks(rules);
    const std::vector<TokenId> wide =
        detail::encode_with_merge_queue<std::uint64_t>(text, rules, ranks);
    if (fast != expected || wide != expected) {
        return ::testing::AssertionFailure()
               << "ids differ for a text of " << text.size() << " bytes (reference "
               << expected.size() << " ids, fast " << fast.size() << ", 64-bit " << wide.size()
               << ")";
    }
    if (tokenizer.decode_bytes(fast) != text) {
        return ::testing::AssertionFailure() << "round trip failed";
    }
    return ::testing::AssertionSuccess();
}

// ---- training -----------------------------------------------------------------------------

TEST(BpeEquivalence, TrainersAgreeOnBundledCorpusPrefixes) {
    for (const char* file : {"alice_in_wonderland.txt", "as_you_like_it.txt"}) {
        const Bytes text = corpus_prefix(file, 12000);
        EXPECT_TRUE(trainers_agree(text, {256 + 400, 2}, 300)) << file;
        EXPECT_TRUE(trainers_agree(text, {256 + 150, 5}, 100)) << file;
    }
    // Both texts as one corpus, with the frequency threshold 1 (merges run until rare pairs).
    Bytes joined = corpus_prefix("alice_in_wonderland.txt", 3000);
    const Bytes second = corpus_prefix("as_you_like_it.txt", 3000);
    joined.insert(joined.end(), second.begin(), second.end());
    EXPECT_TRUE(trainers_agree(joined, {256 + 600, 1}, 600));
}

TEST(BpeEquivalence, TrainersAgreeOnRandomBytesWithRepeats) {
    const std::vector<Bytes> alphabets{bytes_of("ab"),   bytes_of("abc"),    bytes_of("aab"),
                                       bytes_of("abcd"), bytes_of("aaaaab"), bytes_of("abcdefghij"),
                                       all_byte_values()};
    std::uint32_t seed = 1;
    for (const Bytes& alphabet : alphabets) {
        for (const std::size_t length : {2U, 3U, 17U, 300U, 2500U}) {
            const Bytes text = random_bytes(length, alphabet, seed++);
            for (const std::uint64_t frequency : {1U, 2U, 3U, 7U}) {
                EXPECT_TRUE(trainers_agree(text, {100000, frequency}))
                    << "alphabet " << alphabet.size() << ", length " << length << ", frequency "
                    << frequency;
            }
        }
    }
}

TEST(BpeEquivalence, TrainersAgreeOnRepeatedBlocksOfRandomText) {
    // A random block repeated with random separators: many equal counts, so the tie rule
    // decides most merges.
    for (std::uint32_t seed = 1; seed <= 6; ++seed) {
        const Bytes block = random_bytes(40, bytes_of("abcdef"), seed);
        Bytes text;
        for (std::uint32_t k = 0; k < 30; ++k) {
            text.insert(text.end(), block.begin(), block.end());
            const Bytes separator = random_bytes(1 + k % 3, bytes_of("xy\n"), seed * 100 + k);
            text.insert(text.end(), separator.begin(), separator.end());
        }
        EXPECT_TRUE(trainers_agree(text, {100000, 2}, 30)) << "seed " << seed;
        EXPECT_TRUE(trainers_agree(text, {100000, 1}, 30)) << "seed " << seed;
    }
}

TEST(BpeEquivalence, TrainersAgreeOnOverlappingRuns) {
    // Runs of one byte are where overlapping counts and non-overlapping replacement differ.
    for (const std::size_t length : {2U, 3U, 4U, 5U, 7U, 8U, 9U, 64U, 127U, 1000U}) {
        for (const std::uint64_t frequency : {1U, 2U, 3U}) {
            EXPECT_TRUE(trainers_agree(repeat("a", length), {100000, frequency}))
                << "a x " << length << ", frequency " << frequency;
        }
    }
    // Runs of increasing length separated by b: a b aa b aaa b ...
    Bytes runs;
    for (std::size_t length = 1; length <= 40; ++length) {
        runs.insert(runs.end(), length, 'a');
        runs.push_back('b');
    }
    EXPECT_TRUE(trainers_agree(runs, {100000, 1}, 20));
    EXPECT_TRUE(trainers_agree(runs, {100000, 2}, 10));
    // Periodic patterns.
    for (const char* unit : {"ab", "aab", "abb", "abc", "abab", "aabb", "abcabd"}) {
        EXPECT_TRUE(trainers_agree(repeat(unit, 200), {100000, 1})) << unit;
        EXPECT_TRUE(trainers_agree(repeat(unit, 200), {100000, 2})) << unit;
    }
}

TEST(BpeEquivalence, TrainersAgreeOnBinaryData) {
    const Bytes extremes{0x00, 0xFF};
    const Bytes mixed{0x00, 0xFF, 0x00, 0x01, 0xFE, 0xFF, 0x80};
    for (std::uint32_t seed = 1; seed <= 4; ++seed) {
        EXPECT_TRUE(trainers_agree(random_bytes(1500, extremes, seed), {100000, 2}, 20));
        EXPECT_TRUE(trainers_agree(random_bytes(1500, mixed, seed), {100000, 2}, 20));
        EXPECT_TRUE(trainers_agree(random_bytes(1500, mixed, seed), {100000, 1}, 20));
    }
    Bytes nul_runs = repeat(std::string_view("\x00\x00\x00\xFF", 4), 100);
    EXPECT_TRUE(trainers_agree(nul_runs, {100000, 1}, 5));
    EXPECT_TRUE(trainers_agree(all_byte_values(), {100000, 1}, 255));
}

TEST(BpeEquivalence, TrainersAgreeOnDegenerateInputsAndCaps) {
    EXPECT_TRUE(trainers_agree(bytes_of("z"), {100000, 1}));
    EXPECT_TRUE(trainers_agree(bytes_of("zz"), {100000, 1}, 1));
    EXPECT_TRUE(trainers_agree(bytes_of("zz"), {100000, 2}));
    const Bytes text = corpus_prefix("alice_in_wonderland.txt", 4000);
    for (const std::uint64_t cap : {256U, 257U, 258U, 300U, 511U}) {
        EXPECT_TRUE(trainers_agree(text, {cap, 2}, cap - 256)) << "cap " << cap;
    }
    // Thresholds above every count: nothing is learned.
    EXPECT_TRUE(trainers_agree(text, {100000, 100000}));
}

TEST(BpeEquivalence, TrainersRejectEmptyCorpusAlike) {
    EXPECT_THROW((void)learn_bpe_merges(Bytes{}, {}), std::invalid_argument);
    EXPECT_THROW((void)learn_bpe_merges_reference(Bytes{}, {}), std::invalid_argument);
}

// ---- encoding -------------------------------------------------------------------------------

TEST(BpeEquivalence, EncodersAgreeOnTrainedTables) {
    const Bytes corpus = corpus_prefix("alice_in_wonderland.txt", 12000);
    const Rules rules = learn_bpe_merges(corpus, {256 + 400, 2});
    ASSERT_GT(rules.size(), 300U);
    EXPECT_TRUE(encoders_agree(rules, corpus));
    const Bytes other = corpus_prefix("as_you_like_it.txt", 6000);
    EXPECT_TRUE(encoders_agree(rules, other));
    // Many substrings at odd offsets and lengths, so pieces start and end mid-merge.
    std::uint32_t state = 5;
    for (int i = 0; i < 200; ++i) {
        state = state * 1664525U + 1013904223U;
        const std::size_t begin = (state >> 8U) % corpus.size();
        const std::size_t length = 1 + (state >> 4U) % 97;
        const std::size_t end = std::min(corpus.size(), begin + length);
        EXPECT_TRUE(encoders_agree(rules, Bytes(corpus.begin() + static_cast<std::ptrdiff_t>(begin),
                                                corpus.begin() + static_cast<std::ptrdiff_t>(end))))
            << "substring " << begin << "+" << length;
    }
    // Bytes the corpus never had.
    EXPECT_TRUE(encoders_agree(rules, random_bytes(3000, all_byte_values(), 11)));
    EXPECT_TRUE(encoders_agree(rules, Bytes{}));
    EXPECT_TRUE(encoders_agree(rules, bytes_of("e")));
}

TEST(BpeEquivalence, EncodersAgreeOnRunsAndBinaryTables) {
    const Rules run_rules = learn_bpe_merges(repeat("a", 1000), {100000, 1});
    for (const std::size_t length : {1U, 2U, 3U, 5U, 6U, 7U, 31U, 33U, 999U, 1000U, 1001U, 3001U}) {
        EXPECT_TRUE(encoders_agree(run_rules, repeat("a", length))) << "a x " << length;
    }
    const Bytes binary = random_bytes(2000, Bytes{0x00, 0xFF, 0x01}, 3);
    const Rules binary_rules = learn_bpe_merges(binary, {100000, 2});
    EXPECT_TRUE(encoders_agree(binary_rules, binary));
    EXPECT_TRUE(encoders_agree(binary_rules, random_bytes(2000, Bytes{0x00, 0xFF, 0x01}, 4)));
}

// A random valid merge table over a small alphabet: operands drawn from everything defined
// so far (so long chains and rules that left-to-right passes rarely reach), pairs unique.
Rules random_merge_table(std::size_t count, const Bytes& alphabet, std::uint32_t seed) {
    std::vector<TokenId> defined(alphabet.begin(), alphabet.end());
    Rules rules;
    std::uint32_t state = seed;
    auto draw = [&](std::size_t bound) {
        state = state * 1664525U + 1013904223U;
        return static_cast<std::size_t>(state >> 8U) % bound;
    };
    while (rules.size() < count) {
        const TokenId left = defined[draw(defined.size())];
        const TokenId right = defined[draw(defined.size())];
        bool repeated = false;
        for (const BpeMergeRule& rule : rules) {
            repeated = repeated || (rule.left == left && rule.right == right);
        }
        if (repeated) {
            continue;
        }
        const auto result = static_cast<TokenId>(256 + rules.size());
        rules.push_back({left, right, result});
        defined.push_back(result);
    }
    return rules;
}

TEST(BpeEquivalence, EncodersAgreeOnRandomValidTables) {
    for (std::uint32_t seed = 1; seed <= 25; ++seed) {
        const Bytes alphabet = seed % 2 == 0 ? bytes_of("ab") : bytes_of("abc");
        const Rules rules = random_merge_table(5 + seed * 3, alphabet, seed);
        for (std::uint32_t text_seed = 0; text_seed < 8; ++text_seed) {
            const std::size_t length = 1 + (seed * 37 + text_seed * 101) % 400;
            EXPECT_TRUE(
                encoders_agree(rules, random_bytes(length, alphabet, seed * 1000 + text_seed)))
                << "table seed " << seed << ", text seed " << text_seed;
        }
    }
}

}  // namespace
}  // namespace riftco_transformer
