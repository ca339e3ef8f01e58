// Tokenizer contract (docs/ARCHITECTURE.md, 'Tokenizers'): the method values and names, the factory
// and state restore, the byte method, hand-computed BPE training and encoding, strict UTF-8 and
// binary-safe round trips, the per-method queries, and every rejection rule (each error test
// also checks that the tokenizer is unchanged).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "riftco_transformer/data/bpe_reference.hpp"
#include "riftco_transformer/data/bpe_tokenizer.hpp"
#include "riftco_transformer/data/bpe_training.hpp"
#include "riftco_transformer/data/byte_tokenizer.hpp"
#include "riftco_transformer/data/tokenizer.hpp"
#include "riftco_transformer/data/tokenizer_factory.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::throws;

using Bytes = std::vector<std::uint8_t>;
using Ids = std::vector<TokenId>;
using Rules = std::vector<BpeMergeRule>;

Bytes bytes_of(std::string_view text) {
    return {text.begin(), text.end()};
}

// Throws like `throws`, and the tokenizer's state and an encode/decode round trip are the
// same afterwards.
template <typename Error, typename Action>
::testing::AssertionResult rejects_without_change(const Tokenizer& tokenizer, Action&& action,
                                                  std::string_view fragment,
                                                  std::string_view probe = "ab") {
    const TokenizerState before = tokenizer.state();
    const Ids probe_ids = tokenizer.encode_bytes(bytes_of(probe));
    ::testing::AssertionResult result = throws<Error>(action, fragment);
    if (!result) {
        return result;
    }
    if (tokenizer.state() != before) {
        return ::testing::AssertionFailure() << "state changed";
    }
    if (tokenizer.encode_bytes(bytes_of(probe)) != probe_ids ||
        tokenizer.decode_bytes(probe_ids) != bytes_of(probe)) {
        return ::testing::AssertionFailure() << "behaviour changed";
    }
    return ::testing::AssertionSuccess();
}

// ---- method values and names ------------------------------------------------------------

TEST(TokenizerMethod, StableValuesAndNames) {
    EXPECT_EQ(static_cast<std::int32_t>(TokenizerMethod::Byte), 0);
    EXPECT_EQ(static_cast<std::int32_t>(TokenizerMethod::Bpe), 1);
    EXPECT_EQ(tokenizer_method_name(TokenizerMethod::Byte), "byte");
    EXPECT_EQ(tokenizer_method_name(TokenizerMethod::Bpe), "bpe");
    EXPECT_EQ(parse_tokenizer_method("byte"), TokenizerMethod::Byte);
    EXPECT_EQ(parse_tokenizer_method("bpe"), TokenizerMethod::Bpe);
    EXPECT_EQ(tokenizer_method_from_value(0), TokenizerMethod::Byte);
    EXPECT_EQ(tokenizer_method_from_value(1), TokenizerMethod::Bpe);
}

TEST(TokenizerMethod, RejectsUnknownValuesAndNames) {
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)tokenizer_method_from_value(2); },
                                              "value 2 is unknown"));
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)tokenizer_method_from_value(-1); },
                                              "value -1 is unknown"));
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)parse_tokenizer_method("BPE"); },
                                              "name \"BPE\" is unknown"));
    EXPECT_TRUE(
        throws<std::invalid_argument>([] { (void)parse_tokenizer_method(""); }, "is unknown"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] { (void)tokenizer_method_name(static_cast<TokenizerMethod>(7)); },
        "method value 7 is unknown"));
}

TEST(TokenizerText, BytesViewKeepsEmbeddedNul) {
    const std::string text("a\0b", 3);
    const std::span<const std::uint8_t> view = text_bytes(text);
    EXPECT_EQ(Bytes(view.begin(), view.end()), (Bytes{'a', 0x00, 'b'}));
}

// ---- byte method --------------------------------------------------------------------------

TEST(ByteTokenizer, IdsFollowAscendingByteValues) {
    const ByteTokenizer tokenizer(bytes_of("cab\nab"));  // header example: {0x0A,'a','b','c'}
    EXPECT_EQ(tokenizer.method(), TokenizerMethod::Byte);
    EXPECT_EQ(tokenizer.vocabulary_size(), 4U);
    EXPECT_EQ(tokenizer.byte_vocabulary(), (Bytes{0x0A, 'a', 'b', 'c'}));
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("abc\n")), (Ids{1, 2, 3, 0}));
    EXPECT_EQ(tokenizer.decode_bytes(Ids{3, 0, 1}), bytes_of("c\na"));
    EXPECT_EQ(tokenizer.token_bytes(2), (Bytes{'b'}));
    EXPECT_EQ(tokenizer.vocabulary(), (std::vector<Bytes>{{0x0A}, {'a'}, {'b'}, {'c'}}));
}

TEST(ByteTokenizer, CorpusOrderAndMultiplicityAreIrrelevant) {
    const ByteTokenizer first(bytes_of("cccbbba"));
    const ByteTokenizer second(bytes_of("abc"));
    EXPECT_EQ(first.state(), second.state());
    EXPECT_EQ(first.byte_vocabulary(), bytes_of("abc"));
}

TEST(ByteTokenizer, AllByteValuesRoundTripBinarySafe) {
    Bytes every_byte(256);
    for (std::size_t value = 0; value < 256; ++value) {
        every_byte[value] = static_cast<std::uint8_t>(255 - value);
    }
    const ByteTokenizer tokenizer(every_byte);
    ASSERT_EQ(tokenizer.vocabulary_size(), 256U);
    const Bytes binary{0x00, 0xFF, 0x00, 0x7F, 0x80, 0x00};
    const Ids ids = tokenizer.encode_bytes(binary);
    EXPECT_EQ(ids, (Ids{0, 255, 0, 127, 128, 0}));
    EXPECT_EQ(tokenizer.decode_bytes(ids), binary);
}

TEST(ByteTokenizer, EmptyInputsGiveEmptyOutputs) {
    const ByteTokenizer tokenizer(bytes_of("ab"));
    EXPECT_TRUE(tokenizer.encode_bytes({}).empty());
    EXPECT_TRUE(tokenizer.decode_bytes({}).empty());
    EXPECT_EQ(tokenizer.decode(Ids{}), "");
}

TEST(ByteTokenizer, RejectsEmptyCorpus) {
    EXPECT_TRUE(
        throws<std::invalid_argument>([] { ByteTokenizer tokenizer(Bytes{}); }, "corpus is empty"));
}

TEST(ByteTokenizer, RejectsByteOutsideVocabularyWithoutChange) {
    const ByteTokenizer tokenizer(bytes_of("abc"));
    EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
        tokenizer, [&] { (void)tokenizer.encode_bytes(bytes_of("abz")); },
        "bytes[2] = 0x7a is not in the vocabulary"));
    EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
        tokenizer, [&] { (void)tokenizer.encode("ca\n"); }, "bytes[2] = 0x0a"));
}

TEST(ByteTokenizer, RejectsUnknownIdsWithoutChange) {
    const ByteTokenizer tokenizer(bytes_of("abc"));
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer,
        [&] {
            (void)tokenizer.decode_bytes(Ids{0, 3});
        },
        "ids[1] = 3 is out of range (vocabulary size 3)"));
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer, [&] { (void)tokenizer.decode(Ids{0xFFFFFFFFU}); }, "ids[0] = 4294967295"));
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer, [&] { (void)tokenizer.token_bytes(3); }, "id = 3 is out of range"));
}

TEST(ByteTokenizer, RejectsMergeQueries) {
    const ByteTokenizer tokenizer(bytes_of("abc"));
    EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
        tokenizer, [&] { (void)tokenizer.merge_count(); }, "only the bpe method"));
    EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
        tokenizer, [&] { (void)tokenizer.merge_rule(0); }, "(method is byte)"));
    EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
        tokenizer, [&] { (void)tokenizer.merge_rules(); }, "only the bpe method"));
}

TEST(ByteTokenizer, RestoresAnyOrderedVocabulary) {
    // index = id, not necessarily ascending.
    const ByteTokenizer tokenizer = ByteTokenizer::from_byte_vocabulary(bytes_of("ca\n"));
    EXPECT_EQ(tokenizer.byte_vocabulary(), bytes_of("ca\n"));
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("a\nc")), (Ids{1, 2, 0}));
    EXPECT_EQ(tokenizer.state().byte_vocabulary, bytes_of("ca\n"));
    Bytes all(256);
    for (std::size_t value = 0; value < 256; ++value) {
        all[value] = static_cast<std::uint8_t>(value);
    }
    EXPECT_EQ(ByteTokenizer::from_byte_vocabulary(all).vocabulary_size(), 256U);
}

TEST(ByteTokenizer, RestoreRejectsEmptyOversizedAndDuplicateVocabularies) {
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)ByteTokenizer::from_byte_vocabulary({}); },
                                              "byte_vocabulary is empty"));
    Bytes oversized(257);
    for (std::size_t i = 0; i < oversized.size(); ++i) {
        oversized[i] = static_cast<std::uint8_t>(i);
    }
    EXPECT_TRUE(
        throws<std::invalid_argument>([&] { (void)ByteTokenizer::from_byte_vocabulary(oversized); },
                                      "has 257 entries (at most 256)"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] { (void)ByteTokenizer::from_byte_vocabulary(bytes_of("abca")); },
        "byte_vocabulary[3] repeats byte 0x61 of byte_vocabulary[0]"));
}

// ---- BPE: hand-computed training ----------------------------------------------------------
// Each case is traced by hand in its comment and checked on both trainers and the tokenizer.

void expect_merges(std::string_view corpus, BpeTrainingOptions options, const Rules& expected) {
    EXPECT_EQ(learn_bpe_merges(bytes_of(corpus), options), expected) << "fast: " << corpus;
    EXPECT_EQ(learn_bpe_merges_reference(bytes_of(corpus), options), expected)
        << "reference: " << corpus;
    EXPECT_EQ(BpeTokenizer(bytes_of(corpus), options).merge_rules(), expected)
        << "tokenizer: " << corpus;
}

TEST(BpeTraining, RepeatedAbLearnsOneMergeAndEncodesToFourTokens) {
    // bpe_tokenizer.hpp's example: (a,b) occurs 4 times, (b,a) 3 times: 256 = "ab".
    const BpeTokenizer tokenizer(bytes_of("abababab"), {257, 2});
    EXPECT_EQ(tokenizer.merge_rules(), (Rules{{'a', 'b', 256}}));
    EXPECT_EQ(tokenizer.vocabulary_size(), 257U);
    EXPECT_EQ(tokenizer.token_bytes(256), bytes_of("ab"));
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("abababab")), (Ids{256, 256, 256, 256}));
    EXPECT_EQ(tokenizer.decode_bytes(Ids{256, 256, 256, 256}), bytes_of("abababab"));
}

TEST(BpeTraining, CountsOverlappingPairs) {
    // "aaa" holds (a,a) twice (overlapping windows), reaching frequency 2; a non-overlapping
    // count would see it once and learn nothing. After the merge: [256, a], (256,a) once.
    expect_merges("aaa", {1000, 2}, Rules{{'a', 'a', 256}});
}

TEST(BpeTraining, ReplacesLeftToRightWithoutOverlap) {
    // "aaaaa": (a,a)=4 -> 256; left-to-right gives [256,256,a] (right-to-left would give
    // [a,256,256]). Then (256,256)=1 and (256,a)=1 tie -> smaller (256,97) -> 257: [256,257].
    // Then (256,257) -> 258.
    expect_merges("aaaaa", {1000, 1}, Rules{{'a', 'a', 256}, {256, 'a', 257}, {256, 257, 258}});
    // "aaaa": (a,a)=3 -> [256,256] -> (256,256) -> 257.
    expect_merges("aaaa", {1000, 1}, Rules{{'a', 'a', 256}, {256, 256, 257}});
    expect_merges("aaaa", {1000, 2}, Rules{{'a', 'a', 256}});
}

TEST(BpeTraining, BreaksTiesTowardsSmallestPair) {
    // All pairs occur once. "cdab": (a,b) wins although it comes last.
    expect_merges("cdab", {257, 1}, Rules{{'a', 'b', 256}});
    // Same left id: (a,b) < (a,c).
    expect_merges("acab", {257, 1}, Rules{{'a', 'b', 256}});
    // "baab": (a,a) < (a,b) < (b,a) -> [b,256,b]; (98,256) < (256,98) -> [257,b]; -> 258.
    expect_merges("baab", {300, 1}, Rules{{'a', 'a', 256}, {'b', 256, 257}, {257, 'b', 258}});
}

TEST(BpeTraining, StopsBelowMinimumPairFrequency) {
    // "abab": (a,b)=2, (b,a)=1.
    expect_merges("abab", {1000, 3}, Rules{});
    expect_merges("abab", {1000, 2}, Rules{{'a', 'b', 256}});
    // min 1: [256,256] -> 257.
    expect_merges("abab", {1000, 1}, Rules{{'a', 'b', 256}, {256, 256, 257}});
}

TEST(BpeTraining, VocabularySizeIsACap) {
    expect_merges("abababab", {256, 1}, Rules{});
    expect_merges("abababab", {257, 1}, Rules{{'a', 'b', 256}});
    // "abababab" -> [256 x4] -> [257 x2] -> [258]: only three merges exist below any cap.
    expect_merges("abababab", {100000, 1},
                  Rules{{'a', 'b', 256}, {256, 256, 257}, {257, 257, 258}});
}

TEST(BpeTraining, OneSymbolCorpusLearnsNothing) {
    expect_merges("x", {1000, 1}, Rules{});
    const BpeTokenizer tokenizer(bytes_of("x"), {1000, 1});
    EXPECT_EQ(tokenizer.vocabulary_size(), 256U);
}

TEST(BpeTraining, MergesSpanSpacesAndNewlines) {
    // No pre-tokenizer: the most frequent pair is (' ', 'x'), across "words" and lines.
    expect_merges("a x\nb x\nc x", {257, 2}, Rules{{' ', 'x', 256}});
}

TEST(BpeTraining, BinaryCorpusWithNulAndFF) {
    // 00 FF 00 FF 00: (00,FF)=2, (FF,00)=2 tie -> (0,255) -> [256,256,00] -> (256,256)=1 and
    // (256,0)=1 -> (256,0) -> [256,257] -> 258.
    const std::string corpus("\x00\xFF\x00\xFF\x00", 5);
    expect_merges(corpus, {1000, 1}, Rules{{0, 255, 256}, {256, 0, 257}, {256, 257, 258}});
}

TEST(BpeTraining, RejectsInvalidInputs) {
    for (const auto& train : {learn_bpe_merges, learn_bpe_merges_reference}) {
        EXPECT_TRUE(
            throws<std::invalid_argument>([&] { (void)train(Bytes{}, {}); }, "corpus is empty"));
        EXPECT_TRUE(throws<std::invalid_argument>(
            [&] {
                (void)train(bytes_of("ab"), {255, 2});
            },
            "vocabulary_size is 255"));
        EXPECT_TRUE(throws<std::invalid_argument>(
            [&] {
                (void)train(bytes_of("ab"), {std::uint64_t{1} << 32U, 2});
            },
            "vocabulary_size is 4294967296 (must be in [256, 4294967295])"));
        EXPECT_TRUE(throws<std::invalid_argument>(
            [&] {
                (void)train(bytes_of("ab"), {512, 0});
            },
            "minimum_pair_frequency is 0"));
    }
    EXPECT_TRUE(
        throws<std::invalid_argument>([] { BpeTokenizer tokenizer(Bytes{}); }, "corpus is empty"));
}

TEST(BpeTraining, LargestVocabularySizeIsAccepted) {
    expect_merges("abab", {0xFFFFFFFFULL, 1}, Rules{{'a', 'b', 256}, {256, 256, 257}});
}

TEST(BpeTraining, DefaultsAreVocabulary512AndFrequency2) {
    const BpeTrainingOptions defaults;
    EXPECT_EQ(defaults.vocabulary_size, 512U);
    EXPECT_EQ(defaults.minimum_pair_frequency, 2U);
    // A corpus with far more than 256 learnable merges: a pseudo-random string twice, so
    // every pair of it occurs (at least) twice.
    Bytes half(3000);
    std::uint32_t state = 99;
    for (std::uint8_t& byte : half) {
        state = state * 1664525U + 1013904223U;
        byte = static_cast<std::uint8_t>(state >> 24U);
    }
    Bytes corpus = half;
    corpus.insert(corpus.end(), half.begin(), half.end());
    const BpeTokenizer tokenizer(corpus);
    EXPECT_EQ(tokenizer.merge_count(), 256U);
    EXPECT_EQ(tokenizer.merge_rules(), learn_bpe_merges_reference(corpus, {512, 2}));
}

// ---- BPE: encode, decode, queries -----------------------------------------------------------

TEST(BpeTokenizer, EncodesByRuleOrderNotByPosition) {
    // Rule 0 is (b,c), rule 1 is (a,b). "abc": rule 0 first -> [a, 256]; (a,b) is gone.
    // Merging the leftmost mergeable pair first would wrongly give [257, c].
    const Rules rules{{'b', 'c', 256}, {'a', 'b', 257}};
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(rules);
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("abc")), (Ids{'a', 256}));
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("abcab")), (Ids{'a', 256, 257}));
    EXPECT_EQ(encode_bpe_reference(bytes_of("abc"), rules), (Ids{'a', 256}));
}

TEST(BpeTokenizer, EncodesOverlapsLeftToRightAndChainsRules) {
    const BpeTokenizer tokenizer =
        BpeTokenizer::from_merge_rules(Rules{{'a', 'a', 256}, {'a', 256, 257}, {256, 'c', 258}});
    // "aaaaa": rule 0 -> [256,256,a]; rule 1 needs (a,256): absent; rule 2 absent.
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("aaaaa")), (Ids{256, 256, 'a'}));
    // "aaac": rule 0 -> [256, a, c]; rule 1 (a,256) absent; rule 2 (256,c) absent.
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("aaac")), (Ids{256, 'a', 'c'}));
    // "aaca": rule 0 -> [256, c, a]; rule 2 -> [258, a].
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("aaca")), (Ids{258, 'a'}));
    // "abaa": rule 0 -> [a, b, 256]; nothing else.
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("abaa")), (Ids{'a', 'b', 256}));
    // "aaa": rule 0 pairs the first two -> [256, a], so rule 1 (a,256) never applies (a
    // right-to-left pass would give [a, 256] and then [257]).
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("aaa")), (Ids{256, 'a'}));
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("baaa")), (Ids{'b', 256, 'a'}));
}

TEST(BpeTokenizer, EncodesEveryByteIncludingUnseenOnes) {
    const BpeTokenizer tokenizer(bytes_of("abababab"), {300, 2});
    const Bytes unseen{0x00, 0xFF, 'z', 0x80};
    EXPECT_EQ(tokenizer.encode_bytes(unseen), (Ids{0, 255, 'z', 128}));
    EXPECT_EQ(tokenizer.decode_bytes(Ids{0, 255, 'z', 128}), unseen);
    EXPECT_TRUE(tokenizer.encode_bytes({}).empty());
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("q")), (Ids{'q'}));
}

TEST(BpeTokenizer, PiecesConcatenateOperandPieces) {
    const BpeTokenizer tokenizer =
        BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 256}, {256, 'c', 257}, {257, 256, 258}});
    EXPECT_EQ(tokenizer.vocabulary_size(), 259U);
    EXPECT_EQ(tokenizer.token_bytes(0), (Bytes{0x00}));
    EXPECT_EQ(tokenizer.token_bytes(255), (Bytes{0xFF}));
    EXPECT_EQ(tokenizer.token_bytes(257), bytes_of("abc"));
    EXPECT_EQ(tokenizer.token_bytes(258), bytes_of("abcab"));
    EXPECT_EQ(tokenizer.decode_bytes(Ids{258, 0, 257}), bytes_of(std::string("abcab\0abc", 9)));
    const std::vector<Bytes> vocabulary = tokenizer.vocabulary();
    ASSERT_EQ(vocabulary.size(), 259U);
    for (std::size_t id = 0; id < 256; ++id) {
        EXPECT_EQ(vocabulary[id], (Bytes{static_cast<std::uint8_t>(id)}));
    }
    EXPECT_EQ(vocabulary[256], bytes_of("ab"));
    EXPECT_EQ(vocabulary[258], bytes_of("abcab"));
}

TEST(BpeTokenizer, MergeQueries) {
    const Rules rules{{'a', 'b', 256}, {256, 'c', 257}};
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(rules);
    EXPECT_EQ(tokenizer.method(), TokenizerMethod::Bpe);
    EXPECT_EQ(tokenizer.merge_count(), 2U);
    EXPECT_EQ(tokenizer.merge_rule(1), (BpeMergeRule{256, 'c', 257}));
    EXPECT_EQ(tokenizer.merge_rules(), rules);
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer, [&] { (void)tokenizer.merge_rule(2); }, "index 2 is out of range (2 merge"));
    EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
        tokenizer, [&] { (void)tokenizer.byte_vocabulary(); },
        "only the byte method supports this query (method is bpe)"));
}

TEST(BpeTokenizer, RejectsUnknownIdsWithoutChange) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 256}});
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer,
        [&] {
            (void)tokenizer.decode_bytes(Ids{256, 257});
        },
        "ids[1] = 257 is out of range (vocabulary size 257)"));
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer, [&] { (void)tokenizer.decode(Ids{1000}); }, "ids[0] = 1000"));
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer, [&] { (void)tokenizer.token_bytes(257); }, "id = 257 is out of range"));
}

// rules[i] = (x, x, 256+i) with x the previous id: piece 256+i is 2^(i+1) copies of 'a'.
Rules doubling_rules(std::size_t count) {
    Rules rules{{'a', 'a', 256}};
    for (TokenId i = 1; i < count; ++i) {
        rules.push_back({255 + i, 255 + i, 256 + i});
    }
    return rules;
}

TEST(BpeTokenizer, RejectsDecodedSizeOverflowWithoutChange) {
    // Valid by the restore rules, but piece 256+63 has 2^64 bytes and 256+61 has 2^62.
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(doubling_rules(64));
    EXPECT_EQ(tokenizer.vocabulary_size(), 320U);
    EXPECT_TRUE(rejects_without_change<std::overflow_error>(
        tokenizer, [&] { (void)tokenizer.token_bytes(256 + 63); }, "decoded size overflows"));
    EXPECT_TRUE(rejects_without_change<std::overflow_error>(
        tokenizer,
        [&] {
            (void)tokenizer.decode_bytes(Ids{'b', 256 + 63});
        },
        "at ids[1] = 319"));
    // Each piece fits, their sum does not.
    EXPECT_TRUE(rejects_without_change<std::overflow_error>(
        tokenizer,
        [&] {
            (void)tokenizer.decode_bytes(Ids{256 + 61, 256 + 61});
        },
        "at ids[1] = 317"));
    // Unknown ids are reported before sizes.
    EXPECT_TRUE(rejects_without_change<std::out_of_range>(
        tokenizer,
        [&] {
            (void)tokenizer.decode_bytes(Ids{256 + 63, 320});
        },
        "ids[1] = 320"));
    EXPECT_EQ(tokenizer.encode_bytes(bytes_of("aaaaaaaa")), (Ids{258}));
}

TEST(BpeTokenizer, DecodesPiecesLongerThanTheCache) {
    // Piece 256+22 has 2^23 bytes (8 MiB): beyond the 16 MiB cache of concatenated pieces
    // once the shorter ones are in it, so it is expanded through the rules.
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules(doubling_rules(24));
    const Bytes long_piece = tokenizer.token_bytes(256 + 22);
    EXPECT_EQ(long_piece, Bytes(std::size_t{1} << 23U, 'a'));
    Bytes expected(std::size_t{1} << 23U, 'a');
    expected.push_back('b');
    expected.insert(expected.end(), 8, 'a');
    EXPECT_EQ(tokenizer.decode_bytes(Ids{256 + 22, 'b', 258}), expected);
}

TEST(BpeTokenizer, RestoresZeroRulesAsPureByteVocabulary) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules({});
    EXPECT_EQ(tokenizer.vocabulary_size(), 256U);
    EXPECT_EQ(tokenizer.merge_count(), 0U);
    const Bytes binary{0x00, 'a', 0xFF};
    EXPECT_EQ(tokenizer.encode_bytes(binary), (Ids{0, 'a', 255}));
    EXPECT_EQ(tokenizer.decode_bytes(Ids{0, 'a', 255}), binary);
}

TEST(BpeTokenizer, RestoreRejectsWrongResultIds) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 257}});
        },
        "merge_rules[0] result is 257 (expected 256)"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 256}, {'b', 'c', 256}});
        },
        "merge_rules[1] result is 256 (expected 257)"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 255}});
        },
        "result is 255 (expected 256)"));
}

TEST(BpeTokenizer, RestoreRejectsOperandsNotBelowResult) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(Rules{{256, 'a', 256}});
        },
        "merge_rules[0] operands (256, 97) are not both below its result 256"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 256}, {'a', 258, 257}});
        },
        "merge_rules[1] operands (97, 258)"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 256}, {257, 'a', 257}});
        },
        "merge_rules[1] operands (257, 97)"));
}

TEST(BpeTokenizer, RestoreRejectsDuplicatePairs) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)BpeTokenizer::from_merge_rules(
                Rules{{'a', 'b', 256}, {'c', 'd', 257}, {'a', 'b', 258}});
        },
        "merge_rules[2] pair (97, 98) repeats merge_rules[0]"));
    // (b,a) is a different pair.
    EXPECT_EQ(BpeTokenizer::from_merge_rules(Rules{{'a', 'b', 256}, {'b', 'a', 257}}).merge_count(),
              2U);
}

TEST(BpeReference, EncodeValidatesItsMergeTable) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)encode_bpe_reference(bytes_of("ab"), Rules{{'a', 'b', 300}});
        },
        "encode_bpe_reference: merge_rules[0] result is 300"));
}

// ---- strict UTF-8 and binary safety ---------------------------------------------------------

TEST(TokenizerText, Utf8RoundTripsOnBothMethods) {
    // 1-, 2-, 3- and 4-byte sequences, embedded NUL, and the extreme valid code points
    // U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF.
    const std::string text = std::string("h\xC3\xA9llo \xE2\x82\xAC \xF0\x90\x8D\x88 a\0b ", 20) +
                             "\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
    const ByteTokenizer byte_tokenizer(text_bytes(text));
    const BpeTokenizer bpe_tokenizer(text_bytes(text + text), {400, 2});
    for (const Tokenizer* tokenizer : {static_cast<const Tokenizer*>(&byte_tokenizer),
                                       static_cast<const Tokenizer*>(&bpe_tokenizer)}) {
        const Ids ids = tokenizer->encode(text);
        EXPECT_EQ(ids, tokenizer->encode_bytes(text_bytes(text)));
        EXPECT_EQ(tokenizer->decode(ids), text);
    }
}

TEST(TokenizerText, DecodeValidatesTheConcatenatedBytes) {
    // The two halves of "é" are separate tokens; only their concatenation must be UTF-8.
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules({});
    EXPECT_EQ(tokenizer.decode(Ids{0xC3, 0xA9}), "\xC3\xA9");
}

struct IllFormed {
    std::string bytes;
    std::string problem;
};

std::vector<IllFormed> ill_formed_utf8() {
    return {
        {"ab\xFF", "invalid lead byte 0xff at byte 2"},
        {"\xF5\x80\x80\x80", "invalid lead byte 0xf5 at byte 0"},
        {"\x80", "unexpected continuation byte 0x80 at byte 0"},
        {"\xC0\xAF", "overlong two-byte lead byte 0xc0"},
        {"\xC1\xBF", "overlong two-byte lead byte 0xc1"},
        {"\xE0\x80\xAF", "overlong three-byte encoding (0xe0 0x80)"},
        {"\xF0\x8F\xBF\xBF", "overlong four-byte encoding (0xf0 0x8f)"},
        {"x\xED\xA0\x80", "surrogate code point (0xed 0xa0) at byte 1"},
        {"\xED\xBF\xBF", "surrogate code point"},
        {"\xF4\x90\x80\x80", "code point above U+10FFFF (0xf4 0x90)"},
        {"\xE2\x82", "truncated sequence after lead byte 0xe2 at byte 0"},
        {"\xF0\x90\x8D", "truncated sequence after lead byte 0xf0"},
        {"\xC3\x28", "missing continuation byte after lead byte 0xc3 (found 0x28)"},
        {"\xE2\x82\x41", "missing continuation byte after lead byte 0xe2 (found 0x41)"},
        {"\xE0\x41\x80", "missing continuation byte after lead byte 0xe0 (found 0x41)"},
    };
}

TEST(TokenizerText, EncodeRejectsIllFormedUtf8WithoutChange) {
    const BpeTokenizer tokenizer(bytes_of("abababab"), {300, 2});
    for (const IllFormed& sample : ill_formed_utf8()) {
        EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
            tokenizer, [&] { (void)tokenizer.encode(sample.bytes); },
            "Tokenizer::encode: text is not valid UTF-8 (" + sample.problem))
            << sample.problem;
        // The binary-safe path accepts the same bytes.
        const Ids ids = tokenizer.encode_bytes(text_bytes(sample.bytes));
        EXPECT_EQ(tokenizer.decode_bytes(ids), bytes_of(sample.bytes));
    }
}

TEST(TokenizerText, DecodeRejectsIllFormedUtf8WithoutChange) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules({});
    for (const IllFormed& sample : ill_formed_utf8()) {
        const Bytes bytes = bytes_of(sample.bytes);
        const Ids ids(bytes.begin(), bytes.end());  // byte ids
        EXPECT_TRUE(rejects_without_change<std::invalid_argument>(
            tokenizer, [&] { (void)tokenizer.decode(ids); },
            "Tokenizer::decode: decoded bytes are not valid UTF-8 (" + sample.problem))
            << sample.problem;
        EXPECT_EQ(tokenizer.decode_bytes(ids), bytes_of(sample.bytes));
    }
}

TEST(TokenizerText, DecodeReportsUnknownIdsBeforeUtf8) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_merge_rules({});
    EXPECT_TRUE(throws<std::out_of_range>(
        [&] {
            (void)tokenizer.decode(Ids{0xFF, 256});
        },
        "ids[1] = 256"));
}

TEST(TokenizerText, BinaryRoundTripOnTrainedBpe) {
    Bytes corpus;
    std::uint32_t state = 7;
    for (int i = 0; i < 4000; ++i) {
        state = state * 1664525U + 1013904223U;
        const std::uint8_t alphabet[] = {0x00, 0xFF, 0x00, 0x01, 0xFE, 0xFF};
        corpus.push_back(alphabet[(state >> 24U) % 6]);
    }
    const BpeTokenizer tokenizer(corpus, {600, 2});
    EXPECT_GT(tokenizer.merge_count(), 100U);
    const Ids ids = tokenizer.encode_bytes(corpus);
    EXPECT_LT(ids.size(), corpus.size() / 3);
    EXPECT_EQ(tokenizer.decode_bytes(ids), corpus);
}

// ---- factory and state -----------------------------------------------------------------------

TEST(TokenizerFactory, DefaultsToByteMethod) {
    const auto tokenizer = create_tokenizer(bytes_of("hello"));
    EXPECT_EQ(tokenizer->method(), TokenizerMethod::Byte);
    EXPECT_EQ(tokenizer->byte_vocabulary(), bytes_of("ehlo"));
}

TEST(TokenizerFactory, BuildsBpeWithDefaultsOrGivenOptions) {
    const Bytes corpus = bytes_of("hello hello hello world");
    const auto defaults = create_tokenizer(corpus, {TokenizerMethod::Bpe, {}, 2});
    EXPECT_EQ(defaults->method(), TokenizerMethod::Bpe);
    EXPECT_EQ(defaults->merge_rules(), learn_bpe_merges_reference(corpus, {512, 2}));
    const auto capped = create_tokenizer(corpus, {TokenizerMethod::Bpe, 258, 3});
    EXPECT_EQ(capped->merge_rules(), learn_bpe_merges_reference(corpus, {258, 3}));
    EXPECT_EQ(capped->vocabulary_size(), 258U);
}

TEST(TokenizerFactory, RejectsEmptyCorpusForBothMethods) {
    EXPECT_TRUE(
        throws<std::invalid_argument>([] { (void)create_tokenizer(Bytes{}); }, "corpus is empty"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(Bytes{}, {TokenizerMethod::Bpe, {}, 2});
        },
        "corpus is empty"));
}

TEST(TokenizerFactory, ByteMethodRejectsBpeOptions) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(bytes_of("ab"), {TokenizerMethod::Byte, 512, 2});
        },
        "vocabulary_size is 512 but the byte method takes none"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(bytes_of("ab"), {TokenizerMethod::Byte, {}, 3});
        },
        "minimum_pair_frequency is 3 but the byte method accepts only the default 2"));
}

TEST(TokenizerFactory, BpeRejectsOptionsOutOfRange) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(bytes_of("ab"), {TokenizerMethod::Bpe, 255, 2});
        },
        "vocabulary_size is 255 (must be in [256, 4294967295])"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(bytes_of("ab"),
                                   {TokenizerMethod::Bpe, std::uint64_t{1} << 32U, 2});
        },
        "vocabulary_size is 4294967296"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(bytes_of("ab"), {TokenizerMethod::Bpe, 300, 0});
        },
        "minimum_pair_frequency is 0 (must be at least 1)"));
}

TEST(TokenizerFactory, RejectsUnknownMethod) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)create_tokenizer(bytes_of("ab"), {static_cast<TokenizerMethod>(2), {}, 2});
        },
        "value 2 is unknown"));
}

TEST(TokenizerState, RestoreReproducesBothMethods) {
    const Bytes corpus = bytes_of("the cat sat on the mat; the cat ate the rat");
    for (const TokenizerMethod method : {TokenizerMethod::Byte, TokenizerMethod::Bpe}) {
        const TokenizerOptions options{method, {}, 2};
        const auto original = create_tokenizer(corpus, options);
        const auto restored = restore_tokenizer(original->state());
        EXPECT_EQ(restored->method(), method);
        EXPECT_EQ(restored->state(), original->state());
        EXPECT_EQ(restored->vocabulary(), original->vocabulary());
        EXPECT_EQ(restored->encode_bytes(corpus), original->encode_bytes(corpus));
    }
}

TEST(TokenizerState, ExposesExactState) {
    EXPECT_EQ(ByteTokenizer(bytes_of("ba")).state(),
              (TokenizerState{TokenizerMethod::Byte, bytes_of("ab"), {}}));
    EXPECT_EQ(BpeTokenizer(bytes_of("abab"), {300, 2}).state(),
              (TokenizerState{TokenizerMethod::Bpe, {}, Rules{{'a', 'b', 256}}}));
}

TEST(TokenizerState, RestoreRejectsMismatchedFields) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)restore_tokenizer(
                TokenizerState{TokenizerMethod::Byte, bytes_of("ab"), Rules{{'a', 'b', 256}}});
        },
        "byte state has 1 merge_rules"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)restore_tokenizer(
                TokenizerState{TokenizerMethod::Bpe, bytes_of("ab"), Rules{{'a', 'b', 256}}});
        },
        "bpe state has 2 byte_vocabulary entries"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)restore_tokenizer(
                TokenizerState{static_cast<TokenizerMethod>(9), bytes_of("ab"), {}});
        },
        "value 9 is unknown"));
}

TEST(TokenizerState, RestoreAppliesEachMethodsRules) {
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)restore_tokenizer(TokenizerState{TokenizerMethod::Byte, {}, {}});
        },
        "byte_vocabulary is empty"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)restore_tokenizer(TokenizerState{TokenizerMethod::Byte, bytes_of("aa"), {}});
        },
        "repeats byte 0x61"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] {
            (void)restore_tokenizer(TokenizerState{TokenizerMethod::Bpe, {}, Rules{{1, 2, 3}}});
        },
        "result is 3 (expected 256)"));
    EXPECT_EQ(restore_tokenizer(TokenizerState{TokenizerMethod::Bpe, {}, {}})->vocabulary_size(),
              256U);
}

TEST(TokenizerState, CopiesAreIndependentValues) {
    auto original =
        std::make_unique<BpeTokenizer>(bytes_of("abababab"), BpeTrainingOptions{300, 2});
    const BpeTokenizer copy = *original;
    const TokenizerState state = original->state();
    original.reset();
    EXPECT_EQ(copy.state(), state);
    EXPECT_EQ(copy.encode_bytes(bytes_of("abab")), (Ids{257}));
}

}  // namespace
}  // namespace riftco_transformer
