#pragma once
// GGUF (llama.cpp's model file): a strict reader and a dequantizer to float32.
//
// File layout (little-endian; version 3, version 2 accepted: the same layout):
//   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_count
//   metadata_count × (string key | u32 value_type | value)
//   tensor_count × (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset)
//   zero padding to `alignment` | data section (each tensor at data_offset + offset)
// with string = u64 byte length + bytes (no terminator), and an array value = u32 element
// type + u64 count + elements.
//
// Validation (every rule throws GgufFormatError naming the field and the value):
// - magic; version 2 or 3 (version 1 had 32-bit counts; a byte-swapped version is a
//   big-endian file; both rejected);
// - counts and lengths: a claimed tensor count, metadata count, string length or array
//   count must fit in the bytes that remain (at the smallest possible encoding of each
//   item) before anything is allocated, so a hostile header cannot cause a huge allocation;
// - metadata: keys 1..65535 bytes and unique; value types 0..12; bool bytes 0 or 1; an array
//   of arrays is rejected (llama.cpp rejects them too: no model file has one); empty arrays
//   are accepted. String bytes are kept as they are (not checked as UTF-8);
// - `general.alignment`, when present: of type uint32 (as the specification says) and a
//   power of two that is a multiple of 8; default 32;
// - tensors: names 1..64 bytes and unique; 1..4 dims, each > 0; the element count must not
//   overflow int64; a ggml type id whose block layout is known (every id the `gguf` package
//   lists, whether or not dequantize supports it: see ggml_type_layout); dims[0] a multiple of
//   the type's block size; offset a multiple of the alignment; offset + byte size within the
//   file; no two tensors overlapping. Padding bytes are not checked.
//
// Shapes keep GGUF's order: dims[0] (ne0) varies fastest, i.e. it is the row length. A
// tensor with dims {ne0, ne1} is the row-major matrix [ne1, ne0] ([out, in] for a weight).
//
// Requires a little-endian host. A GgufFile is immutable and move-only; the spans it hands
// out stay valid while it lives (the file is memory-mapped read-only when possible).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace riftco_transformer {

// Every malformed or unsupported file, and every metadata/tensor lookup that fails. The
// message starts "gguf: <source>: ", source being the path (or the name given to from_bytes).
class GgufFormatError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// GGUF metadata value types (the format's ids; never renumber).
enum class GgufValueType : std::uint32_t {
    Uint8 = 0,
    Int8 = 1,
    Uint16 = 2,
    Int16 = 3,
    Uint32 = 4,
    Int32 = 5,
    Float32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    Uint64 = 10,
    Int64 = 11,
    Float64 = 12,
};

// "uint8", "int8", ..., "float64"; an id outside 0..12 gives "unknown".
[[nodiscard]] std::string_view gguf_value_type_name(GgufValueType type) noexcept;

// The elements of an array value. The alternative's index is the element type's id; index 9
// (an array of arrays) is never held (such files are rejected).
struct GgufArray {
    using Elements =
        std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>,
                     std::vector<std::uint16_t>, std::vector<std::int16_t>,
                     std::vector<std::uint32_t>, std::vector<std::int32_t>, std::vector<float>,
                     std::vector<bool>, std::vector<std::string>, std::monostate,
                     std::vector<std::uint64_t>, std::vector<std::int64_t>, std::vector<double>>;
    Elements elements;

    [[nodiscard]] GgufValueType element_type() const noexcept {
        return static_cast<GgufValueType>(elements.index());
    }
    [[nodiscard]] std::size_t size() const;
};

// One metadata value. The alternative's index is the value type's id, so
// std::get<std::string>(value.data) reads a string value and type() is the GGUF type.
struct GgufValue {
    using Data = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t,
                              std::int32_t, float, bool, std::string, GgufArray, std::uint64_t,
                              std::int64_t, double>;
    Data data;

    [[nodiscard]] GgufValueType type() const noexcept {
        return static_cast<GgufValueType>(data.index());
    }
};

struct GgufMetadataEntry {
    std::string key;
    GgufValue value;
};

// ggml tensor types (ggml.h ids, as the `gguf` package's GGMLQuantizationType lists them;
// never renumber). dequantize supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K,
// Q6_K.
enum class GgmlType : std::uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
};

// A type's storage: `block_bytes` bytes encode `block_elements` consecutive elements of a row.
struct GgmlTypeLayout {
    std::size_t block_elements = 0;
    std::size_t block_bytes = 0;
};

// The layout of type id `type` (GGML_QUANT_SIZES of the `gguf` package); nullopt for an id
// with no known layout (e.g. 4, 5: the removed Q4_2/Q4_3).
[[nodiscard]] std::optional<GgmlTypeLayout> ggml_type_layout(GgmlType type) noexcept;
// "Q4_K" etc.; "unknown" for an id with no known layout.
[[nodiscard]] std::string_view ggml_type_name(GgmlType type) noexcept;
// `text` from a file, fit for a message: printable ASCII as it is, any other byte (a NUL
// included, which would end a C string) as \xHH; at most 80 bytes, then "...".
[[nodiscard]] std::string gguf_printable(std::string_view text);
// Whether dequantize_gguf_blocks / GgufFile::dequantize handle `type`.
[[nodiscard]] bool gguf_can_dequantize(GgmlType type) noexcept;

struct GgufTensorInfo {
    std::string name;
    std::vector<std::uint64_t> dims;  // GGUF order: dims[0] = ne0 (fastest, the row length)
    GgmlType type = GgmlType::F32;
    std::uint64_t offset = 0;         // bytes from GgufFile::data_offset()
    std::uint64_t element_count = 0;  // product of dims
    std::uint64_t byte_size = 0;      // element_count / block_elements × block_bytes
};

class GgufFile {
  public:
    // Opens `path` and validates it. The header is parsed from pread buffers and
    // dequantize reads tensors with pread, so a file that shrinks while it loads is a
    // GgufFormatError (never a SIGBUS); it is also mapped read-only for tensor_bytes().
    // A file that cannot be mapped (a pipe) is read whole.
    // A malformed file: GgufFormatError. A file that cannot be opened or read:
    // std::system_error.
    [[nodiscard]] static GgufFile open(const std::filesystem::path& path);
    // Validates an in-memory file image (owned from now on); `source` names it in messages.
    [[nodiscard]] static GgufFile from_bytes(std::vector<std::uint8_t> bytes,
                                             std::string source = "<memory>");

    GgufFile(GgufFile&&) noexcept = default;
    GgufFile& operator=(GgufFile&&) noexcept = default;
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;
    ~GgufFile() = default;

    [[nodiscard]] const std::string& source() const noexcept { return source_; }
    [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
    [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
    // File offset of the data section: the end of the tensor infos rounded up to alignment().
    [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }
    [[nodiscard]] std::size_t file_size() const noexcept { return size_; }

    // ---- Metadata, in file order.
    [[nodiscard]] const std::vector<GgufMetadataEntry>& metadata() const noexcept {
        return metadata_;
    }
    // The value of `key`, or nullptr when absent.
    [[nodiscard]] const GgufValue* find(std::string_view key) const noexcept;
    [[nodiscard]] bool contains(std::string_view key) const noexcept {
        return find(key) != nullptr;
    }
    // The value of `key`; absent: GgufFormatError naming the key.
    [[nodiscard]] const GgufValue& at(std::string_view key) const;

    // Typed getters. Absent key or another type: GgufFormatError naming the key, the
    // expected and the actual type. The integer getters accept a value stored as ANY integer
    // type (uint8..int64; writers differ in the width they use, e.g. uint32 vs int32 token
    // ids) when its value fits the requested type, and otherwise name the value; bool and
    // float types are never converted. The array getters apply the same rule per element.
    [[nodiscard]] const std::string& get_string(std::string_view key) const;
    [[nodiscard]] bool get_bool(std::string_view key) const;
    [[nodiscard]] std::uint32_t get_uint32(std::string_view key) const;
    [[nodiscard]] std::int32_t get_int32(std::string_view key) const;
    [[nodiscard]] std::uint64_t get_uint64(std::string_view key) const;
    [[nodiscard]] std::int64_t get_int64(std::string_view key) const;
    [[nodiscard]] float get_float32(std::string_view key) const;
    [[nodiscard]] double get_float64(std::string_view key) const;
    [[nodiscard]] const GgufArray& get_array(std::string_view key) const;
    [[nodiscard]] const std::vector<std::string>& get_string_array(std::string_view key) const;
    [[nodiscard]] std::vector<std::int32_t> get_int32_array(std::string_view key) const;
    [[nodiscard]] std::vector<std::uint32_t> get_uint32_array(std::string_view key) const;
    [[nodiscard]] std::vector<std::int64_t> get_int64_array(std::string_view key) const;
    [[nodiscard]] const std::vector<float>& get_float32_array(std::string_view key) const;

    // ---- Tensors, in file order.
    [[nodiscard]] const std::vector<GgufTensorInfo>& tensors() const noexcept { return tensors_; }
    // nullptr when absent.
    [[nodiscard]] const GgufTensorInfo* find_tensor(std::string_view name) const noexcept;
    // Absent: GgufFormatError naming the tensor.
    [[nodiscard]] const GgufTensorInfo& tensor(std::string_view name) const;

    // The stored bytes of `tensor`, which must be one of tensors() (a reference obtained
    // from this file); another object: std::invalid_argument. For an opened file they are a
    // view of a read-only mapping: reading them after the file has shrunk under it raises
    // SIGBUS, so loaders use dequantize/dequantize_into, which read with pread.
    [[nodiscard]] std::span<const std::uint8_t> tensor_bytes(const GgufTensorInfo& tensor) const;

    // A copy of the stored bytes of `tensor` (read with pread from an opened file, so a file
    // that has shrunk is a GgufFormatError, never a SIGBUS); another object:
    // std::invalid_argument.
    [[nodiscard]] std::vector<std::uint8_t> read_tensor_bytes(const GgufTensorInfo& tensor) const;

    // The tensor as float32, ne0 fastest (element i of row r at r·ne0 + i), exactly as the
    // format's formulas define (gguf_dequantize.cpp). A type dequantize does not support:
    // GgufFormatError naming the tensor and the type id. Runs on OpenMP threads.
    [[nodiscard]] std::vector<float> dequantize(const GgufTensorInfo& tensor) const;
    // The same into `out` (out.size() must equal element_count: else std::invalid_argument).
    void dequantize_into(const GgufTensorInfo& tensor, std::span<float> out) const;

  private:
    GgufFile() = default;
    // descriptor >= 0: the header is read from it with pread (bytes only back tensor_bytes);
    // -1: everything is read from bytes.
    static GgufFile parse(std::shared_ptr<const void> owner, const std::uint8_t* bytes,
                          std::size_t size, std::string source, int descriptor);
    // Bytes [offset, offset + out.size()) of the data section; read with pread from an
    // opened file, so a file that has shrunk since open() is a GgufFormatError.
    void read_data(std::uint64_t offset, std::span<std::uint8_t> out) const;
    [[nodiscard]] std::size_t tensor_index_of(const GgufTensorInfo& tensor) const;

    std::shared_ptr<const void> owner_;  // the mapping or the buffer behind bytes_
    const std::uint8_t* bytes_ = nullptr;
    std::size_t size_ = 0;
    int descriptor_ = -1;  // owned by owner_ when >= 0
    std::string source_;
    std::uint32_t version_ = 0;
    std::uint64_t alignment_ = 32;
    std::uint64_t data_offset_ = 0;
    std::vector<GgufMetadataEntry> metadata_;
    std::map<std::string, std::size_t, std::less<>> metadata_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

// ---- Raw blocks (also for callers that convert blocks directly, e.g. to NF4).

// Dequantizes whole blocks of `type`: `blocks` holds k·block_bytes bytes and `out` exactly
// k·block_elements floats. Any other size: std::invalid_argument; a type that is not
// supported (gguf_can_dequantize): std::invalid_argument naming the type and its id.
// Single-threaded.
void dequantize_gguf_blocks(GgmlType type, std::span<const std::uint8_t> blocks,
                            std::span<float> out);

// IEEE binary16 -> float32, exact: subnormals become normal floats, ±inf stays, a NaN keeps
// its sign and payload (mantissa << 13), as numpy's float16 -> float32 does.
[[nodiscard]] float gguf_half_to_float(std::uint16_t bits) noexcept;
// bfloat16 -> float32, exact (the bits << 16).
[[nodiscard]] float gguf_bfloat16_to_float(std::uint16_t bits) noexcept;

}  // namespace riftco_transformer
