// PretrainedTokenizer and Pretokenizer on tiny vocabularies with hand-computed answers: the
// byte-level alphabet, each pre-tokenizer pattern on hand-picked strings, merge-rank order,
// special tokens (never merged, longest first, parsed or read as text), ignore_merges, dropped
// bytes, SentencePiece score order, dummy prefix and byte fallback, decoding, and every
// rejection rule. tests/python/test_pretrained_tokenizer_oracle.py compares real vocabularies
// with Hugging Face `tokenizers` and `sentencepiece`.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include "riftco_transformer/data/pretokenizer.hpp"
#include "riftco_transformer/data/pretrained_tokenizer.hpp"
#include "support/test_support.hpp"

namespace riftco_transformer {
namespace {

using testing::throws;

using Ids = std::vector<TokenId>;
using Pieces = std::vector<std::string_view>;
using Merges = std::vector<std::pair<std::string, std::string>>;

// Byte-level symbols used below (UTF-8 escapes keep the source ASCII).
const std::string space_symbol = "\xC4\xA0";    // 'Ġ' U+0120 stands for ' '
const std::string newline_symbol = "\xC4\x8A";  // 'Ċ' U+010A stands for '\n'
// SentencePiece's '▁' U+2581.
const std::string metaspace = "\xE2\x96\x81";

std::string symbol_of(std::uint8_t byte) {
    return byte_level_encode(std::string(1, static_cast<char>(byte)));
}

// Ids 0..255: the byte symbols in byte order (so a byte's id is its value); then `extra`
// Normal tokens from 256 on, then `specials` with their types.
PretrainedVocabulary byte_level_vocabulary(
    const std::vector<std::string>& extra, Merges merges,
    PretokenizerKind pretokenizer = PretokenizerKind::Gpt2,
    const std::vector<std::pair<std::string, TokenType>>& specials = {}) {
    PretrainedVocabulary vocabulary;
    vocabulary.model = PretrainedModelKind::ByteLevelBpe;
    vocabulary.pretokenizer = pretokenizer;
    for (unsigned byte = 0; byte < 256; ++byte) {
        vocabulary.tokens.push_back(symbol_of(static_cast<std::uint8_t>(byte)));
    }
    vocabulary.tokens.insert(vocabulary.tokens.end(), extra.begin(), extra.end());
    vocabulary.token_types.assign(vocabulary.tokens.size(), TokenType::Normal);
    for (const auto& [text, type] : specials) {
        vocabulary.tokens.push_back(text);
        vocabulary.token_types.push_back(type);
    }
    vocabulary.merges = std::move(merges);
    return vocabulary;
}

TokenId id_of(const PretrainedTokenizer& tokenizer, std::string_view text) {
    const auto id = tokenizer.find_token(text);
    EXPECT_TRUE(id.has_value()) << "no token " << text;
    return id.value_or(std::numeric_limits<TokenId>::max());
}

TokenId byte_id(char byte) {
    return static_cast<std::uint8_t>(byte);
}

// ---- The byte-level alphabet.

TEST(ByteLevelAlphabet, PrintableBytesStandForThemselves) {
    EXPECT_EQ(byte_level_symbol('!'), U'!');
    EXPECT_EQ(byte_level_symbol('~'), U'~');
    EXPECT_EQ(byte_level_symbol(0xA1), U'\u00A1');
    EXPECT_EQ(byte_level_symbol(0xAC), U'\u00AC');
    EXPECT_EQ(byte_level_symbol(0xAE), U'\u00AE');
    EXPECT_EQ(byte_level_symbol(0xFF), U'\u00FF');
}

TEST(ByteLevelAlphabet, OtherBytesTakeU0100OnwardInByteOrder) {
    EXPECT_EQ(byte_level_symbol(0x00), U'\u0100');
    EXPECT_EQ(byte_level_symbol('\n'), U'\u010A');
    EXPECT_EQ(byte_level_symbol(' '), U'\u0120');
    EXPECT_EQ(byte_level_symbol(0x7F), U'\u0121');
    EXPECT_EQ(byte_level_symbol(0x80), U'\u0122');
    EXPECT_EQ(byte_level_symbol(0xA0), U'\u0142');
    EXPECT_EQ(byte_level_symbol(0xAD), U'\u0143');
    EXPECT_EQ(byte_level_encode(" \n"), space_symbol + newline_symbol);
}

TEST(ByteLevelAlphabet, AllBytesRoundTrip) {
    std::string all_bytes;
    for (unsigned byte = 0; byte < 256; ++byte) {
        all_bytes.push_back(static_cast<char>(byte));
        EXPECT_EQ(byte_level_byte(byte_level_symbol(static_cast<std::uint8_t>(byte))), byte);
    }
    EXPECT_EQ(byte_level_decode(byte_level_encode(all_bytes)), all_bytes);
    EXPECT_FALSE(byte_level_byte(U'\u0144').has_value());
    EXPECT_FALSE(byte_level_byte(U' ').has_value());
}

TEST(ByteLevelAlphabet, DecodeRejectsCharactersOutsideItAndIllFormedUtf8) {
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)byte_level_decode("a\xC5\x84"); },
                                              "byte offset 1"));  // 'ń' U+0144
    EXPECT_TRUE(
        throws<std::invalid_argument>([] { (void)byte_level_decode("ab\xC4"); }, "byte offset 2"));
}

// ---- Pre-tokenizers.

Pieces split(PretokenizerKind kind, std::string_view text) {
    return Pretokenizer(kind).split(text);
}

TEST(Pretokenizer, Gpt2KeepsOneLeadingSpaceAndLeavesTheLastSpaceOfARun) {
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "I'll  go 42"),
              (Pieces{"I", "'ll", " ", " go", " 42"}));
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "x   "), (Pieces{"x", "   "}));
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "a\t\n\n b"), (Pieces{"a", "\t\n\n", " b"}));
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "!!! ?"), (Pieces{"!!!", " ?"}));
}

TEST(Pretokenizer, Gpt2ContractionsAreCaseSensitive) {
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "HE'S x"), (Pieces{"HE", "'", "S", " x"}));
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "we'd"), (Pieces{"we", "'d"}));
}

TEST(Pretokenizer, LettersAreUnicodeLettersButMarksAreNot) {
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "caf\xC3\xA9\xE6\x97\xA5\xE6\x9C\xAC"),
              (Pieces{"caf\xC3\xA9\xE6\x97\xA5\xE6\x9C\xAC"}));  // "café日本"
    EXPECT_EQ(split(PretokenizerKind::Gpt2, "e\xCC\x81"),
              (Pieces{"e", "\xCC\x81"}));  // e + U+0301 COMBINING ACUTE ACCENT
}

TEST(Pretokenizer, MongolianVowelSeparatorIsNotWhiteSpace) {
    // U+180E is a format character (Unicode >= 6.3); PCRE2's own \s would take it.
    EXPECT_EQ(split(PretokenizerKind::Gpt2,
                    "a\xE1\xA0\x8E"
                    "b"),
              (Pieces{"a", "\xE1\xA0\x8E", "b"}));
    EXPECT_EQ(split(PretokenizerKind::Gpt2, " \xE1\xA0\x8E"), (Pieces{" \xE1\xA0\x8E"}));
}

TEST(Pretokenizer, LettersOfUnicode16AreLetters) {
    // U+1C89 CYRILLIC CAPITAL LETTER TJE (Unicode 16.0) joins the letters around it.
    EXPECT_EQ(split(PretokenizerKind::Gpt2,
                    "a\xE1\xB2\x89"
                    "b"),
              (Pieces{"a\xE1\xB2\x89"
                      "b"}));
}

TEST(Pretokenizer, Llama3FoldsCaseOfContractionsAndGroupsThreeDigits) {
    EXPECT_EQ(split(PretokenizerKind::Llama3, "I'LL go"), (Pieces{"I", "'LL", " go"}));
    EXPECT_EQ(split(PretokenizerKind::Llama3, "1234567"), (Pieces{"123", "456", "7"}));
    EXPECT_EQ(split(PretokenizerKind::Llama3, "x 42"), (Pieces{"x", " ", "42"}));
}

TEST(Pretokenizer, Llama3AttachesOnePunctuationToWordsAndNewlinesToPunctuation) {
    EXPECT_EQ(split(PretokenizerKind::Llama3, "$hello"), (Pieces{"$hello"}));
    EXPECT_EQ(split(PretokenizerKind::Llama3, "x!!\n\ny"), (Pieces{"x", "!!\n\n", "y"}));
    EXPECT_EQ(split(PretokenizerKind::Llama3, "a\n\n b"), (Pieces{"a", "\n\n", " b"}));
    EXPECT_EQ(split(PretokenizerKind::Llama3, "  \n  x"), (Pieces{"  \n", " ", " x"}));
}

TEST(Pretokenizer, SmolLmSplitsEveryDigitAndNeverPrefixesOneWithASpace) {
    EXPECT_EQ(split(PretokenizerKind::SmolLm, "I'll  go 42"),
              (Pieces{"I", "'ll", " ", " go", " ", "4", "2"}));
    EXPECT_EQ(split(PretokenizerKind::SmolLm, "x 123y"), (Pieces{"x", " ", "1", "2", "3", "y"}));
    // The Gpt2 pattern sees "a  " alone: the run of spaces ends the stretch, so it stays whole.
    EXPECT_EQ(split(PretokenizerKind::SmolLm, "a  1"), (Pieces{"a", "  ", "1"}));
    EXPECT_EQ(split(PretokenizerKind::SmolLm, "\xC2\xBD\xE2\x85\xAB"),
              (Pieces{"\xC2\xBD", "\xE2\x85\xAB"}));  // "½Ⅻ": every \p{N}, not only 0-9
}

TEST(Pretokenizer, Qwen2IsLlama3WithSingleDigits) {
    EXPECT_EQ(split(PretokenizerKind::Qwen2, "1234567"),
              (Pieces{"1", "2", "3", "4", "5", "6", "7"}));
    EXPECT_EQ(split(PretokenizerKind::Qwen2, "x 42"), (Pieces{"x", " ", "4", "2"}));
    EXPECT_EQ(split(PretokenizerKind::Qwen2, "I'LL go"), (Pieces{"I", "'LL", " go"}));
    EXPECT_EQ(split(PretokenizerKind::Qwen2, "$hello"), (Pieces{"$hello"}));
    EXPECT_EQ(split(PretokenizerKind::Qwen2, "x!!\n\ny"), (Pieces{"x", "!!\n\n", "y"}));
    EXPECT_EQ(split(PretokenizerKind::Qwen2,
                    "\xC2\xBD"
                    "7"),
              (Pieces{"\xC2\xBD", "7"}));
}

TEST(Pretokenizer, PiecesConcatenateToTheTextOnLongRuns) {
    for (const PretokenizerKind kind : {PretokenizerKind::Gpt2, PretokenizerKind::Llama3,
                                        PretokenizerKind::SmolLm, PretokenizerKind::Qwen2}) {
        const std::string spaces(1 << 20, ' ');
        EXPECT_EQ(split(kind, spaces), (Pieces{spaces}));
        const std::string letters(1 << 20, 'a');
        EXPECT_EQ(split(kind, letters), (Pieces{letters}));
        EXPECT_TRUE(split(kind, "").empty());
    }
}

TEST(Pretokenizer, RejectsIllFormedUtf8WithoutAppending) {
    const Pretokenizer pretokenizer(PretokenizerKind::Gpt2);
    Pieces pieces{"kept"};
    EXPECT_TRUE(throws<std::invalid_argument>([&] { pretokenizer.split("\xC0\x80", pieces); },
                                              "byte offset 0"));
    EXPECT_TRUE(throws<std::invalid_argument>([&] { pretokenizer.split("ab\xE2\x82", pieces); },
                                              "byte offset 2"));
    EXPECT_TRUE(throws<std::invalid_argument>([&] { pretokenizer.split("\xED\xA0\x80", pieces); },
                                              "byte offset 0"));  // surrogate
    EXPECT_EQ(pieces, (Pieces{"kept"}));
}

TEST(Pretokenizer, GgufNamesMapToKinds) {
    EXPECT_EQ(pretokenizer_kind_from_gguf("gpt-2"), PretokenizerKind::Gpt2);
    EXPECT_EQ(pretokenizer_kind_from_gguf("llama-bpe"), PretokenizerKind::Llama3);
    EXPECT_EQ(pretokenizer_kind_from_gguf("llama3"), PretokenizerKind::Llama3);
    EXPECT_EQ(pretokenizer_kind_from_gguf("llama-v3"), PretokenizerKind::Llama3);
    EXPECT_EQ(pretokenizer_kind_from_gguf("smollm"), PretokenizerKind::SmolLm);
    EXPECT_EQ(pretokenizer_kind_from_gguf("qwen2"), PretokenizerKind::Qwen2);
    EXPECT_EQ(pretokenizer_kind_name(PretokenizerKind::SmolLm), "smollm");
    EXPECT_EQ(pretokenizer_kind_name(PretokenizerKind::Qwen2), "qwen2");
}

TEST(Pretokenizer, RejectsUnknownNamesAndKinds) {
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)pretokenizer_kind_from_gguf("falcon"); },
                                              "\"falcon\""));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] { (void)Pretokenizer(static_cast<PretokenizerKind>(9)); }, "kind value 9"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [] { (void)pretokenizer_kind_name(static_cast<PretokenizerKind>(-1)); }, "-1"));
}

// ---- Byte-level BPE.

TEST(ByteLevelBpe, MergesTheLowestRankPairFirst) {
    // "abc": (b,c) has rank 0 and (a,b) rank 1, so b+c merges first; no merge joins a and bc.
    const PretrainedTokenizer bc_first(
        byte_level_vocabulary({"bc", "ab", "abc"}, {{"b", "c"}, {"a", "b"}, {"ab", "c"}}));
    EXPECT_EQ(bc_first.encode("abc"), (Ids{byte_id('a'), 256}));
    // With (a,b) first, ab then ab+c.
    const PretrainedTokenizer ab_first(
        byte_level_vocabulary({"ab", "bc", "abc"}, {{"a", "b"}, {"b", "c"}, {"ab", "c"}}));
    EXPECT_EQ(ab_first.encode("abc"), (Ids{258}));
}

TEST(ByteLevelBpe, EqualPairsMergeLeftmostFirst) {
    const PretrainedTokenizer tokenizer(byte_level_vocabulary({"aa"}, {{"a", "a"}}));
    EXPECT_EQ(tokenizer.encode("aaa"), (Ids{256, byte_id('a')}));
    EXPECT_EQ(tokenizer.encode("aaaa"), (Ids{256, 256}));
}

TEST(ByteLevelBpe, LongAndShortPreTokensMergeAlike) {
    // 40 bytes take the rescanning path, 100 and 102 the heap: n a's become n/2 "aa", then
    // pairs of "aa" become "aaaa", an odd "aa" staying last.
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({"aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}}));
    EXPECT_EQ(tokenizer.encode(std::string(40, 'a')), Ids(10, 257));
    EXPECT_EQ(tokenizer.encode(std::string(100, 'a')), Ids(25, 257));
    Ids expected(25, 257);
    expected.push_back(256);
    EXPECT_EQ(tokenizer.encode(std::string(102, 'a')), expected);
    expected.push_back(byte_id('a'));
    EXPECT_EQ(tokenizer.encode(std::string(103, 'a')), expected);
}

TEST(ByteLevelBpe, MergesNeverCrossPreTokens) {
    // "ab ab" is "ab" " ab": (b, Ġ) spans the boundary and never applies.
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({"ab", "b" + space_symbol}, {{"b", space_symbol}, {"a", "b"}}));
    EXPECT_EQ(tokenizer.encode("ab ab"), (Ids{256, byte_id(' '), 256}));
}

TEST(ByteLevelBpe, SpacesAndNewlinesMergeAsTheirSymbols) {
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({space_symbol + "a", newline_symbol + newline_symbol},
                              {{space_symbol, "a"}, {newline_symbol, newline_symbol}}));
    EXPECT_EQ(tokenizer.encode("a a\n\n"), (Ids{byte_id('a'), 256, 257}));
}

const std::vector<std::pair<std::string, TokenType>> chat_specials = {
    {"<|im_start|>", TokenType::Control},  // 258
    {"<|im", TokenType::Control},          // 259
    {"<tool>", TokenType::UserDefined},    // 260
    {"<unk>", TokenType::Unknown},         // 261
};

TEST(ByteLevelBpe, SpecialTokensAreCutOutAndNeverMerged) {
    // (b, <) would merge if the special token were text.
    const PretrainedTokenizer tokenizer(byte_level_vocabulary(
        {"ab", "b<"}, {{"a", "b"}, {"b", "<"}}, PretokenizerKind::Gpt2, chat_specials));
    EXPECT_EQ(tokenizer.encode("ab<|im_start|>ab"), (Ids{256, 258, 256}));
    EXPECT_EQ(tokenizer.encode("b<|im_start|>"), (Ids{byte_id('b'), 258}));
    EXPECT_EQ(tokenizer.encode("<tool><unk>"), (Ids{260, 261}));
    // A pre-token never spans a special token: " " stays alone before it.
    EXPECT_EQ(tokenizer.encode("a <|im_start|> b"),
              (Ids{byte_id('a'), byte_id(' '), 258, byte_id(' '), byte_id('b')}));
}

TEST(ByteLevelBpe, LongestSpecialTokenWinsAtAPosition) {
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({}, {}, PretokenizerKind::Gpt2, chat_specials));
    const TokenId im_start = 256;
    const TokenId im = 257;
    EXPECT_EQ(tokenizer.encode("<|im_start|>"), (Ids{im_start}));
    EXPECT_EQ(tokenizer.encode("<|im_end"),
              (Ids{im, byte_id('_'), byte_id('e'), byte_id('n'), byte_id('d')}));
    EXPECT_EQ(tokenizer.encode("<<|im"), (Ids{byte_id('<'), im}));
}

TEST(ByteLevelBpe, AsTextReadsControlAndUnknownTokensAsTextButStillCutsUserDefined) {
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({}, {}, PretokenizerKind::Gpt2, chat_specials));
    // Gpt2 pieces of "<|im_start|>": "<|" "im" "_" "start" "|>", all single bytes here.
    Ids expected;
    for (const char byte : std::string_view("<|im_start|>")) {
        expected.push_back(byte_id(byte));
    }
    EXPECT_EQ(tokenizer.encode("<|im_start|>", SpecialTokens::AsText), expected);
    EXPECT_EQ(tokenizer.encode("<unk>", SpecialTokens::AsText),
              (Ids{byte_id('<'), byte_id('u'), byte_id('n'), byte_id('k'), byte_id('>')}));
    EXPECT_EQ(tokenizer.encode("<tool>", SpecialTokens::AsText), (Ids{258}));
}

TEST(ByteLevelBpe, IgnoreMergesEmitsAWholePreTokenThatIsAToken) {
    // "xyz" is a token no merge reaches.
    PretrainedVocabulary vocabulary = byte_level_vocabulary({"xy", "xyz"}, {{"x", "y"}});
    EXPECT_EQ(PretrainedTokenizer(vocabulary).encode("xyz xyz"),
              (Ids{256, byte_id('z'), byte_id(' '), 256, byte_id('z')}));
    vocabulary.ignore_merges = true;
    EXPECT_EQ(PretrainedTokenizer(vocabulary).encode("xyz xyz"),
              (Ids{257, byte_id(' '), 256, byte_id('z')}));
}

TEST(ByteLevelBpe, BytesWithoutATokenAreDroppedAndTheirNeighboursMerge) {
    // No token for byte 0x04, as in SmolLM2's vocabulary.
    PretrainedVocabulary vocabulary = byte_level_vocabulary({"!!"}, {{"!", "!"}});
    vocabulary.tokens.erase(vocabulary.tokens.begin() + 4);
    vocabulary.token_types.pop_back();
    const PretrainedTokenizer tokenizer(vocabulary);
    EXPECT_EQ(tokenizer.encode("!\x04!"), (Ids{id_of(tokenizer, "!!")}));
    EXPECT_EQ(tokenizer.encode("a\x04"), (Ids{id_of(tokenizer, "a")}));
    EXPECT_TRUE(tokenizer.encode("\x04\x04").empty());
}

TEST(ByteLevelBpe, EncodesTheEmptyTextAsNoIds) {
    const PretrainedTokenizer tokenizer(byte_level_vocabulary({}, {}));
    EXPECT_TRUE(tokenizer.encode("").empty());
}

TEST(ByteLevelBpe, DecodeInvertsTheAlphabetAndKeepsSpecialTokenText) {
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({space_symbol + "a"}, {{space_symbol, "a"}}, PretokenizerKind::Gpt2,
                              {{"<|im_start|>", TokenType::Control}}));
    EXPECT_EQ(tokenizer.decode(Ids{257, byte_id('x'), 256, byte_id('\n')}), "<|im_start|>x a\n");
    EXPECT_EQ(tokenizer.token_bytes(256), " a");
    EXPECT_EQ(tokenizer.token_text(256), space_symbol + "a");
    EXPECT_EQ(tokenizer.token_type(257), TokenType::Control);
    Ids every_byte;
    std::string all_bytes;
    for (unsigned byte = 0; byte < 256; ++byte) {
        every_byte.push_back(byte);
        all_bytes.push_back(static_cast<char>(byte));
    }
    EXPECT_EQ(tokenizer.decode(every_byte), all_bytes);
}

TEST(ByteLevelBpe, EncodeDecodeRoundTripsMultilingualText) {
    const PretrainedTokenizer tokenizer(byte_level_vocabulary(
        {"ab", space_symbol + "ab"}, {{"a", "b"}, {space_symbol, "ab"}}, PretokenizerKind::Llama3));
    const std::string text =
        "ab ab\t\n  caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 1234567 \xF0\x9F\x91\xA8\xE2\x80\x8D"
        "\xF0\x9F\x91\xA9 \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 I'LL";
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
}

TEST(ByteLevelBpe, ReportsItsConfiguration) {
    PretrainedVocabulary vocabulary = byte_level_vocabulary({}, {}, PretokenizerKind::SmolLm);
    vocabulary.bos_id = 1;
    vocabulary.eos_id = 2;
    const PretrainedTokenizer tokenizer(vocabulary);
    EXPECT_EQ(tokenizer.model(), PretrainedModelKind::ByteLevelBpe);
    EXPECT_EQ(tokenizer.pretokenizer(), PretokenizerKind::SmolLm);
    EXPECT_EQ(tokenizer.vocabulary_size(), 256U);
    EXPECT_EQ(tokenizer.bos_id(), 1U);
    EXPECT_EQ(tokenizer.eos_id(), 2U);
    EXPECT_FALSE(tokenizer.unknown_id().has_value());
    EXPECT_FALSE(tokenizer.find_token("no such token").has_value());
}

TEST(ByteLevelBpe, CopiesEncodeConcurrentlyWithTheSameResult) {
    const PretrainedTokenizer tokenizer(
        byte_level_vocabulary({"ab", space_symbol + "ab"}, {{"a", "b"}, {space_symbol, "ab"}},
                              PretokenizerKind::SmolLm, chat_specials));
    std::string text;
    for (int i = 0; i < 2000; ++i) {
        text += "ab ab<|im_start|>x" + std::to_string(i) + "\n";
    }
    const Ids expected = tokenizer.encode(text);
    std::vector<Ids> results(4);
    std::vector<std::thread> threads;
    for (Ids& result : results) {
        threads.emplace_back([copy = tokenizer, &text, &result] { result = copy.encode(text); });
    }
    for (std::thread& thread : threads) {
        thread.join();
    }
    for (const Ids& result : results) {
        EXPECT_EQ(result, expected);
    }
}

// ---- SentencePiece BPE.

// 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then Normal tokens with their scores.
PretrainedVocabulary sentencepiece_vocabulary(
    const std::vector<std::pair<std::string, float>>& normal, bool byte_tokens = true) {
    PretrainedVocabulary vocabulary;
    vocabulary.model = PretrainedModelKind::SentencePieceBpe;
    const auto add = [&](std::string text, TokenType type, float score) {
        vocabulary.tokens.push_back(std::move(text));
        vocabulary.token_types.push_back(type);
        vocabulary.scores.push_back(score);
    };
    add("<unk>", TokenType::Unknown, 0.0F);
    add("<s>", TokenType::Control, 0.0F);
    add("</s>", TokenType::Control, 0.0F);
    if (byte_tokens) {
        static const char* const hex = "0123456789ABCDEF";
        for (unsigned byte = 0; byte < 256; ++byte) {
            add(std::string("<0x") + hex[byte >> 4U] + hex[byte & 15U] + ">", TokenType::Byte,
                0.0F);
        }
    }
    for (const auto& [text, score] : normal) {
        add(text, TokenType::Normal, score);
    }
    vocabulary.unknown_id = 0;
    vocabulary.bos_id = 1;
    vocabulary.eos_id = 2;
    return vocabulary;
}

TEST(SentencePieceBpe, MergesTheHighestScoringPairFirst) {
    // "abc" is "▁abc": (b,c) scores -5 and (a,b) -10, so bc first, and nothing joins a, bc.
    const PretrainedTokenizer bc_first(sentencepiece_vocabulary(
        {{metaspace, -1}, {"a", -2}, {"b", -3}, {"c", -4}, {"ab", -10}, {"bc", -5}}));
    EXPECT_EQ(bc_first.encode("abc"),
              (Ids{id_of(bc_first, metaspace), id_of(bc_first, "a"), id_of(bc_first, "bc")}));
    const PretrainedTokenizer ab_first(sentencepiece_vocabulary(
        {{metaspace, -1}, {"a", -2}, {"b", -3}, {"c", -4}, {"ab", -5}, {"bc", -10}}));
    EXPECT_EQ(ab_first.encode("abc"),
              (Ids{id_of(ab_first, metaspace), id_of(ab_first, "ab"), id_of(ab_first, "c")}));
}

TEST(SentencePieceBpe, EqualScoresMergeLeftmostFirst) {
    // "aaa" and "▁a" tie: ▁+a is leftmost, then a+a.
    const PretrainedTokenizer tokenizer(
        sentencepiece_vocabulary({{metaspace, -1}, {"a", -2}, {"aa", -5}, {metaspace + "a", -5}}));
    EXPECT_EQ(tokenizer.encode("aaa"),
              (Ids{id_of(tokenizer, metaspace + "a"), id_of(tokenizer, "aa")}));
}

TEST(SentencePieceBpe, SpacesBecomeMetaspaceAndEachStretchGetsADummyPrefix) {
    PretrainedVocabulary vocabulary = sentencepiece_vocabulary(
        {{metaspace, -1}, {"a", -2}, {"b", -3}, {metaspace + "a", -4}, {"ab", -5}});
    const PretrainedTokenizer tokenizer(vocabulary);
    const TokenId prefixed_a = id_of(tokenizer, metaspace + "a");
    const TokenId b = id_of(tokenizer, "b");
    EXPECT_EQ(tokenizer.encode("a b"), (Ids{prefixed_a, id_of(tokenizer, metaspace), b}));
    // "<s>" ends a stretch: "a" after it is "▁a" again; nothing before it is no prefix.
    EXPECT_EQ(tokenizer.encode("<s>a</s>a"), (Ids{1, prefixed_a, 2, prefixed_a}));
    vocabulary.add_dummy_prefix = false;
    const PretrainedTokenizer without(vocabulary);
    EXPECT_EQ(without.encode("ab"), (Ids{id_of(without, "ab")}));
}

TEST(SentencePieceBpe, CharactersWithoutATokenFallBackToBytes) {
    const PretrainedTokenizer tokenizer(
        sentencepiece_vocabulary({{metaspace, -1}, {"a", -2}, {metaspace + "a", -3}}));
    // 'é' is C3 A9 -> <0xC3> <0xA9>, ids 3 + byte.
    EXPECT_EQ(tokenizer.encode("a \xC3\xA9"
                               "a"),
              (Ids{id_of(tokenizer, metaspace + "a"), id_of(tokenizer, metaspace), 3 + 0xC3,
                   3 + 0xA9, id_of(tokenizer, "a")}));
}

TEST(SentencePieceBpe, CharactersFallBackToUnknownWithoutByteTokens) {
    const PretrainedTokenizer tokenizer(
        sentencepiece_vocabulary({{metaspace, -1}, {"a", -2}}, /*byte_tokens=*/false));
    EXPECT_EQ(tokenizer.encode("\xC3\xA9\xC3\xA9"), (Ids{id_of(tokenizer, metaspace), 0, 0}));
}

TEST(SentencePieceBpe, UnknownAndControlTokensAreSpecialUnlessAsText) {
    const PretrainedTokenizer tokenizer(
        sentencepiece_vocabulary({{metaspace, -1}, {"<", -2}, {"s", -3}, {">", -4}}));
    EXPECT_EQ(tokenizer.encode("<unk><s>"), (Ids{0, 1}));
    EXPECT_EQ(tokenizer.encode("<s>", SpecialTokens::AsText),
              (Ids{id_of(tokenizer, metaspace), id_of(tokenizer, "<"), id_of(tokenizer, "s"),
                   id_of(tokenizer, ">")}));
}

TEST(SentencePieceBpe, DecodeRestoresSpacesAndBytesAndDropsTheDummySpace) {
    PretrainedVocabulary vocabulary =
        sentencepiece_vocabulary({{metaspace, -1}, {"a", -2}, {metaspace + "a", -3}});
    const PretrainedTokenizer tokenizer(vocabulary);
    const Ids ids = tokenizer.encode(
        "a \xC3\xA9"
        "a");
    EXPECT_EQ(tokenizer.decode(ids),
              "a \xC3\xA9"
              "a");
    EXPECT_EQ(tokenizer.token_bytes(ids[0]), " a");
    EXPECT_EQ(tokenizer.token_bytes(3 + 0xC3), "\xC3");
    EXPECT_EQ(tokenizer.decode(Ids{1, ids[0]}), "<s> a");  // only a leading space is dropped
    vocabulary.add_dummy_prefix = false;
    EXPECT_EQ(PretrainedTokenizer(vocabulary).decode(Ids{ids[0]}), " a");
}

// ---- Rejections.

TEST(PretrainedTokenizerErrors, DecodeAndQueriesRejectIdsOutOfRange) {
    const PretrainedTokenizer tokenizer(byte_level_vocabulary({}, {}));
    EXPECT_TRUE(throws<std::out_of_range>(
        [&] {
            (void)tokenizer.decode(Ids{1, 999});
        },
        "ids[1] = 999 is out of range (vocabulary size 256)"));
    EXPECT_TRUE(throws<std::out_of_range>([&] { (void)tokenizer.token_bytes(256); }, "256"));
    EXPECT_TRUE(throws<std::out_of_range>([&] { (void)tokenizer.token_text(256); }, "256"));
    EXPECT_TRUE(throws<std::out_of_range>([&] { (void)tokenizer.token_type(300); }, "300"));
}

TEST(PretrainedTokenizerErrors, EncodeRejectsIllFormedUtf8AndUnknownModes) {
    const PretrainedTokenizer tokenizer(byte_level_vocabulary({}, {}));
    EXPECT_TRUE(
        throws<std::invalid_argument>([&] { (void)tokenizer.encode("ok\xFF"); }, "byte offset 2"));
    EXPECT_TRUE(throws<std::invalid_argument>(
        [&] { (void)tokenizer.encode("x", static_cast<SpecialTokens>(5)); }, "special value 5"));
    EXPECT_EQ(tokenizer.encode("ok"), (Ids{byte_id('o'), byte_id('k')}));  // still usable
}

void expect_rejected(const PretrainedVocabulary& vocabulary, std::string_view fragment) {
    EXPECT_TRUE(
        throws<std::invalid_argument>([&] { (void)PretrainedTokenizer(vocabulary); }, fragment));
}

TEST(PretrainedTokenizerErrors, RejectsMalformedTokenLists) {
    PretrainedVocabulary empty;
    expect_rejected(empty, "tokens is empty");

    PretrainedVocabulary types = byte_level_vocabulary({}, {});
    types.token_types.pop_back();
    expect_rejected(types, "token_types has 255 entries for 256 tokens");

    PretrainedVocabulary scores = byte_level_vocabulary({}, {});
    scores.scores.assign(3, 0.0F);
    expect_rejected(scores, "scores has 3 entries for 256 tokens");

    PretrainedVocabulary bad_type = byte_level_vocabulary({}, {});
    bad_type.token_types[3] = static_cast<TokenType>(7);
    expect_rejected(bad_type, "token_types[3] = 7");

    expect_rejected(byte_level_vocabulary({""}, {}), "tokens[256] is empty");
    expect_rejected(
        byte_level_vocabulary({}, {}, PretokenizerKind::Gpt2, {{"bad\xC3", TokenType::Control}}),
        "tokens[256] is not well-formed UTF-8");
    expect_rejected(byte_level_vocabulary({"ab", "cd", "ab"}, {}),
                    "tokens[258] = \"ab\" repeats tokens[256]");
}

TEST(PretrainedTokenizerErrors, RejectsBadByteLevelTokensAndMerges) {
    expect_rejected(byte_level_vocabulary({"a\xC5\x84"}, {}),  // 'ń' U+0144
                    "tokens[256] = \"a\xC5\x84\" is a normal token with a character outside");
    expect_rejected(
        byte_level_vocabulary({}, {}, PretokenizerKind::Gpt2, {{"<0x41>", TokenType::Byte}}),
        "tokens[256] = \"<0x41>\" has type byte");
    expect_rejected(byte_level_vocabulary({"ab"}, {{"a", "b"}, {"a", "zz"}}),
                    "merges[1] = \"a zz\": right \"zz\" is not a token");
    expect_rejected(byte_level_vocabulary({"ab"}, {{"x", "q"}}),
                    "merges[0] = \"x q\": merged \"xq\" is not a token");
    expect_rejected(byte_level_vocabulary({"ab", "ba"}, {{"a", "b"}, {"b", "a"}, {"a", "b"}}),
                    "merges[2] = \"a b\" repeats merges[0]");
    PretrainedVocabulary pretokenizer = byte_level_vocabulary({}, {});
    pretokenizer.pretokenizer = static_cast<PretokenizerKind>(7);
    expect_rejected(pretokenizer, "kind value 7");
}

TEST(PretrainedTokenizerErrors, RejectsBadSentencePieceVocabularies) {
    PretrainedVocabulary merges = sentencepiece_vocabulary({{"a", -1}});
    merges.merges = {{"a", "a"}};
    expect_rejected(merges,
                    "merges has 1 entries, but a SentencePiece vocabulary merges by scores");

    PretrainedVocabulary no_scores = sentencepiece_vocabulary({{"a", -1}});
    no_scores.scores.clear();
    expect_rejected(no_scores, "scores is empty");

    PretrainedVocabulary infinite = sentencepiece_vocabulary({{"a", -1}});
    infinite.scores.back() = std::numeric_limits<float>::infinity();
    expect_rejected(infinite, "scores[259] is not finite");

    PretrainedVocabulary misspelled = sentencepiece_vocabulary({{"a", -1}});
    misspelled.tokens[3 + 0x1F] = "<0x1f>";
    expect_rejected(misspelled, "tokens[34] = \"<0x1f>\" has type byte but is not spelled <0xXX>");

    PretrainedVocabulary partial = sentencepiece_vocabulary({{"a", -1}});
    partial.token_types[3 + 0x41] = TokenType::Normal;
    expect_rejected(partial, "cover 255 of the 256 bytes (no token for byte 0x41)");

    PretrainedVocabulary no_fallback = sentencepiece_vocabulary({{"a", -1}}, false);
    no_fallback.unknown_id.reset();
    expect_rejected(no_fallback, "neither byte fallback tokens");
}

TEST(PretrainedTokenizerErrors, RejectsSpecialIdsOutOfRange) {
    PretrainedVocabulary bos = byte_level_vocabulary({}, {});
    bos.bos_id = 256;
    expect_rejected(bos, "bos_id = 256 is out of range (vocabulary size 256)");
    PretrainedVocabulary eos = byte_level_vocabulary({}, {});
    eos.eos_id = 1000;
    expect_rejected(eos, "eos_id = 1000");
    PretrainedVocabulary unknown = byte_level_vocabulary({}, {});
    unknown.unknown_id = 256;
    expect_rejected(unknown, "unknown_id = 256");
}

TEST(PretrainedTokenizerErrors, ParsesGgufMergesAndRejectsOtherLines) {
    EXPECT_EQ(parse_merge(space_symbol + " t"), std::make_pair(space_symbol, std::string("t")));
    for (const std::string_view line : {"ab", "a  b", " a", "a ", "a b c", ""}) {
        EXPECT_TRUE(throws<std::invalid_argument>([&] { (void)parse_merge(line); },
                                                  "is not \"left right\""))
            << line;
    }
    const std::vector<std::string> lines = {"a b", "c d", "bad"};
    EXPECT_TRUE(throws<std::invalid_argument>([&] { (void)parse_merges(lines); },
                                              "parse_merges: lines[2]: parse_merge: \"bad\""));
}

TEST(PretrainedTokenizerErrors, GgufNamesAndValuesMapOrAreRejected) {
    EXPECT_EQ(pretrained_model_kind_from_gguf("gpt2"), PretrainedModelKind::ByteLevelBpe);
    EXPECT_EQ(pretrained_model_kind_from_gguf("llama"), PretrainedModelKind::SentencePieceBpe);
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)pretrained_model_kind_from_gguf("bert"); },
                                              "\"bert\""));
    EXPECT_EQ(pretrained_model_kind_name(PretrainedModelKind::SentencePieceBpe),
              "sentencepiece_bpe");
    EXPECT_EQ(token_type_from_value(6), TokenType::Byte);
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)token_type_from_value(0); }, "value 0"));
    EXPECT_TRUE(throws<std::invalid_argument>([] { (void)token_type_from_value(7); }, "value 7"));
}

}  // namespace
}  // namespace riftco_transformer
