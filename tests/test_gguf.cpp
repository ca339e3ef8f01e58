// GGUF reader and dequantizer (interchange/gguf.hpp): metadata round trips of every value
// type, every validation rule (each with the message fragment it must carry), tensor infos
// and bytes, dequantization of hand-built blocks of every supported type against values
// worked out by hand from the format's formulas, and a mutation sweep over a valid header
// (open either succeeds or throws GgufFormatError; the ASan build proves nothing crashes).
//
// The files are built by a tiny writer below (test-only), byte by byte.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "riftco_transformer/interchange/gguf.hpp"

namespace riftco_transformer {
namespace {

// ---- A test-only GGUF writer.

using Bytes = std::vector<std::uint8_t>;

template <typename Value>
void put(Bytes& bytes, Value value) {
    const std::size_t at = bytes.size();
    bytes.resize(at + sizeof(Value));
    std::memcpy(bytes.data() + at, &value, sizeof(Value));
}

void put_string(Bytes& bytes, std::string_view text) {
    put<std::uint64_t>(bytes, text.size());
    bytes.insert(bytes.end(), text.begin(), text.end());
}

// One metadata entry: key, value type, then `value` (already encoded).
Bytes entry(std::string_view key, std::uint32_t type, const Bytes& value) {
    Bytes bytes;
    put_string(bytes, key);
    put<std::uint32_t>(bytes, type);
    bytes.insert(bytes.end(), value.begin(), value.end());
    return bytes;
}

template <typename Value>
Bytes encoded(Value value) {
    Bytes bytes;
    put(bytes, value);
    return bytes;
}

Bytes encoded_string(std::string_view text) {
    Bytes bytes;
    put_string(bytes, text);
    return bytes;
}

// An array value: element type, count, then the elements (already encoded).
Bytes encoded_array(std::uint32_t element_type, std::uint64_t count, const Bytes& elements) {
    Bytes bytes;
    put<std::uint32_t>(bytes, element_type);
    put<std::uint64_t>(bytes, count);
    bytes.insert(bytes.end(), elements.begin(), elements.end());
    return bytes;
}

template <typename Value>
Bytes encoded_values(std::initializer_list<Value> values) {
    Bytes bytes;
    for (const Value value : values) {
        put(bytes, value);
    }
    return bytes;
}

struct TestTensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type = 0;
    std::uint64_t offset = 0;
};

// magic | version | tensor count | metadata count | entries | tensor infos | zero padding to
// `alignment` | data. The counts default to the real ones.
struct TestFile {
    std::uint32_t magic = 0x46554747;
    std::uint32_t version = 3;
    std::optional<std::uint64_t> tensor_count;
    std::optional<std::uint64_t> metadata_count;
    std::vector<Bytes> entries;
    std::vector<TestTensor> tensors;
    std::size_t alignment = 32;
    Bytes data;

    [[nodiscard]] Bytes header() const {
        Bytes bytes;
        put(bytes, magic);
        put(bytes, version);
        put<std::uint64_t>(bytes, tensor_count.value_or(tensors.size()));
        put<std::uint64_t>(bytes, metadata_count.value_or(entries.size()));
        for (const Bytes& one : entries) {
            bytes.insert(bytes.end(), one.begin(), one.end());
        }
        for (const TestTensor& tensor : tensors) {
            put_string(bytes, tensor.name);
            put<std::uint32_t>(bytes, static_cast<std::uint32_t>(tensor.dims.size()));
            for (const std::uint64_t dim : tensor.dims) {
                put(bytes, dim);
            }
            put(bytes, tensor.type);
            put(bytes, tensor.offset);
        }
        return bytes;
    }

    [[nodiscard]] Bytes encode() const {
        Bytes bytes = header();
        bytes.resize((bytes.size() + alignment - 1) / alignment * alignment, 0);
        bytes.insert(bytes.end(), data.begin(), data.end());
        return bytes;
    }
};

class Gguf : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        directory_ = std::filesystem::temp_directory_path() /
                     ("riftco_gguf_" + std::to_string(::getpid()) + "_" + info->name());
        std::filesystem::create_directories(directory_);
    }
    void TearDown() override { std::filesystem::remove_all(directory_); }

    // Writes `bytes` to a file in the test's directory and opens it (memory-mapped).
    GgufFile open_bytes(const Bytes& bytes, const std::string& name = "model.gguf") const {
        const std::filesystem::path path = directory_ / name;
        std::ofstream stream(path, std::ios::binary | std::ios::trunc);
        stream.write(reinterpret_cast<const char*>(bytes.data()),
                     static_cast<std::streamsize>(bytes.size()));
        stream.close();
        return GgufFile::open(path);
    }

    // open_bytes must throw GgufFormatError whose message contains every fragment.
    void expect_rejected(const Bytes& bytes, std::initializer_list<std::string_view> fragments) {
        try {
            static_cast<void>(open_bytes(bytes));
            ADD_FAILURE() << "accepted; expected a GgufFormatError with '" << *fragments.begin()
                          << "'";
        } catch (const GgufFormatError& error) {
            const std::string message = error.what();
            EXPECT_EQ(message.rfind("gguf: ", 0), 0U) << message;
            for (const std::string_view fragment : fragments) {
                EXPECT_NE(message.find(fragment), std::string::npos)
                    << "'" << fragment << "' not in: " << message;
            }
        }
    }

    std::filesystem::path directory_;
};

template <typename Exception, typename Call>
void expect_error(const Call& call, std::string_view fragment) {
    try {
        call();
        ADD_FAILURE() << "no exception; expected one with '" << fragment << "'";
    } catch (const Exception& error) {
        EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
}

std::uint32_t bits(float value) {
    return std::bit_cast<std::uint32_t>(value);
}

// A Q4_0 block (18 bytes) with d = 1 and every nibble 8 (all values 0).
Bytes zero_q4_0_block() {
    Bytes block = {0x00, 0x3C};
    block.resize(18, 0x88);
    return block;
}

// Appends a Q8_0 tensor `name` with GGUF dims {ne0, rows} at the end of the data: block b
// has d = 1 (F16 0x3C00) and every q = quant(b).
template <typename Quant>
void append_q8_0_tensor(TestFile& file, const std::string& name, std::uint64_t ne0,
                        std::uint64_t rows, const Quant& quant) {
    file.tensors.push_back({name, {ne0, rows}, 8, file.data.size()});
    for (std::size_t b = 0; b < ne0 * rows / 32; ++b) {
        file.data.push_back(0x00);
        file.data.push_back(0x3C);
        file.data.insert(file.data.end(), 32, static_cast<std::uint8_t>(quant(b)));
    }
}

// A valid file: two tensors, a few metadata entries of several kinds.
TestFile valid_file() {
    TestFile file;
    file.entries.push_back(entry("general.architecture", 8, encoded_string("llama")));
    file.entries.push_back(entry("llama.block_count", 4, encoded<std::uint32_t>(2)));
    file.entries.push_back(entry("tokenizer.ggml.tokens", 9, encoded_array(8, 2, [] {
                                     Bytes b;
                                     put_string(b, "a");
                                     put_string(b, "bc");
                                     return b;
                                 }())));
    file.entries.push_back(
        entry("tokenizer.ggml.scores", 9, encoded_array(6, 2, encoded_values({0.5F, -1.0F}))));
    file.tensors.push_back({"norm.weight", {4}, 0, 0});
    file.tensors.push_back({"blk.0.attn_q.weight", {32, 2}, 2, 32});
    file.data = encoded_values({1.0F, 2.0F, 3.0F, 4.0F});
    file.data.resize(32, 0);
    for (int block = 0; block < 2; ++block) {
        const Bytes one = zero_q4_0_block();
        file.data.insert(file.data.end(), one.begin(), one.end());
    }
    return file;
}

// ---- Metadata.

TEST_F(Gguf, RoundTripsEveryMetadataValueType) {
    TestFile file;
    file.entries.push_back(entry("t.uint8", 0, encoded<std::uint8_t>(250)));
    file.entries.push_back(entry("t.int8", 1, encoded<std::int8_t>(-120)));
    file.entries.push_back(entry("t.uint16", 2, encoded<std::uint16_t>(65000)));
    file.entries.push_back(entry("t.int16", 3, encoded<std::int16_t>(-32000)));
    file.entries.push_back(entry("t.uint32", 4, encoded<std::uint32_t>(4000000000U)));
    file.entries.push_back(entry("t.int32", 5, encoded<std::int32_t>(-2000000000)));
    file.entries.push_back(entry("t.float32", 6, encoded<float>(0.1F)));
    file.entries.push_back(entry("t.bool", 7, encoded<std::uint8_t>(1)));
    file.entries.push_back(
        entry("t.string", 8, encoded_string(std::string_view("h\xC3\xA9llo\n\0x", 9))));
    file.entries.push_back(entry("t.uint64", 10, encoded<std::uint64_t>(18000000000000000000ULL)));
    file.entries.push_back(entry("t.int64", 11, encoded<std::int64_t>(-9000000000000000000LL)));
    file.entries.push_back(entry("t.float64", 12, encoded<double>(1.0 / 3.0)));
    file.entries.push_back(entry("t.empty_string", 8, encoded_string("")));
    file.entries.push_back(
        entry("a.uint8", 9, encoded_array(0, 3, encoded_values<std::uint8_t>({0, 7, 255}))));
    file.entries.push_back(
        entry("a.int8", 9, encoded_array(1, 2, encoded_values<std::int8_t>({-128, 127}))));
    file.entries.push_back(
        entry("a.uint16", 9, encoded_array(2, 1, encoded_values<std::uint16_t>({65535}))));
    file.entries.push_back(
        entry("a.int16", 9, encoded_array(3, 2, encoded_values<std::int16_t>({-1, 2}))));
    file.entries.push_back(
        entry("a.uint32", 9, encoded_array(4, 2, encoded_values<std::uint32_t>({1, 4294967295U}))));
    file.entries.push_back(
        entry("a.int32", 9, encoded_array(5, 3, encoded_values<std::int32_t>({-5, 0, 5}))));
    file.entries.push_back(
        entry("a.float32", 9, encoded_array(6, 2, encoded_values<float>({1.5F, -0.0F}))));
    file.entries.push_back(
        entry("a.bool", 9, encoded_array(7, 3, encoded_values<std::uint8_t>({1, 0, 1}))));
    Bytes strings;
    put_string(strings, "x");
    put_string(strings, "");
    put_string(strings, "\xCE\xA8");
    file.entries.push_back(entry("a.string", 9, encoded_array(8, 3, strings)));
    file.entries.push_back(
        entry("a.uint64", 9, encoded_array(10, 1, encoded_values<std::uint64_t>({1ULL << 63U}))));
    file.entries.push_back(
        entry("a.int64", 9, encoded_array(11, 1, encoded_values<std::int64_t>({-3}))));
    file.entries.push_back(
        entry("a.float64", 9, encoded_array(12, 2, encoded_values<double>({0.25, -1e300}))));
    file.entries.push_back(entry("a.empty", 9, encoded_array(4, 0, {})));

    const GgufFile gguf = open_bytes(file.encode());
    EXPECT_EQ(gguf.version(), 3U);
    EXPECT_EQ(gguf.alignment(), 32U);
    EXPECT_TRUE(gguf.tensors().empty());
    ASSERT_EQ(gguf.metadata().size(), file.entries.size());
    EXPECT_EQ(gguf.metadata()[0].key, "t.uint8");  // file order
    EXPECT_EQ(gguf.metadata().back().key, "a.empty");

    EXPECT_EQ(std::get<std::uint8_t>(gguf.at("t.uint8").data), 250);
    EXPECT_EQ(std::get<std::int8_t>(gguf.at("t.int8").data), -120);
    EXPECT_EQ(std::get<std::uint16_t>(gguf.at("t.uint16").data), 65000);
    EXPECT_EQ(std::get<std::int16_t>(gguf.at("t.int16").data), -32000);
    EXPECT_EQ(gguf.get_uint32("t.uint32"), 4000000000U);
    EXPECT_EQ(gguf.get_int32("t.int32"), -2000000000);
    EXPECT_EQ(gguf.get_float32("t.float32"), 0.1F);
    EXPECT_TRUE(gguf.get_bool("t.bool"));
    EXPECT_EQ(gguf.get_string("t.string"), std::string("h\xC3\xA9llo\n\0x", 9));
    EXPECT_EQ(gguf.get_uint64("t.uint64"), 18000000000000000000ULL);
    EXPECT_EQ(gguf.get_int64("t.int64"), -9000000000000000000LL);
    EXPECT_EQ(gguf.get_float64("t.float64"), 1.0 / 3.0);
    EXPECT_EQ(gguf.get_string("t.empty_string"), "");

    const auto expect_type = [&](std::string_view key, GgufValueType type) {
        ASSERT_NE(gguf.find(key), nullptr) << key;
        EXPECT_EQ(gguf.find(key)->type(), type) << key;
    };
    expect_type("t.uint8", GgufValueType::Uint8);
    expect_type("t.int8", GgufValueType::Int8);
    expect_type("t.uint16", GgufValueType::Uint16);
    expect_type("t.int16", GgufValueType::Int16);
    expect_type("t.uint32", GgufValueType::Uint32);
    expect_type("t.int32", GgufValueType::Int32);
    expect_type("t.float32", GgufValueType::Float32);
    expect_type("t.bool", GgufValueType::Bool);
    expect_type("t.string", GgufValueType::String);
    expect_type("a.uint8", GgufValueType::Array);
    expect_type("t.uint64", GgufValueType::Uint64);
    expect_type("t.int64", GgufValueType::Int64);
    expect_type("t.float64", GgufValueType::Float64);

    const auto elements = [&](std::string_view key) -> const GgufArray::Elements& {
        return gguf.get_array(key).elements;
    };
    EXPECT_EQ(std::get<std::vector<std::uint8_t>>(elements("a.uint8")),
              (std::vector<std::uint8_t>{0, 7, 255}));
    EXPECT_EQ(std::get<std::vector<std::int8_t>>(elements("a.int8")),
              (std::vector<std::int8_t>{-128, 127}));
    EXPECT_EQ(std::get<std::vector<std::uint16_t>>(elements("a.uint16")),
              (std::vector<std::uint16_t>{65535}));
    EXPECT_EQ(std::get<std::vector<std::int16_t>>(elements("a.int16")),
              (std::vector<std::int16_t>{-1, 2}));
    EXPECT_EQ(std::get<std::vector<std::uint32_t>>(elements("a.uint32")),
              (std::vector<std::uint32_t>{1, 4294967295U}));
    EXPECT_EQ(gguf.get_int32_array("a.int32"), (std::vector<std::int32_t>{-5, 0, 5}));
    const std::vector<float>& floats = gguf.get_float32_array("a.float32");
    ASSERT_EQ(floats.size(), 2U);
    EXPECT_EQ(floats[0], 1.5F);
    EXPECT_EQ(bits(floats[1]), bits(-0.0F));
    EXPECT_EQ(std::get<std::vector<bool>>(elements("a.bool")),
              (std::vector<bool>{true, false, true}));
    EXPECT_EQ(gguf.get_string_array("a.string"), (std::vector<std::string>{"x", "", "\xCE\xA8"}));
    EXPECT_EQ(std::get<std::vector<std::uint64_t>>(elements("a.uint64")),
              (std::vector<std::uint64_t>{1ULL << 63U}));
    EXPECT_EQ(gguf.get_int64_array("a.int64"), (std::vector<std::int64_t>{-3}));
    EXPECT_EQ(std::get<std::vector<double>>(elements("a.float64")),
              (std::vector<double>{0.25, -1e300}));
    EXPECT_EQ(gguf.get_array("a.empty").size(), 0U);
    EXPECT_EQ(gguf.get_array("a.empty").element_type(), GgufValueType::Uint32);
    EXPECT_EQ(gguf.get_array("a.string").element_type(), GgufValueType::String);
}

TEST_F(Gguf, IntegerGettersAcceptAnyWidthWhoseValueFits) {
    TestFile file;
    file.entries.push_back(entry("small", 0, encoded<std::uint8_t>(7)));
    file.entries.push_back(entry("signed", 5, encoded<std::int32_t>(42)));
    file.entries.push_back(entry("negative", 5, encoded<std::int32_t>(-1)));
    file.entries.push_back(entry("wide", 10, encoded<std::uint64_t>(1ULL << 32U)));
    file.entries.push_back(
        entry("ids", 9, encoded_array(4, 2, encoded_values<std::uint32_t>({3, 2147483648U}))));
    file.entries.push_back(
        entry("types", 9, encoded_array(1, 2, encoded_values<std::int8_t>({1, -1}))));
    const GgufFile gguf = open_bytes(file.encode());
    EXPECT_EQ(gguf.get_uint32("small"), 7U);
    EXPECT_EQ(gguf.get_int64("small"), 7);
    EXPECT_EQ(gguf.get_uint32("signed"), 42U);
    EXPECT_EQ(gguf.get_uint64("wide"), 1ULL << 32U);
    EXPECT_EQ(gguf.get_int32("negative"), -1);
    EXPECT_EQ(gguf.get_uint32_array("ids"), (std::vector<std::uint32_t>{3, 2147483648U}));
    EXPECT_EQ(gguf.get_int32_array("types"), (std::vector<std::int32_t>{1, -1}));

    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_uint32("negative")); },
                                  "'negative' value -1 (int32) does not fit uint32");
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_uint32("wide")); },
                                  "'wide' value 4294967296 (uint64) does not fit uint32");
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_int32_array("ids")); },
                                  "'ids'[1] value 2147483648 (uint32) does not fit int32");
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_uint32_array("types")); },
                                  "'types'[1] value -1 (int8) does not fit uint32");
}

TEST_F(Gguf, GettersNameTheKeyAndTheExpectedAndActualTypes) {
    const GgufFile gguf = open_bytes(valid_file().encode());
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_string("llama.block_count")); },
                                  "'llama.block_count' has type uint32, expected string");
    expect_error<GgufFormatError>(
        [&] { static_cast<void>(gguf.get_uint32("general.architecture")); },
        "'general.architecture' has type string, expected uint32");
    expect_error<GgufFormatError>(
        [&] { static_cast<void>(gguf.get_float32_array("tokenizer.ggml.tokens")); },
        "'tokenizer.ggml.tokens' has type array of string, expected array of float32");
    expect_error<GgufFormatError>(
        [&] { static_cast<void>(gguf.get_int32_array("tokenizer.ggml.scores")); },
        "has type array of float32, expected array of int32");
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_float32("llama.block_count")); },
                                  "expected float32");
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.get_bool("missing.key")); },
                                  "metadata key 'missing.key' is absent");
    EXPECT_EQ(gguf.find("missing.key"), nullptr);
    EXPECT_FALSE(gguf.contains("missing.key"));
    EXPECT_TRUE(gguf.contains("general.architecture"));
    EXPECT_EQ(gguf.get_string_array("tokenizer.ggml.tokens"),
              (std::vector<std::string>{"a", "bc"}));
}

// ---- Tensor infos and bytes.

TEST_F(Gguf, ReadsTensorInfosAndTheirBytes) {
    const TestFile file = valid_file();
    const Bytes encoded_file = file.encode();
    const GgufFile gguf = open_bytes(encoded_file);
    ASSERT_EQ(gguf.tensors().size(), 2U);
    const GgufTensorInfo& norm = gguf.tensors()[0];
    EXPECT_EQ(norm.name, "norm.weight");
    EXPECT_EQ(norm.dims, (std::vector<std::uint64_t>{4}));
    EXPECT_EQ(norm.type, GgmlType::F32);
    EXPECT_EQ(norm.offset, 0U);
    EXPECT_EQ(norm.element_count, 4U);
    EXPECT_EQ(norm.byte_size, 16U);
    const GgufTensorInfo& query = gguf.tensor("blk.0.attn_q.weight");
    EXPECT_EQ(&query, &gguf.tensors()[1]);
    EXPECT_EQ(query.dims, (std::vector<std::uint64_t>{32, 2}));
    EXPECT_EQ(query.type, GgmlType::Q4_0);
    EXPECT_EQ(query.offset, 32U);
    EXPECT_EQ(query.element_count, 64U);
    EXPECT_EQ(query.byte_size, 36U);  // 2 blocks of 18 bytes

    const std::size_t data_offset = file.header().size() + (32 - file.header().size() % 32) % 32;
    EXPECT_EQ(gguf.data_offset(), data_offset);
    EXPECT_EQ(gguf.data_offset() % 32, 0U);
    EXPECT_EQ(gguf.file_size(), encoded_file.size());
    const std::span<const std::uint8_t> bytes = gguf.tensor_bytes(query);
    ASSERT_EQ(bytes.size(), 36U);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), encoded_file.begin() + data_offset + 32));
    EXPECT_EQ(gguf.dequantize(norm), (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
    EXPECT_EQ(gguf.dequantize(query), std::vector<float>(64, 0.0F));

    EXPECT_EQ(gguf.find_tensor("absent"), nullptr);
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.tensor("absent")); },
                                  "tensor 'absent' is absent");
    const GgufTensorInfo copy = norm;  // not one of the file's infos
    expect_error<std::invalid_argument>([&] { static_cast<void>(gguf.tensor_bytes(copy)); },
                                        "'norm.weight' is not one of this file's tensor infos");
    expect_error<std::invalid_argument>([&] { static_cast<void>(gguf.dequantize(copy)); },
                                        "not one of this file's tensor infos");
}

TEST_F(Gguf, HonoursACustomAlignmentAndMovesKeepReferencesValid) {
    TestFile file;
    file.alignment = 64;
    file.entries.push_back(entry("general.alignment", 4, encoded<std::uint32_t>(64)));
    file.tensors.push_back({"a", {2}, 0, 0});
    file.tensors.push_back({"b", {3}, 0, 64});
    file.data = encoded_values({1.0F, 2.0F});
    file.data.resize(64, 0);
    const Bytes tail = encoded_values({-1.0F, -2.0F, -3.0F});
    file.data.insert(file.data.end(), tail.begin(), tail.end());
    GgufFile opened = open_bytes(file.encode());
    const GgufTensorInfo& b = opened.tensor("b");
    const GgufFile moved = std::move(opened);
    EXPECT_EQ(moved.alignment(), 64U);
    EXPECT_EQ(moved.data_offset() % 64, 0U);
    EXPECT_EQ(moved.dequantize(b), (std::vector<float>{-1.0F, -2.0F, -3.0F}));
}

TEST_F(Gguf, AcceptsVersionTwoAndAFileWithoutTensors) {
    TestFile file;
    file.version = 2;
    file.entries.push_back(entry("k", 4, encoded<std::uint32_t>(1)));
    Bytes bytes = file.header();  // no padding: nothing follows the header
    const GgufFile gguf = open_bytes(bytes);
    EXPECT_EQ(gguf.version(), 2U);
    EXPECT_EQ(gguf.get_uint32("k"), 1U);
    EXPECT_TRUE(gguf.tensors().empty());
}

TEST_F(Gguf, OpenOfAMissingFileOrADirectoryIsASystemError) {
    EXPECT_THROW(static_cast<void>(GgufFile::open(directory_ / "absent.gguf")), std::system_error);
    EXPECT_THROW(static_cast<void>(GgufFile::open(directory_)), std::system_error);
}

TEST_F(Gguf, AnEmptyFileIsTruncated) {
    expect_rejected({}, {"truncated at byte 0: magic needs 4 bytes, 0 remain"});
}

// ---- Every validation rule.

TEST_F(Gguf, RejectsABadMagic) {
    TestFile file = valid_file();
    file.magic = 0x46554748;  // "HGUF"
    expect_rejected(file.encode(), {"bad magic 'HGUF'"});
}

TEST_F(Gguf, RejectsVersionOneAndUnknownVersions) {
    TestFile file = valid_file();
    file.version = 1;
    expect_rejected(file.encode(), {"version 1 is not supported"});
    file.version = 4;
    expect_rejected(file.encode(), {"version 4 is not supported"});
    file.version = 0x03000000;
    expect_rejected(file.encode(), {"byte-swapped version 3", "big-endian"});
}

TEST_F(Gguf, RejectsTruncatedFilesAtEveryHeaderLength) {
    // A cut inside a fixed-size field is "truncated"; one that leaves a claimed count or
    // string length without its bytes is reported as that claim.
    const Bytes whole = valid_file().header();
    for (std::size_t length = 0; length < whole.size(); ++length) {
        SCOPED_TRACE(length);
        try {
            static_cast<void>(open_bytes(Bytes(whole.begin(), whole.begin() + length)));
            ADD_FAILURE() << "a truncated header was accepted";
        } catch (const GgufFormatError& error) {
            const std::string message = error.what();
            EXPECT_TRUE(message.find("truncated at byte") != std::string::npos ||
                        message.find("fit in the") != std::string::npos ||
                        message.find("bytes but only") != std::string::npos)
                << message;
        }
    }
    expect_rejected(Bytes(whole.begin(), whole.begin() + 7), {"truncated at byte 4: version"});
}

TEST_F(Gguf, RejectsAStringLengthLongerThanTheFile) {
    TestFile file = valid_file();
    Bytes value;
    put<std::uint64_t>(value, 1ULL << 60U);
    file.entries.insert(file.entries.begin(), entry("general.name", 8, value));
    expect_rejected(file.encode(), {"metadata 'general.name' string claims 1152921504606846976 "
                                    "bytes but only"});
    // The same for a key.
    TestFile key_file;
    Bytes key;
    put<std::uint64_t>(key, ~0ULL);
    key.resize(key.size() + 16, 0);  // enough bytes for the count of one entry to fit
    key_file.entries.push_back(key);
    expect_rejected(key_file.encode(), {"metadata entry 0 key claims 18446744073709551615 bytes"});
}

TEST_F(Gguf, RejectsAnArrayCountThatCannotFit) {
    TestFile file = valid_file();
    file.entries.push_back(entry("a", 9, encoded_array(5, 1ULL << 40U, {})));
    expect_rejected(file.encode(), {"metadata 'a' array count 1099511627776 cannot fit"});
    TestFile strings;
    strings.entries.push_back(entry("s", 9, encoded_array(8, 100, Bytes(700, 0))));
    expect_rejected(strings.encode(), {"'s' array count 100 cannot fit", "at least 8"});
}

TEST_F(Gguf, RejectsAbsurdTensorAndMetadataCounts) {
    TestFile file = valid_file();
    file.tensor_count = 1ULL << 62U;
    expect_rejected(file.encode(), {"tensor count 4611686018427387904 cannot fit"});
    file = valid_file();
    file.metadata_count = ~0ULL;
    expect_rejected(file.encode(), {"metadata count 18446744073709551615 cannot fit"});
    file = valid_file();
    file.tensor_count = 3;  // fits the remaining bytes but only two infos follow
    expect_rejected(file.encode(), {"tensor 2"});
}

TEST_F(Gguf, RejectsAMisalignedTensorOffset) {
    TestFile file = valid_file();
    file.tensors[1].offset = 20;
    expect_rejected(file.encode(), {"tensor 'blk.0.attn_q.weight' data offset 20 is not a "
                                    "multiple of the alignment 32"});
}

TEST_F(Gguf, RejectsATensorPastTheEndOfTheFile) {
    TestFile file = valid_file();
    file.data.resize(file.data.size() - 1);
    expect_rejected(file.encode(), {"tensor 'blk.0.attn_q.weight' data [32, +36) ends past the "
                                    "end of the data section (67 bytes)"});
    file = valid_file();
    file.tensors[1].offset = 1ULL << 63U;  // offset + size would overflow 64 bits
    expect_rejected(file.encode(), {"'blk.0.attn_q.weight' data [9223372036854775808, +36)"});
}

TEST_F(Gguf, RejectsOverlappingTensors) {
    TestFile file = valid_file();
    file.tensors[0].dims = {12};  // 48 bytes: runs into the second tensor at 32
    file.data.resize(32 + 36 + 32, 0);
    expect_rejected(file.encode(), {"tensor 'norm.weight' data [0, 48) overlaps tensor "
                                    "'blk.0.attn_q.weight' at 32"});
    file = valid_file();
    file.tensors[1].offset = 0;  // both at 0
    expect_rejected(file.encode(), {"overlaps"});
}

TEST_F(Gguf, RejectsDuplicateTensorNames) {
    TestFile file = valid_file();
    file.tensors[1].name = "norm.weight";
    expect_rejected(file.encode(), {"tensor name 'norm.weight' appears twice (tensors 0 and 1)"});
}

TEST_F(Gguf, RejectsDuplicateKeys) {
    TestFile file = valid_file();
    file.entries.push_back(entry("llama.block_count", 4, encoded<std::uint32_t>(3)));
    expect_rejected(file.encode(),
                    {"metadata key 'llama.block_count' appears twice (entries 1 and 4)"});
}

TEST_F(Gguf, RejectsBadDimensions) {
    TestFile file = valid_file();
    file.tensors[0].dims = {};
    expect_rejected(file.encode(), {"tensor 'norm.weight' n_dims 0 is not 1..4"});
    file.tensors[0].dims = {1, 1, 1, 1, 4};
    expect_rejected(file.encode(), {"tensor 'norm.weight' n_dims 5 is not 1..4"});
    file.tensors[0].dims = {4, 0};
    expect_rejected(file.encode(), {"tensor 'norm.weight' dims[1] is 0 (must be > 0)"});
    file.tensors[0].dims = {1ULL << 32U, 1ULL << 31U};
    expect_rejected(file.encode(), {"tensor 'norm.weight' element count overflows int64 at "
                                    "dims[1] = 2147483648"});
    file.tensors[0].dims = {1ULL << 32U, 1ULL << 30U};  // 2^62 float32 elements: 2^64 bytes
    expect_rejected(file.encode(), {"tensor 'norm.weight' byte size (4611686018427387904 "
                                    "blocks of 4 bytes) overflows uint64"});
    file.tensors[0].dims = {1ULL << 32U, 1ULL << 20U};  // 2^54 bytes: past the file's end
    expect_rejected(file.encode(), {"ends past the end of the data section"});
}

TEST_F(Gguf, RejectsABadAlignmentValue) {
    for (const std::uint32_t alignment : {0U, 4U, 24U, 48U}) {
        SCOPED_TRACE(alignment);
        TestFile file = valid_file();
        file.entries.push_back(entry("general.alignment", 4, encoded<std::uint32_t>(alignment)));
        expect_rejected(file.encode(), {"'general.alignment' value " + std::to_string(alignment) +
                                        " is not a power of two that is a multiple of 8"});
    }
    TestFile file = valid_file();
    file.entries.push_back(entry("general.alignment", 10, encoded<std::uint64_t>(32)));
    expect_rejected(file.encode(), {"'general.alignment' has type uint64, expected uint32"});
}

TEST_F(Gguf, RejectsUnknownValueTypesNestedArraysAndBadBools) {
    TestFile file = valid_file();
    file.entries.push_back(entry("x", 13, encoded<std::uint32_t>(0)));
    expect_rejected(file.encode(), {"metadata 'x' has unknown value type 13"});
    file = valid_file();
    file.entries.push_back(entry("x", 9, encoded_array(13, 0, {})));
    expect_rejected(file.encode(), {"metadata 'x' has unknown array element type 13"});
    file = valid_file();
    file.entries.push_back(entry("x", 9, encoded_array(9, 1, encoded_array(4, 0, {}))));
    expect_rejected(file.encode(), {"'x' is an array of arrays"});
    file = valid_file();
    file.entries.push_back(entry("x", 7, encoded<std::uint8_t>(2)));
    expect_rejected(file.encode(), {"'x' bool value is 2 (must be 0 or 1)"});
    file = valid_file();
    file.entries.push_back(
        entry("x", 9, encoded_array(7, 2, encoded_values<std::uint8_t>({1, 9}))));
    expect_rejected(file.encode(), {"'x' bool value is 9"});
}

TEST_F(Gguf, RejectsBadKeysAndTensorNames) {
    TestFile file = valid_file();
    file.entries.push_back(entry("", 4, encoded<std::uint32_t>(0)));
    expect_rejected(file.encode(), {"metadata entry 4 key '' has 0 bytes (must be 1..65535)"});
    file = valid_file();
    file.tensors[0].name = "";
    expect_rejected(file.encode(), {"tensor 0 name '' has 0 bytes (must be 1..64)"});
    file.tensors[0].name = std::string(65, 'n');
    expect_rejected(file.encode(), {"has 65 bytes (must be 1..64)"});
    file.tensors[0].name = std::string(64, 'n');
    EXPECT_NO_THROW(static_cast<void>(open_bytes(file.encode())));
}

TEST_F(Gguf, RejectsUnknownTensorTypeIdsAndRowsThatSplitABlock) {
    TestFile file = valid_file();
    file.tensors[0].type = 4;  // the removed Q4_2
    expect_rejected(file.encode(), {"tensor 'norm.weight' has unknown ggml type id 4"});
    file.tensors[0].type = 1000;
    expect_rejected(file.encode(), {"unknown ggml type id 1000"});
    file = valid_file();
    file.tensors[1].dims = {16, 4};  // Q4_0 blocks hold 32 elements
    expect_rejected(file.encode(), {"tensor 'blk.0.attn_q.weight' row length ne0 = 16 is not a "
                                    "multiple of the Q4_0 (2) block size 32"});
}

TEST_F(Gguf, KnownButUnsupportedTypesOpenAndFailOnlyWhenDequantized) {
    TestFile file;
    file.tensors.push_back({"q5", {32}, 7, 0});  // Q5_1: 24 bytes per 32 elements
    file.data.resize(24, 0);
    const GgufFile gguf = open_bytes(file.encode());
    const GgufTensorInfo& tensor = gguf.tensor("q5");
    EXPECT_EQ(tensor.type, GgmlType::Q5_1);
    EXPECT_EQ(tensor.byte_size, 24U);
    EXPECT_EQ(gguf.tensor_bytes(tensor).size(), 24U);
    EXPECT_FALSE(gguf_can_dequantize(GgmlType::Q5_1));
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.dequantize(tensor)); },
                                  "tensor 'q5' has type Q5_1 (7), which dequantize does not "
                                  "support");
}

// ---- Dequantization of hand-built blocks. f16 bit patterns: 0x3C00 = 1, 0x3800 = 0.5,
// 0x3400 = 0.25, 0xBC00 = -1.

std::vector<float> blocks_to_floats(GgmlType type, const Bytes& blocks, std::size_t count) {
    std::vector<float> out(count);
    dequantize_gguf_blocks(type, blocks, out);
    return out;
}

TEST(GgufHalf, ConvertsEveryClassOfValueExactly) {
    EXPECT_EQ(gguf_half_to_float(0x3C00), 1.0F);
    EXPECT_EQ(gguf_half_to_float(0xC000), -2.0F);
    EXPECT_EQ(gguf_half_to_float(0x7BFF), 65504.0F);            // largest finite
    EXPECT_EQ(gguf_half_to_float(0x0400), 0x1p-14F);            // smallest normal
    EXPECT_EQ(gguf_half_to_float(0x0001), 0x1p-24F);            // smallest subnormal
    EXPECT_EQ(gguf_half_to_float(0x03FF), 1023.0F * 0x1p-24F);  // largest subnormal
    EXPECT_EQ(gguf_half_to_float(0x8201), -513.0F * 0x1p-24F);  // negative subnormal
    EXPECT_EQ(bits(gguf_half_to_float(0x8000)), 0x80000000U);   // -0
    EXPECT_EQ(gguf_half_to_float(0x7C00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(gguf_half_to_float(0xFC00), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(bits(gguf_half_to_float(0x7E00)), 0x7FC00000U);  // quiet NaN
    EXPECT_EQ(bits(gguf_half_to_float(0x7C01)), 0x7F802000U);  // signalling NaN, payload kept
    EXPECT_EQ(bits(gguf_half_to_float(0xFFFF)), 0xFFFFE000U);
}

TEST(GgufHalf, MatchesTheDefiningFormulaForAllFiniteValues) {
    // (-1)^s · 2^-24 · m for e = 0, (-1)^s · 2^(e-25) · (1024 + m) otherwise.
    for (std::uint32_t h = 0; h < 65536; ++h) {
        const std::uint32_t sign = h >> 15U;
        const std::uint32_t exponent = (h >> 10U) & 31U;
        const std::uint32_t mantissa = h & 1023U;
        if (exponent == 31) {
            continue;
        }
        const double magnitude = exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -24)
                                               : std::ldexp(static_cast<double>(1024 + mantissa),
                                                            static_cast<int>(exponent) - 25);
        const double expected = sign == 1 ? -magnitude : magnitude;
        const float actual = gguf_half_to_float(static_cast<std::uint16_t>(h));
        ASSERT_EQ(static_cast<double>(actual), expected) << h;
        ASSERT_EQ(std::signbit(actual), sign == 1) << h;
    }
}

TEST(GgufDequantize, F32CopiesBitsAndBf16ShiftsThem) {
    const Bytes f32 = encoded_values<std::uint32_t>({0x3F800000U, 0x7FC12345U, 0x80000001U});
    const std::vector<float> floats = blocks_to_floats(GgmlType::F32, f32, 3);
    EXPECT_EQ(bits(floats[0]), 0x3F800000U);
    EXPECT_EQ(bits(floats[1]), 0x7FC12345U);
    EXPECT_EQ(bits(floats[2]), 0x80000001U);

    const Bytes bf16 = encoded_values<std::uint16_t>({0x3F80, 0xC040, 0x7F80, 0x0001, 0x7FC1});
    const std::vector<float> values = blocks_to_floats(GgmlType::BF16, bf16, 5);
    EXPECT_EQ(values[0], 1.0F);
    EXPECT_EQ(values[1], -3.0F);
    EXPECT_EQ(values[2], std::numeric_limits<float>::infinity());
    EXPECT_EQ(bits(values[3]), 0x00010000U);
    EXPECT_EQ(bits(values[4]), 0x7FC10000U);
    EXPECT_EQ(gguf_bfloat16_to_float(0xBF00), -0.5F);
}

TEST(GgufDequantize, F16) {
    const Bytes f16 = encoded_values<std::uint16_t>({0x3C00, 0xB800, 0x0001, 0x7C00, 0x8000});
    const std::vector<float> values = blocks_to_floats(GgmlType::F16, f16, 5);
    EXPECT_EQ(values[0], 1.0F);
    EXPECT_EQ(values[1], -0.5F);
    EXPECT_EQ(values[2], 0x1p-24F);
    EXPECT_EQ(values[3], std::numeric_limits<float>::infinity());
    EXPECT_EQ(bits(values[4]), 0x80000000U);
}

// qs[j] = j | (15 − j) << 4: low nibbles 0..15 (elements 0..15), high nibbles 15..0 (16..31).
Bytes nibble_ramp() {
    Bytes qs;
    for (unsigned j = 0; j < 16; ++j) {
        qs.push_back(static_cast<std::uint8_t>(j | ((15U - j) << 4U)));
    }
    return qs;
}

TEST(GgufDequantize, Q4_0) {
    Bytes block = {0x00, 0x38};  // d = 0.5; x = d·(q − 8)
    const Bytes qs = nibble_ramp();
    block.insert(block.end(), qs.begin(), qs.end());
    const std::vector<float> expected = {-4.0F, -3.5F, -3.0F, -2.5F, -2.0F, -1.5F, -1.0F, -0.5F,
                                         0.0F,  0.5F,  1.0F,  1.5F,  2.0F,  2.5F,  3.0F,  3.5F,
                                         3.5F,  3.0F,  2.5F,  2.0F,  1.5F,  1.0F,  0.5F,  0.0F,
                                         -0.5F, -1.0F, -1.5F, -2.0F, -2.5F, -3.0F, -3.5F, -4.0F};
    EXPECT_EQ(blocks_to_floats(GgmlType::Q4_0, block, 32), expected);
}

TEST(GgufDequantize, Q4_1) {
    Bytes block = {0x00, 0x38, 0x00, 0xBC};  // d = 0.5, m = -1; x = d·q + m
    const Bytes qs = nibble_ramp();
    block.insert(block.end(), qs.begin(), qs.end());
    const std::vector<float> expected = {-1.0F, -0.5F, 0.0F, 0.5F, 1.0F, 1.5F, 2.0F,  2.5F,
                                         3.0F,  3.5F,  4.0F, 4.5F, 5.0F, 5.5F, 6.0F,  6.5F,
                                         6.5F,  6.0F,  5.5F, 5.0F, 4.5F, 4.0F, 3.5F,  3.0F,
                                         2.5F,  2.0F,  1.5F, 1.0F, 0.5F, 0.0F, -0.5F, -1.0F};
    EXPECT_EQ(blocks_to_floats(GgmlType::Q4_1, block, 32), expected);
}

TEST(GgufDequantize, Q5_0) {
    // d = 0.5; qh = bit 0 and bit 31; x_j = d·((n_j | h_j·16) − 16)
    Bytes block = {0x00, 0x38, 0x01, 0x00, 0x00, 0x80};
    const Bytes qs = nibble_ramp();
    block.insert(block.end(), qs.begin(), qs.end());
    std::vector<float> expected(32);
    for (std::size_t j = 0; j < 32; ++j) {
        const int nibble = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
        const int fifth = j == 0 || j == 31 ? 16 : 0;
        expected[j] = 0.5F * static_cast<float>(nibble + fifth - 16);
    }
    EXPECT_EQ(expected[0], 0.0F);   // n = 0, h = 1: 16 − 16
    EXPECT_EQ(expected[1], -7.5F);  // n = 1, h = 0
    EXPECT_EQ(expected[31], 0.0F);  // n = 0 (the ramp's last high nibble), h = 1
    EXPECT_EQ(blocks_to_floats(GgmlType::Q5_0, block, 32), expected);
}

TEST(GgufDequantize, Q8_0) {
    Bytes block = {0x00, 0x34};  // d = 0.25; q_j = 8j − 128 as int8; x = d·q = 2j − 32
    for (int j = 0; j < 32; ++j) {
        block.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(8 * j - 128)));
    }
    const std::vector<float> expected = {
        -32.0F, -30.0F, -28.0F, -26.0F, -24.0F, -22.0F, -20.0F, -18.0F, -16.0F, -14.0F, -12.0F,
        -10.0F, -8.0F,  -6.0F,  -4.0F,  -2.0F,  0.0F,   2.0F,   4.0F,   6.0F,   8.0F,   10.0F,
        12.0F,  14.0F,  16.0F,  18.0F,  20.0F,  22.0F,  24.0F,  26.0F,  28.0F,  30.0F};
    EXPECT_EQ(blocks_to_floats(GgmlType::Q8_0, block, 32), expected);
}

// The 12 packed scale bytes of Q4_K/Q5_K for, worked out by hand,
//   sc = {1, 2, 3, 4, 33, 18, 49, 63} and m = {0, 1, 2, 3, 17, 34, 5, 63}:
// bytes 0..3 = sc_j | (sc_{j+4} >> 4) << 6, bytes 4..7 = m_j | (m_{j+4} >> 4) << 6,
// bytes 8..11 = (sc_{j+4} & 15) | (m_{j+4} & 15) << 4.
const Bytes k_scale_bytes = {0x81, 0x42, 0xC3, 0xC4, 0x40, 0x81,
                             0x02, 0xC3, 0x11, 0x22, 0x51, 0xFF};
const double k_sc[8] = {1, 2, 3, 4, 33, 18, 49, 63};
const double k_m[8] = {0, 1, 2, 3, 17, 34, 5, 63};

// qs byte i = (i % 16) | (15 − i % 16) << 4: sub-block j element l has the 4-bit value
// l % 16 (j even, low nibbles) or 15 − l % 16 (j odd, high nibbles).
Bytes k_nibbles() {
    Bytes qs;
    for (unsigned i = 0; i < 128; ++i) {
        qs.push_back(static_cast<std::uint8_t>((i % 16U) | ((15U - i % 16U) << 4U)));
    }
    return qs;
}

double k_low_nibble(std::size_t sub_block, std::size_t l) {
    return sub_block % 2 == 0 ? static_cast<double>(l % 16) : static_cast<double>(15 - l % 16);
}

TEST(GgufDequantize, Q4_K) {
    Bytes block = {0x00, 0x3C, 0x00, 0x38};  // d = 1, dmin = 0.5
    block.insert(block.end(), k_scale_bytes.begin(), k_scale_bytes.end());
    const Bytes qs = k_nibbles();
    block.insert(block.end(), qs.begin(), qs.end());
    ASSERT_EQ(block.size(), 144U);
    const std::vector<float> values = blocks_to_floats(GgmlType::Q4_K, block, 256);
    // x[32j + l] = d·sc_j·q − dmin·m_j (every value here is exact in float).
    for (std::size_t j = 0; j < 8; ++j) {
        for (std::size_t l = 0; l < 32; ++l) {
            const double expected = k_sc[j] * k_low_nibble(j, l) - 0.5 * k_m[j];
            ASSERT_EQ(static_cast<double>(values[32 * j + l]), expected) << j << "," << l;
        }
    }
    EXPECT_EQ(values[0], 0.0F);      // j 0, q 0
    EXPECT_EQ(values[47], -0.5F);    // j 1, l 15, q 0: 2·0 − 0.5·1
    EXPECT_EQ(values[133], 156.5F);  // j 4, l 5, q 5: 33·5 − 8.5
    EXPECT_EQ(values[224], 913.5F);  // j 7, l 0, q 15: 63·15 − 31.5
    EXPECT_EQ(values[255], -31.5F);  // j 7, l 31, q 0
}

TEST(GgufDequantize, Q5_K) {
    Bytes block = {0x00, 0x3C, 0x00, 0x38};  // d = 1, dmin = 0.5
    block.insert(block.end(), k_scale_bytes.begin(), k_scale_bytes.end());
    for (std::size_t l = 0; l < 32; ++l) {  // qh[l]: bit j is the fifth bit of sub-block j
        block.push_back(l % 2 == 0 ? 0xA5 : 0x5A);
    }
    const Bytes qs = k_nibbles();
    block.insert(block.end(), qs.begin(), qs.end());
    ASSERT_EQ(block.size(), 176U);
    const std::vector<float> values = blocks_to_floats(GgmlType::Q5_K, block, 256);
    for (std::size_t j = 0; j < 8; ++j) {
        for (std::size_t l = 0; l < 32; ++l) {
            const unsigned qh = l % 2 == 0 ? 0xA5U : 0x5AU;
            const double high = ((qh >> j) & 1U) == 1U ? 16.0 : 0.0;
            const double expected = k_sc[j] * (k_low_nibble(j, l) + high) - 0.5 * k_m[j];
            ASSERT_EQ(static_cast<double>(values[32 * j + l]), expected) << j << "," << l;
        }
    }
    EXPECT_EQ(values[0], 16.0F);      // j 0, l 0: 0xA5 bit 0 set, q = 16: 1·16 − 0
    EXPECT_EQ(values[133], 684.5F);   // j 4, l 5: 0x5A bit 4 set, q = 5 + 16: 33·21 − 8.5
    EXPECT_EQ(values[224], 1921.5F);  // j 7, l 0: 0xA5 bit 7 set, q = 15 + 16: 63·31 − 31.5
    EXPECT_EQ(values[255], -31.5F);   // j 7, l 31: 0x5A bit 7 clear, q = 0: −0.5·63
}

TEST(GgufDequantize, Q6_K) {
    // ql[i] = i, qh[i] = (37·i) mod 256, sc[i] = i − 8, d = 0.5.
    Bytes block;
    for (unsigned i = 0; i < 128; ++i) {
        block.push_back(static_cast<std::uint8_t>(i));
    }
    for (unsigned i = 0; i < 64; ++i) {
        block.push_back(static_cast<std::uint8_t>((37U * i) & 0xFFU));
    }
    for (int i = 0; i < 16; ++i) {
        block.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(i - 8)));
    }
    block.push_back(0x00);
    block.push_back(0x38);
    ASSERT_EQ(block.size(), 210U);
    const std::vector<float> values = blocks_to_floats(GgmlType::Q6_K, block, 256);
    // The format's definition, half by half (n = 0, 128): for l < 32, with ql, qh advanced by
    // 64 and 32 bytes and the scales by 8 per half:
    //   y[n+l]    = d·sc[l/16]    ·((ql[l]    & 15 | (qh[l] >> 0 & 3) << 4) − 32)
    //   y[n+l+32] = d·sc[l/16 + 2]·((ql[l+32] & 15 | (qh[l] >> 2 & 3) << 4) − 32)
    //   y[n+l+64] = d·sc[l/16 + 4]·((ql[l]    >> 4 | (qh[l] >> 4 & 3) << 4) − 32)
    //   y[n+l+96] = d·sc[l/16 + 6]·((ql[l+32] >> 4 | (qh[l] >> 6 & 3) << 4) − 32)
    for (unsigned half = 0; half < 2; ++half) {
        for (unsigned l = 0; l < 32; ++l) {
            const unsigned ql0 = 64 * half + l;
            const unsigned ql32 = ql0 + 32;
            const unsigned qh = (37U * (32 * half + l)) & 0xFFU;
            const unsigned quarter_q[4] = {
                (ql0 & 15U) | ((qh & 3U) << 4U), (ql32 & 15U) | (((qh >> 2U) & 3U) << 4U),
                (ql0 >> 4U) | (((qh >> 4U) & 3U) << 4U), (ql32 >> 4U) | (((qh >> 6U) & 3U) << 4U)};
            for (unsigned quarter = 0; quarter < 4; ++quarter) {
                const int scale = static_cast<int>(8 * half + l / 16 + 2 * quarter) - 8;
                const double expected = 0.5 * scale * (static_cast<int>(quarter_q[quarter]) - 32);
                const unsigned e = 128 * half + 32 * quarter + l;
                ASSERT_EQ(static_cast<double>(values[e]), expected) << e;
            }
        }
    }
    EXPECT_EQ(values[0], 128.0F);  // ql 0, qh 0: q = −32, sc −8: 0.5·(−8)·(−32)
    // e = 255: half 1, quarter 3, l 31: ql[64 + 63] >> 4 = 7, qh[63] = 37·63 mod 256 = 27,
    // 27 >> 6 = 0, q = 7 − 32 = −25, sc[15] = 7: 0.5·7·(−25) = −87.5.
    EXPECT_EQ(values[255], -87.5F);
}

TEST(GgufDequantize, RejectsWrongSizesAndUnsupportedTypes) {
    std::vector<float> out(32);
    expect_error<std::invalid_argument>(
        [&] { dequantize_gguf_blocks(GgmlType::Q4_0, Bytes(19, 0), out); },
        "blocks has 19 bytes, not a multiple of Q4_0 (2)'s 18-byte block");
    expect_error<std::invalid_argument>(
        [&] { dequantize_gguf_blocks(GgmlType::Q4_0, Bytes(36, 0), out); },
        "out has 32 floats, expected 64 (2 blocks of 32)");
    expect_error<std::invalid_argument>(
        [&] { dequantize_gguf_blocks(GgmlType::IQ2_XXS, Bytes(66, 0), out); },
        "type IQ2_XXS (16) is not supported");
    expect_error<std::invalid_argument>(
        [&] { dequantize_gguf_blocks(static_cast<GgmlType>(99), Bytes(4, 0), out); },
        "type unknown (99) is not supported");
    for (const GgmlType type :
         {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
          GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
        EXPECT_TRUE(gguf_can_dequantize(type)) << ggml_type_name(type);
    }
}

TEST_F(Gguf, DequantizesRowsInOrderAcrossManyThreadedChunks) {
    // Q8_0 [rows = 96, ne0 = 2048]: 6144 blocks, several 64Ki-element chunks. Block b has
    // d = 1 and every q = (b mod 200) − 100, so element i has value ⌊i/32⌋ mod 200 − 100.
    TestFile file;
    const std::uint64_t ne0 = 2048;
    const std::uint64_t rows = 96;
    append_q8_0_tensor(file, "w", ne0, rows, [](std::size_t b) {
        return static_cast<std::int8_t>(static_cast<int>(b % 200) - 100);
    });
    const GgufFile gguf = open_bytes(file.encode());
    const std::vector<float> values = gguf.dequantize(gguf.tensor("w"));
    ASSERT_EQ(values.size(), ne0 * rows);
    for (std::size_t i = 0; i < values.size(); ++i) {
        ASSERT_EQ(values[i], static_cast<float>(static_cast<int>((i / 32) % 200) - 100)) << i;
    }
    std::vector<float> wrong(3);
    expect_error<std::invalid_argument>([&] { gguf.dequantize_into(gguf.tensor("w"), wrong); },
                                        "tensor 'w' has 196608 elements but out has 3");
}

// ---- A file that shrinks while it loads (a copy or re-download over it during start-up).

TEST_F(Gguf, ATensorReadAfterTheFileShrankIsAnErrorNamingTheOffsets) {
    const TestFile file = valid_file();
    const Bytes bytes = file.encode();
    const GgufFile gguf = open_bytes(bytes);
    std::filesystem::resize_file(directory_ / "model.gguf", bytes.size() - 20);
    // Mapped and copied, this read touched a page past the end of the file: SIGBUS.
    expect_error<GgufFormatError>([&] { static_cast<void>(gguf.dequantize(gguf.tensors()[1])); },
                                  "the file shrank while it was being read");
    EXPECT_EQ(gguf.dequantize(gguf.tensors()[0]), (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
}

// The child half of the race below: run by the parent through /proc/self/exe with the file
// and a pipe in the environment, it says "ready" on the pipe, then opens and dequantizes
// every tensor; its exit status tells the parent how the load ended.
TEST(GgufShrinkingChild, Load) {
    const char* path = std::getenv("RIFTCO_GGUF_SHRINK_PATH");
    const char* ready = std::getenv("RIFTCO_GGUF_SHRINK_READY_FD");
    if (path == nullptr || ready == nullptr)
        GTEST_SKIP() << "run only as the child of AFileThatShrinksWhileLoadingNeverKillsTheProcess";
    const int descriptor = std::atoi(ready);
    const char signal_byte = 'r';
    if (::write(descriptor, &signal_byte, 1) != 1)
        std::_Exit(5);
    ::close(descriptor);
    int status = 0;
    try {
        const GgufFile gguf = GgufFile::open(path);
        for (const GgufTensorInfo& tensor : gguf.tensors())
            static_cast<void>(gguf.dequantize(tensor));
    } catch (const GgufFormatError&) {
        status = 3;
    } catch (...) {
        status = 4;
    }
    std::_Exit(status);
}

TEST_F(Gguf, AFileThatShrinksWhileLoadingNeverKillsTheProcess) {
    // A 3 MiB metadata string (the header is read in several pread steps) and 8 MiB of Q8_0
    // data; each trial truncates the file at a different moment to a different length while
    // a child process loads it. Every child must exit by itself: loaded (0) or a
    // GgufFormatError (3), never a signal.
    TestFile file;
    file.entries.push_back(entry("general.architecture", 8, encoded_string("llama")));
    file.entries.push_back(
        entry("tokenizer.chat_template", 8, encoded_string(std::string(3U << 20U, 'x'))));
    const std::uint64_t ne0 = 4096;
    const std::uint64_t rows = 64;
    const auto seventh = [](std::size_t b) { return static_cast<std::int8_t>(b % 7); };
    append_q8_0_tensor(file, "w", ne0, rows, seventh);
    append_q8_0_tensor(file, "v", ne0, rows, seventh);
    const Bytes bytes = file.encode();
    const std::filesystem::path path = directory_ / "shrinking.gguf";

    constexpr int trials = 48;
    int loaded = 0;
    int rejected = 0;
    for (int trial = 0; trial < trials; ++trial) {
        {
            std::ofstream stream(path, std::ios::binary | std::ios::trunc);
            stream.write(reinterpret_cast<const char*>(bytes.data()),
                         static_cast<std::streamsize>(bytes.size()));
        }
        int ready[2];
        ASSERT_EQ(::pipe(ready), 0);
        const pid_t child = ::fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            ::close(ready[0]);
            ::setenv("RIFTCO_GGUF_SHRINK_PATH", path.c_str(), 1);
            ::setenv("RIFTCO_GGUF_SHRINK_READY_FD", std::to_string(ready[1]).c_str(), 1);
            ::execl("/proc/self/exe", "test_gguf", "--gtest_filter=GgufShrinkingChild.Load",
                    static_cast<char*>(nullptr));
            std::_Exit(6);
        }
        ::close(ready[1]);
        char signal_byte = 0;
        ASSERT_EQ(::read(ready[0], &signal_byte, 1), 1);
        ::close(ready[0]);
        // 0..11.75 ms after the child starts, to 0..7/8 of the file's length.
        std::this_thread::sleep_for(std::chrono::microseconds(250 * trial));
        const auto length = bytes.size() / 8 * static_cast<std::size_t>((trial * 5) % 8);
        ASSERT_EQ(::truncate(path.c_str(), static_cast<::off_t>(length)), 0);
        int status = 0;
        ASSERT_EQ(::waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFEXITED(status)) << "trial " << trial << ": the child died of signal "
                                       << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        const int code = WEXITSTATUS(status);
        ASSERT_TRUE(code == 0 || code == 3) << "trial " << trial << ": exit status " << code;
        (code == 0 ? loaded : rejected) += 1;
    }
    EXPECT_GT(rejected, 0);
    std::cout << "[ shrinking ] " << trials << " trials: " << loaded << " loaded before the cut, "
              << rejected << " refused with GgufFormatError, none killed by a signal\n";
}

// ---- Robustness: every single-byte mutation of a valid header, and every truncation.

TEST(GgufRobustness, MutatedHeadersEitherOpenOrThrowGgufFormatError) {
    const TestFile file = valid_file();
    const Bytes original = file.encode();
    const std::size_t header_bytes = file.header().size();
    std::size_t accepted = 0;
    std::size_t rejected = 0;
    const auto attempt = [&](Bytes bytes) {
        try {
            const GgufFile gguf = GgufFile::from_bytes(std::move(bytes), "mutant");
            for (const GgufTensorInfo& tensor : gguf.tensors()) {
                if (gguf_can_dequantize(tensor.type)) {
                    const std::vector<float> values = gguf.dequantize(tensor);
                    ASSERT_EQ(values.size(), tensor.element_count);
                }
            }
            ++accepted;
        } catch (const GgufFormatError&) {
            ++rejected;
        }
    };
    constexpr std::uint8_t flips[] = {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF};
    for (std::size_t position = 0; position < header_bytes; ++position) {
        for (const std::uint8_t flip : flips) {
            Bytes mutated = original;
            mutated[position] ^= flip;
            attempt(std::move(mutated));
        }
        for (const std::uint8_t value : {std::uint8_t{0x00}, std::uint8_t{0xFF}}) {
            Bytes mutated = original;
            mutated[position] = value;
            attempt(std::move(mutated));
        }
    }
    for (std::size_t length = 0; length <= original.size(); ++length) {
        attempt(Bytes(original.begin(), original.begin() + length));
    }
    EXPECT_GT(accepted, 0U);
    EXPECT_GT(rejected, header_bytes);  // most mutations of a header are detectable
}

}  // namespace
}  // namespace riftco_transformer
