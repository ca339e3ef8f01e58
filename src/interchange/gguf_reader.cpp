#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "riftco_transformer/interchange/gguf.hpp"

namespace riftco_transformer {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader reads little-endian fields with memcpy");

constexpr std::uint32_t gguf_magic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr std::uint64_t default_alignment = 32;
constexpr std::size_t maximum_dims = 4;
constexpr std::size_t maximum_key_bytes = 65535;
constexpr std::size_t maximum_tensor_name_bytes = 64;
constexpr std::string_view alignment_key = "general.alignment";

// The smallest encodings, used to bound claimed counts by the bytes that remain:
// metadata entry = key length (8) + 1-byte key + value type (4) + 1-byte value;
// tensor info = name length (8) + 1-byte name + n_dims (4) + one dim (8) + type (4) + offset (8).
constexpr std::uint64_t smallest_metadata_entry_bytes = 8 + 1 + 4 + 1;
constexpr std::uint64_t smallest_tensor_info_bytes = 8 + 1 + 4 + 8 + 4 + 8;

struct TypeRow {
    GgmlType type;
    std::string_view name;
    GgmlTypeLayout layout;
};

// GGML_QUANT_SIZES (gguf-py constants.py): elements per block, bytes per block.
constexpr std::array<TypeRow, 34> type_table = {{
    {GgmlType::F32, "F32", {1, 4}},
    {GgmlType::F16, "F16", {1, 2}},
    {GgmlType::Q4_0, "Q4_0", {32, 2 + 16}},
    {GgmlType::Q4_1, "Q4_1", {32, 2 + 2 + 16}},
    {GgmlType::Q5_0, "Q5_0", {32, 2 + 4 + 16}},
    {GgmlType::Q5_1, "Q5_1", {32, 2 + 2 + 4 + 16}},
    {GgmlType::Q8_0, "Q8_0", {32, 2 + 32}},
    {GgmlType::Q8_1, "Q8_1", {32, 4 + 4 + 32}},
    {GgmlType::Q2_K, "Q2_K", {256, 2 + 2 + 256 / 16 + 256 / 4}},
    {GgmlType::Q3_K, "Q3_K", {256, 2 + 256 / 4 + 256 / 8 + 12}},
    {GgmlType::Q4_K, "Q4_K", {256, 2 + 2 + 256 / 2 + 12}},
    {GgmlType::Q5_K, "Q5_K", {256, 2 + 2 + 256 / 2 + 256 / 8 + 12}},
    {GgmlType::Q6_K, "Q6_K", {256, 2 + 256 / 2 + 256 / 4 + 256 / 16}},
    {GgmlType::Q8_K, "Q8_K", {256, 4 + 256 + 256 / 8}},
    {GgmlType::IQ2_XXS, "IQ2_XXS", {256, 2 + 256 / 4}},
    {GgmlType::IQ2_XS, "IQ2_XS", {256, 2 + 256 / 4 + 256 / 32}},
    {GgmlType::IQ3_XXS, "IQ3_XXS", {256, 2 + 256 / 4 + 256 / 8}},
    {GgmlType::IQ1_S, "IQ1_S", {256, 2 + 256 / 8 + 256 / 16}},
    {GgmlType::IQ4_NL, "IQ4_NL", {32, 2 + 16}},
    {GgmlType::IQ3_S, "IQ3_S", {256, 2 + 256 / 4 + 256 / 8 + 256 / 32 + 4}},
    {GgmlType::IQ2_S, "IQ2_S", {256, 2 + 256 / 4 + 256 / 16}},
    {GgmlType::IQ4_XS, "IQ4_XS", {256, 2 + 2 + 256 / 2 + 256 / 64}},
    {GgmlType::I8, "I8", {1, 1}},
    {GgmlType::I16, "I16", {1, 2}},
    {GgmlType::I32, "I32", {1, 4}},
    {GgmlType::I64, "I64", {1, 8}},
    {GgmlType::F64, "F64", {1, 8}},
    {GgmlType::IQ1_M, "IQ1_M", {256, 256 / 8 + 256 / 16 + 256 / 32}},
    {GgmlType::BF16, "BF16", {1, 2}},
    {GgmlType::TQ1_0, "TQ1_0", {256, 2 + 4 * 13}},
    {GgmlType::TQ2_0, "TQ2_0", {256, 2 + 64}},
    {GgmlType::MXFP4, "MXFP4", {32, 1 + 16}},
    {GgmlType::NVFP4, "NVFP4", {64, 4 + 32}},
    {GgmlType::Q1_0, "Q1_0", {128, 2 + 16}},
}};

const TypeRow* type_row(GgmlType type) noexcept {
    const auto found = std::find_if(type_table.begin(), type_table.end(),
                                    [&](const TypeRow& row) { return row.type == type; });
    return found == type_table.end() ? nullptr : &*found;
}

std::string in_quotes(std::string_view text) {
    std::string result = "'";
    result.append(text);
    result.push_back('\'');
    return result;
}

}  // namespace

// The metadata key or tensor name for a message: printable ASCII kept, anything else as \xNN,
// cut after 80 bytes (a hostile name cannot flood a message).
std::string gguf_printable(std::string_view text) {
    constexpr std::size_t shown = 80;
    std::string result;
    for (std::size_t i = 0; i < text.size() && i < shown; ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (byte >= 0x20 && byte < 0x7F) {
            result.push_back(static_cast<char>(byte));
        } else {
            constexpr std::string_view hex = "0123456789abcdef";
            result += "\\x";
            result.push_back(hex[byte >> 4U]);
            result.push_back(hex[byte & 0x0FU]);
        }
    }
    if (text.size() > shown) {
        result += "...";
    }
    return result;
}

namespace {

std::string printable(std::string_view text) {
    return gguf_printable(text);
}

std::string type_text(GgmlType type) {
    return std::string(ggml_type_name(type)) + " (" +
           std::to_string(static_cast<std::uint32_t>(type)) + ")";
}

// pread until `count` bytes or the end of the file; returns the bytes read (fewer only at
// the end of the file). A read error: std::system_error naming the file.
std::size_t read_at(int descriptor, std::uint8_t* out, std::size_t count, std::uint64_t offset,
                    const std::string& source) {
    std::size_t done = 0;
    while (done < count) {
        const ::ssize_t got =
            ::pread(descriptor, out + done, count - done, static_cast<::off_t>(offset + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            throw std::system_error(errno, std::generic_category(),
                                    "gguf: cannot read " + in_quotes(source));
        }
        if (got == 0)
            break;
        done += static_cast<std::size_t>(got);
    }
    return done;
}

// Reads little-endian fields from [0, size), checking every read against the end. The bytes
// are either a whole in-memory image or a file read on demand with pread into a growing
// buffer: a file that shrinks while it is parsed then ends a read early, which is an error
// naming the offsets, never a SIGBUS from a mapping of pages that no longer exist.
class Cursor {
  public:
    Cursor(const std::uint8_t* bytes, std::size_t size, const std::string& source)
        : bytes_(bytes), available_(size), size_(size), source_(source) {}
    Cursor(int descriptor, std::size_t size, const std::string& source)
        : descriptor_(descriptor), size_(size), source_(source) {}

    [[nodiscard]] std::size_t position() const noexcept { return position_; }
    [[nodiscard]] std::uint64_t remaining() const noexcept { return size_ - position_; }

    [[noreturn]] void fail(const std::string& text) const {
        throw GgufFormatError("gguf: " + source_ + ": " + text);
    }

    // `what` is called only to build an error message.
    template <typename Value, typename Describe>
    Value read(const Describe& what) {
        static_assert(std::is_trivially_copyable_v<Value>);
        require(sizeof(Value), what);
        Value value;
        std::memcpy(&value, bytes_ + position_, sizeof(Value));
        position_ += sizeof(Value);
        return value;
    }

    template <typename Describe>
    std::string read_string(const Describe& what) {
        const auto length = read<std::uint64_t>([&] { return what() + " length"; });
        if (length > remaining()) {
            fail(what() + " claims " + std::to_string(length) + " bytes but only " +
                 std::to_string(remaining()) + " remain in the file");
        }
        fill(position_ + static_cast<std::size_t>(length));
        std::string text(reinterpret_cast<const char*>(bytes_ + position_),
                         static_cast<std::size_t>(length));
        position_ += static_cast<std::size_t>(length);
        return text;
    }

    // A count of items of at least `smallest_item_bytes` each must fit in what remains.
    template <typename Describe>
    void check_count_fits(std::uint64_t count, std::uint64_t smallest_item_bytes,
                          const Describe& what) const {
        if (count > remaining() / smallest_item_bytes) {
            fail(what() + " " + std::to_string(count) + " cannot fit in the " +
                 std::to_string(remaining()) + " bytes that remain (each takes at least " +
                 std::to_string(smallest_item_bytes) + ")");
        }
    }

  private:
    template <typename Describe>
    void require(std::size_t bytes, const Describe& what) {
        if (bytes > remaining()) {
            fail("truncated at byte " + std::to_string(position_) + ": " + what() + " needs " +
                 std::to_string(bytes) + " bytes, " + std::to_string(remaining()) + " remain");
        }
        fill(position_ + bytes);
    }

    // Makes bytes [0, end) readable (end <= size_): reads the file further, at least doubling
    // the buffer so the whole header costs O(its size) in reads and copies.
    void fill(std::size_t end) {
        if (end <= available_)
            return;
        constexpr std::size_t first_read = std::size_t{1} << 20U;
        const std::size_t target = std::min(size_, std::max({end, 2 * available_, first_read}));
        buffer_.resize(target);
        const std::size_t got = read_at(descriptor_, buffer_.data() + available_,
                                        target - available_, available_, source_);
        if (got != target - available_) {
            fail("the file shrank while it was being read: it was " + std::to_string(size_) +
                 " bytes, and a read at byte " + std::to_string(available_) + " ended at byte " +
                 std::to_string(available_ + got));
        }
        available_ = target;
        bytes_ = buffer_.data();
    }

    int descriptor_ = -1;
    std::vector<std::uint8_t> buffer_;
    const std::uint8_t* bytes_ = nullptr;
    std::size_t available_ = 0;
    std::size_t size_;
    std::size_t position_ = 0;
    const std::string& source_;
};

// The smallest encoding of one element of an array of `type` (a string: its u64 length).
std::uint64_t smallest_element_bytes(GgufValueType type) {
    switch (type) {
        case GgufValueType::Uint8:
        case GgufValueType::Int8:
        case GgufValueType::Bool:
            return 1;
        case GgufValueType::Uint16:
        case GgufValueType::Int16:
            return 2;
        case GgufValueType::Uint32:
        case GgufValueType::Int32:
        case GgufValueType::Float32:
            return 4;
        case GgufValueType::String:
        case GgufValueType::Uint64:
        case GgufValueType::Int64:
        case GgufValueType::Float64:
            return 8;
        case GgufValueType::Array:
            break;
    }
    return 0;
}

class MetadataReader {
  public:
    MetadataReader(Cursor& cursor, const std::string& key) : cursor_(cursor), key_(key) {}

    GgufValue read_value(std::uint32_t type_id) {
        switch (checked_type(type_id, "value")) {
            case GgufValueType::Uint8:
                return {scalar<std::uint8_t>()};
            case GgufValueType::Int8:
                return {scalar<std::int8_t>()};
            case GgufValueType::Uint16:
                return {scalar<std::uint16_t>()};
            case GgufValueType::Int16:
                return {scalar<std::int16_t>()};
            case GgufValueType::Uint32:
                return {scalar<std::uint32_t>()};
            case GgufValueType::Int32:
                return {scalar<std::int32_t>()};
            case GgufValueType::Float32:
                return {scalar<float>()};
            case GgufValueType::Bool:
                return {boolean()};
            case GgufValueType::String:
                return {string()};
            case GgufValueType::Array:
                return {array()};
            case GgufValueType::Uint64:
                return {scalar<std::uint64_t>()};
            case GgufValueType::Int64:
                return {scalar<std::int64_t>()};
            case GgufValueType::Float64:
                return {scalar<double>()};
        }
        return {};  // unreachable: checked_type accepted only the ids above
    }

  private:
    [[nodiscard]] std::string where() const { return "metadata " + in_quotes(printable(key_)); }

    GgufValueType checked_type(std::uint32_t type_id, std::string_view role) const {
        if (type_id > static_cast<std::uint32_t>(GgufValueType::Float64)) {
            cursor_.fail(where() + " has unknown " + std::string(role) + " type " +
                         std::to_string(type_id) + " (known: 0..12)");
        }
        return static_cast<GgufValueType>(type_id);
    }

    template <typename Value>
    Value scalar() {
        return cursor_.read<Value>([&] { return where() + " value"; });
    }

    bool boolean() {
        const auto byte = cursor_.read<std::uint8_t>([&] { return where() + " value"; });
        if (byte > 1) {
            cursor_.fail(where() + " bool value is " + std::to_string(byte) + " (must be 0 or 1)");
        }
        return byte == 1;
    }

    std::string string() {
        return cursor_.read_string([&] { return where() + " string"; });
    }

    template <typename Element, typename ReadOne>
    GgufArray elements(std::uint64_t count, const ReadOne& read_one) {
        std::vector<Element> values;
        values.reserve(static_cast<std::size_t>(count));
        for (std::uint64_t i = 0; i < count; ++i) {
            values.push_back(read_one());
        }
        return {GgufArray::Elements(std::move(values))};
    }

    GgufArray array() {
        const auto element_type_id =
            cursor_.read<std::uint32_t>([&] { return where() + " array element type"; });
        const GgufValueType element_type = checked_type(element_type_id, "array element");
        if (element_type == GgufValueType::Array) {
            cursor_.fail(where() + " is an array of arrays (nested arrays are not supported)");
        }
        const auto count = cursor_.read<std::uint64_t>([&] { return where() + " array count"; });
        cursor_.check_count_fits(count, smallest_element_bytes(element_type),
                                 [&] { return where() + " array count"; });
        switch (element_type) {
            case GgufValueType::Uint8:
                return elements<std::uint8_t>(count, [&] { return scalar<std::uint8_t>(); });
            case GgufValueType::Int8:
                return elements<std::int8_t>(count, [&] { return scalar<std::int8_t>(); });
            case GgufValueType::Uint16:
                return elements<std::uint16_t>(count, [&] { return scalar<std::uint16_t>(); });
            case GgufValueType::Int16:
                return elements<std::int16_t>(count, [&] { return scalar<std::int16_t>(); });
            case GgufValueType::Uint32:
                return elements<std::uint32_t>(count, [&] { return scalar<std::uint32_t>(); });
            case GgufValueType::Int32:
                return elements<std::int32_t>(count, [&] { return scalar<std::int32_t>(); });
            case GgufValueType::Float32:
                return elements<float>(count, [&] { return scalar<float>(); });
            case GgufValueType::Bool:
                return elements<bool>(count, [&] { return boolean(); });
            case GgufValueType::String:
                return elements<std::string>(count, [&] { return string(); });
            case GgufValueType::Uint64:
                return elements<std::uint64_t>(count, [&] { return scalar<std::uint64_t>(); });
            case GgufValueType::Int64:
                return elements<std::int64_t>(count, [&] { return scalar<std::int64_t>(); });
            case GgufValueType::Float64:
                return elements<double>(count, [&] { return scalar<double>(); });
            case GgufValueType::Array:
                break;
        }
        return {};  // unreachable
    }

    Cursor& cursor_;
    const std::string& key_;
};

std::uint64_t read_alignment(const std::map<std::string, std::size_t, std::less<>>& index,
                             const std::vector<GgufMetadataEntry>& metadata, const Cursor& cursor) {
    const auto found = index.find(alignment_key);
    if (found == index.end()) {
        return default_alignment;
    }
    const GgufValue& value = metadata[found->second].value;
    if (value.type() != GgufValueType::Uint32) {
        cursor.fail("metadata '" + std::string(alignment_key) + "' has type " +
                    std::string(gguf_value_type_name(value.type())) + ", expected uint32");
    }
    const std::uint32_t alignment = std::get<std::uint32_t>(value.data);
    if (alignment < 8 || !std::has_single_bit(alignment)) {
        cursor.fail("metadata '" + std::string(alignment_key) + "' value " +
                    std::to_string(alignment) + " is not a power of two that is a multiple of 8");
    }
    return alignment;
}

GgufTensorInfo read_tensor_info(Cursor& cursor, std::uint64_t index, std::uint64_t alignment) {
    GgufTensorInfo tensor;
    const auto which = [&] { return "tensor " + std::to_string(index); };
    tensor.name = cursor.read_string([&] { return which() + " name"; });
    if (tensor.name.empty() || tensor.name.size() > maximum_tensor_name_bytes) {
        cursor.fail(which() + " name " + in_quotes(printable(tensor.name)) + " has " +
                    std::to_string(tensor.name.size()) + " bytes (must be 1.." +
                    std::to_string(maximum_tensor_name_bytes) + ")");
    }
    const std::string named = "tensor " + in_quotes(printable(tensor.name));
    const auto dim_count = cursor.read<std::uint32_t>([&] { return named + " n_dims"; });
    if (dim_count == 0 || dim_count > maximum_dims) {
        cursor.fail(named + " n_dims " + std::to_string(dim_count) + " is not 1.." +
                    std::to_string(maximum_dims));
    }
    tensor.dims.resize(dim_count);
    std::uint64_t element_count = 1;
    for (std::size_t d = 0; d < dim_count; ++d) {
        const std::uint64_t dim =
            cursor.read<std::uint64_t>([&] { return named + " dims[" + std::to_string(d) + "]"; });
        if (dim == 0) {
            cursor.fail(named + " dims[" + std::to_string(d) + "] is 0 (must be > 0)");
        }
        constexpr auto largest =
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
        if (dim > largest / element_count) {
            cursor.fail(named + " element count overflows int64 at dims[" + std::to_string(d) +
                        "] = " + std::to_string(dim));
        }
        element_count *= dim;
        tensor.dims[d] = dim;
    }
    tensor.element_count = element_count;
    tensor.type =
        static_cast<GgmlType>(cursor.read<std::uint32_t>([&] { return named + " type"; }));
    tensor.offset = cursor.read<std::uint64_t>([&] { return named + " data offset"; });

    const std::optional<GgmlTypeLayout> layout = ggml_type_layout(tensor.type);
    if (!layout) {
        cursor.fail(named + " has unknown ggml type id " +
                    std::to_string(static_cast<std::uint32_t>(tensor.type)));
    }
    if (tensor.dims[0] % layout->block_elements != 0) {
        cursor.fail(named + " row length ne0 = " + std::to_string(tensor.dims[0]) +
                    " is not a multiple of the " + type_text(tensor.type) + " block size " +
                    std::to_string(layout->block_elements));
    }
    const std::uint64_t block_count = element_count / layout->block_elements;
    if (block_count > std::numeric_limits<std::uint64_t>::max() / layout->block_bytes) {
        cursor.fail(named + " byte size (" + std::to_string(block_count) + " blocks of " +
                    std::to_string(layout->block_bytes) + " bytes) overflows uint64");
    }
    tensor.byte_size = block_count * layout->block_bytes;
    if (tensor.offset % alignment != 0) {
        cursor.fail(named + " data offset " + std::to_string(tensor.offset) +
                    " is not a multiple of the alignment " + std::to_string(alignment));
    }
    return tensor;
}

// Every tensor lies inside the data section [data_offset, file_size) and no two overlap.
void check_tensor_extents(const std::vector<GgufTensorInfo>& tensors, std::uint64_t data_offset,
                          std::uint64_t file_size, const Cursor& cursor) {
    if (tensors.empty()) {
        return;
    }
    if (data_offset > file_size) {
        cursor.fail("the data section starts at byte " + std::to_string(data_offset) +
                    ", past the end of the file (" + std::to_string(file_size) + " bytes)");
    }
    const std::uint64_t data_bytes = file_size - data_offset;
    for (const GgufTensorInfo& tensor : tensors) {
        if (tensor.byte_size > data_bytes || tensor.offset > data_bytes - tensor.byte_size) {
            cursor.fail("tensor " + in_quotes(printable(tensor.name)) + " data [" +
                        std::to_string(tensor.offset) + ", +" + std::to_string(tensor.byte_size) +
                        ") ends past the end of the data section (" + std::to_string(data_bytes) +
                        " bytes)");
        }
    }
    std::vector<std::size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t left, std::size_t right) {
        return tensors[left].offset < tensors[right].offset;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
        const GgufTensorInfo& previous = tensors[order[i - 1]];
        const GgufTensorInfo& next = tensors[order[i]];
        if (previous.offset + previous.byte_size > next.offset) {
            cursor.fail("tensor " + in_quotes(printable(previous.name)) + " data [" +
                        std::to_string(previous.offset) + ", " +
                        std::to_string(previous.offset + previous.byte_size) +
                        ") overlaps tensor " + in_quotes(printable(next.name)) + " at " +
                        std::to_string(next.offset));
        }
    }
}

// An integer value of any width as Target, when Target can represent it.
template <typename Target>
std::optional<Target> integer_as(const GgufValue::Data& data) {
    return std::visit(
        [](const auto& value) -> std::optional<Target> {
            using Stored = std::decay_t<decltype(value)>;
            if constexpr (std::is_integral_v<Stored> && !std::is_same_v<Stored, bool>) {
                if (std::in_range<Target>(value)) {
                    return static_cast<Target>(value);
                }
            }
            return std::nullopt;
        },
        data);
}

bool is_integer_type(GgufValueType type) {
    switch (type) {
        case GgufValueType::Uint8:
        case GgufValueType::Int8:
        case GgufValueType::Uint16:
        case GgufValueType::Int16:
        case GgufValueType::Uint32:
        case GgufValueType::Int32:
        case GgufValueType::Uint64:
        case GgufValueType::Int64:
            return true;
        default:
            return false;
    }
}

template <typename Value>
std::string value_text(const Value& value) {
    std::ostringstream text;
    text << +value;
    return text.str();
}

// An opened file: the descriptor that header and tensor reads use (pread), and a read-only
// mapping behind tensor_bytes().
struct OpenFile {
    int descriptor = -1;
    void* address = nullptr;
    std::size_t size = 0;
    explicit OpenFile(int opened) : descriptor(opened) {}
    OpenFile(const OpenFile&) = delete;
    OpenFile& operator=(const OpenFile&) = delete;
    ~OpenFile() {
        if (address != nullptr)
            ::munmap(address, size);
        if (descriptor >= 0)
            ::close(descriptor);
    }
};

}  // namespace

std::string_view gguf_value_type_name(GgufValueType type) noexcept {
    constexpr std::array<std::string_view, 13> names = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64"};
    const auto id = static_cast<std::uint32_t>(type);
    return id < names.size() ? names[id] : "unknown";
}

std::size_t GgufArray::size() const {
    return std::visit(
        [](const auto& values) -> std::size_t {
            if constexpr (std::is_same_v<std::decay_t<decltype(values)>, std::monostate>) {
                return 0;
            } else {
                return values.size();
            }
        },
        elements);
}

std::optional<GgmlTypeLayout> ggml_type_layout(GgmlType type) noexcept {
    const TypeRow* row = type_row(type);
    if (row == nullptr) {
        return std::nullopt;
    }
    return row->layout;
}

std::string_view ggml_type_name(GgmlType type) noexcept {
    const TypeRow* row = type_row(type);
    return row == nullptr ? std::string_view("unknown") : row->name;
}

// ---- Opening.

GgufFile GgufFile::open(const std::filesystem::path& path) {
    const std::string source = path.string();
    const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) {
        throw std::system_error(errno, std::generic_category(),
                                "gguf: cannot open " + in_quotes(source));
    }
    struct stat status {};
    if (::fstat(descriptor, &status) != 0) {
        const int error = errno;
        ::close(descriptor);
        throw std::system_error(error, std::generic_category(),
                                "gguf: cannot stat " + in_quotes(source));
    }
    if (S_ISDIR(status.st_mode)) {
        ::close(descriptor);
        throw std::system_error(EISDIR, std::generic_category(),
                                "gguf: cannot read " + in_quotes(source));
    }
    const auto size = static_cast<std::size_t>(status.st_size);
    if (S_ISREG(status.st_mode) && size > 0) {
        // The header is parsed from pread buffers and tensors are read with pread, so a file
        // that shrinks while it loads is a GgufFormatError, not a SIGBUS. The mapping serves
        // only tensor_bytes().
        auto file = std::make_shared<OpenFile>(descriptor);
        void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, descriptor, 0);
        if (mapped != MAP_FAILED) {
            file->address = mapped;
            file->size = size;
        }
        const auto* bytes = static_cast<const std::uint8_t*>(file->address);
        if (bytes != nullptr)
            return parse(std::move(file), bytes, size, source, descriptor);
        file->descriptor = -1;  // closed below
    }
    ::close(descriptor);
    // Not mappable (an empty file, a pipe, a file system without mmap): read it.
    std::ifstream stream(path, std::ios::binary);
    if (!stream) {
        throw std::system_error(errno, std::generic_category(),
                                "gguf: cannot read " + in_quotes(source));
    }
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(stream)),
                                    std::istreambuf_iterator<char>());
    if (stream.bad()) {
        throw std::system_error(errno, std::generic_category(),
                                "gguf: cannot read " + in_quotes(source));
    }
    return from_bytes(std::move(bytes), source);
}

GgufFile GgufFile::from_bytes(std::vector<std::uint8_t> bytes, std::string source) {
    auto owner = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes));
    const std::uint8_t* image = owner->data();
    const std::size_t size = owner->size();
    return parse(std::move(owner), image, size, std::move(source), -1);
}

GgufFile GgufFile::parse(std::shared_ptr<const void> owner, const std::uint8_t* bytes,
                         std::size_t size, std::string source, int descriptor) {
    GgufFile file;
    file.owner_ = std::move(owner);
    file.bytes_ = bytes;
    file.size_ = size;
    file.descriptor_ = descriptor;
    file.source_ = std::move(source);
    Cursor cursor = descriptor >= 0 ? Cursor(descriptor, size, file.source_)
                                    : Cursor(bytes, size, file.source_);

    const auto magic = cursor.read<std::uint32_t>([] { return std::string("magic"); });
    if (magic != gguf_magic) {
        std::string shown;
        for (std::size_t i = 0; i < 4; ++i) {
            shown += printable(std::string(1, static_cast<char>(magic >> (8U * i))));
        }
        cursor.fail("bad magic '" + shown + "' (expected 'GGUF')");
    }
    const auto version = cursor.read<std::uint32_t>([] { return std::string("version"); });
    if (version != 2 && version != 3) {
        const std::uint32_t swapped = ((version & 0xFFU) << 24U) | ((version & 0xFF00U) << 8U) |
                                      ((version >> 8U) & 0xFF00U) | (version >> 24U);
        if (swapped == 2 || swapped == 3) {
            cursor.fail("version " + std::to_string(version) + " is a byte-swapped version " +
                        std::to_string(swapped) + ": big-endian files are not supported");
        }
        cursor.fail("version " + std::to_string(version) +
                    " is not supported (supported: 3 and 2; version 1 had 32-bit counts)");
    }
    file.version_ = version;
    const auto tensor_count =
        cursor.read<std::uint64_t>([] { return std::string("tensor count"); });
    const auto metadata_count =
        cursor.read<std::uint64_t>([] { return std::string("metadata count"); });
    // Checked against all the bytes left, so each count alone and both together are bounded.
    cursor.check_count_fits(metadata_count, smallest_metadata_entry_bytes,
                            [] { return std::string("metadata count"); });
    cursor.check_count_fits(tensor_count, smallest_tensor_info_bytes,
                            [] { return std::string("tensor count"); });
    if (metadata_count * smallest_metadata_entry_bytes + tensor_count * smallest_tensor_info_bytes >
        cursor.remaining()) {
        cursor.fail("metadata count " + std::to_string(metadata_count) + " and tensor count " +
                    std::to_string(tensor_count) + " cannot both fit in the " +
                    std::to_string(cursor.remaining()) + " bytes that remain");
    }

    file.metadata_.reserve(static_cast<std::size_t>(metadata_count));
    for (std::uint64_t i = 0; i < metadata_count; ++i) {
        std::string key =
            cursor.read_string([&] { return "metadata entry " + std::to_string(i) + " key"; });
        if (key.empty() || key.size() > maximum_key_bytes) {
            cursor.fail("metadata entry " + std::to_string(i) + " key " +
                        in_quotes(printable(key)) + " has " + std::to_string(key.size()) +
                        " bytes (must be 1.." + std::to_string(maximum_key_bytes) + ")");
        }
        if (file.metadata_index_.contains(key)) {
            cursor.fail("metadata key " + in_quotes(printable(key)) + " appears twice (entries " +
                        std::to_string(file.metadata_index_.find(key)->second) + " and " +
                        std::to_string(i) + ")");
        }
        const auto type_id = cursor.read<std::uint32_t>(
            [&] { return "metadata " + in_quotes(printable(key)) + " value type"; });
        GgufValue value = MetadataReader(cursor, key).read_value(type_id);
        file.metadata_index_.emplace(key, file.metadata_.size());
        file.metadata_.push_back({std::move(key), std::move(value)});
    }
    file.alignment_ = read_alignment(file.metadata_index_, file.metadata_, cursor);

    cursor.check_count_fits(tensor_count, smallest_tensor_info_bytes,
                            [] { return std::string("tensor count"); });
    file.tensors_.reserve(static_cast<std::size_t>(tensor_count));
    for (std::uint64_t i = 0; i < tensor_count; ++i) {
        GgufTensorInfo tensor = read_tensor_info(cursor, i, file.alignment_);
        if (file.tensor_index_.contains(tensor.name)) {
            cursor.fail("tensor name " + in_quotes(printable(tensor.name)) +
                        " appears twice (tensors " +
                        std::to_string(file.tensor_index_.find(tensor.name)->second) + " and " +
                        std::to_string(i) + ")");
        }
        file.tensor_index_.emplace(tensor.name, file.tensors_.size());
        file.tensors_.push_back(std::move(tensor));
    }
    // position ≤ size and alignment ≤ 2^31, so the rounding cannot overflow.
    const std::uint64_t header_end = cursor.position();
    file.data_offset_ = (header_end + file.alignment_ - 1) / file.alignment_ * file.alignment_;
    check_tensor_extents(file.tensors_, file.data_offset_, size, cursor);
    return file;
}

// ---- Metadata.

const GgufValue* GgufFile::find(std::string_view key) const noexcept {
    const auto found = metadata_index_.find(key);
    return found == metadata_index_.end() ? nullptr : &metadata_[found->second].value;
}

const GgufValue& GgufFile::at(std::string_view key) const {
    const GgufValue* value = find(key);
    if (value == nullptr) {
        throw GgufFormatError("gguf: " + source_ + ": metadata key " + in_quotes(printable(key)) +
                              " is absent");
    }
    return *value;
}

namespace {

[[noreturn]] void wrong_type(const std::string& source, std::string_view key,
                             std::string_view expected, const GgufValue& value) {
    std::string actual(gguf_value_type_name(value.type()));
    if (value.type() == GgufValueType::Array) {
        const auto& array = std::get<GgufArray>(value.data);
        actual = "array of " + std::string(gguf_value_type_name(array.element_type()));
    }
    throw GgufFormatError("gguf: " + source + ": metadata key " + in_quotes(printable(key)) +
                          " has type " + actual + ", expected " + std::string(expected));
}

template <typename Target>
std::string_view integer_name() {
    if constexpr (std::is_same_v<Target, std::uint32_t>) {
        return "uint32";
    } else if constexpr (std::is_same_v<Target, std::int32_t>) {
        return "int32";
    } else if constexpr (std::is_same_v<Target, std::uint64_t>) {
        return "uint64";
    } else {
        return "int64";
    }
}

// Any integer type to Target when the value fits; `what` describes the value in messages.
template <typename Target>
Target converted_integer(const std::string& source, std::string_view key,
                         const GgufValue::Data& data, const std::string& what) {
    if (const std::optional<Target> value = integer_as<Target>(data)) {
        return *value;
    }
    const std::string text = std::visit(
        [](const auto& stored) -> std::string {
            using Stored = std::decay_t<decltype(stored)>;
            if constexpr (std::is_integral_v<Stored> && !std::is_same_v<Stored, bool>) {
                return value_text(stored);
            } else {
                return "?";
            }
        },
        data);
    throw GgufFormatError(
        "gguf: " + source + ": metadata key " + in_quotes(printable(key)) + what + " value " +
        text + " (" + std::string(gguf_value_type_name(static_cast<GgufValueType>(data.index()))) +
        ") does not fit " + std::string(integer_name<Target>()));
}

template <typename Target>
Target integer_value(const std::string& source, std::string_view key, const GgufValue& value) {
    if (!is_integer_type(value.type())) {
        wrong_type(source, key, std::string(integer_name<Target>()) + " (or any integer type)",
                   value);
    }
    return converted_integer<Target>(source, key, value.data, "");
}

template <typename Target>
std::vector<Target> integer_array(const std::string& source, std::string_view key,
                                  const GgufValue& value) {
    if (value.type() != GgufValueType::Array ||
        !is_integer_type(std::get<GgufArray>(value.data).element_type())) {
        wrong_type(source, key,
                   "array of " + std::string(integer_name<Target>()) + " (or any integer type)",
                   value);
    }
    return std::visit(
        [&](const auto& elements) -> std::vector<Target> {
            using Elements = std::decay_t<decltype(elements)>;
            std::vector<Target> result;
            if constexpr (!std::is_same_v<Elements, std::monostate>) {
                using Element = typename Elements::value_type;
                if constexpr (std::is_integral_v<Element> && !std::is_same_v<Element, bool>) {
                    result.reserve(elements.size());
                    for (std::size_t i = 0; i < elements.size(); ++i) {
                        const GgufValue::Data element{elements[i]};
                        result.push_back(converted_integer<Target>(source, key, element,
                                                                   "[" + std::to_string(i) + "]"));
                    }
                }
            }
            return result;
        },
        std::get<GgufArray>(value.data).elements);
}

template <typename Stored>
const Stored& exact_value(const std::string& source, std::string_view key, const GgufValue& value,
                          std::string_view expected) {
    const Stored* stored = std::get_if<Stored>(&value.data);
    if (stored == nullptr) {
        wrong_type(source, key, expected, value);
    }
    return *stored;
}

template <typename Element>
const std::vector<Element>& exact_array(const std::string& source, std::string_view key,
                                        const GgufValue& value, std::string_view expected) {
    const auto* array = std::get_if<GgufArray>(&value.data);
    const auto* elements =
        array == nullptr ? nullptr : std::get_if<std::vector<Element>>(&array->elements);
    if (elements == nullptr) {
        wrong_type(source, key, expected, value);
    }
    return *elements;
}

}  // namespace

const std::string& GgufFile::get_string(std::string_view key) const {
    return exact_value<std::string>(source_, key, at(key), "string");
}

bool GgufFile::get_bool(std::string_view key) const {
    return exact_value<bool>(source_, key, at(key), "bool");
}

std::uint32_t GgufFile::get_uint32(std::string_view key) const {
    return integer_value<std::uint32_t>(source_, key, at(key));
}

std::int32_t GgufFile::get_int32(std::string_view key) const {
    return integer_value<std::int32_t>(source_, key, at(key));
}

std::uint64_t GgufFile::get_uint64(std::string_view key) const {
    return integer_value<std::uint64_t>(source_, key, at(key));
}

std::int64_t GgufFile::get_int64(std::string_view key) const {
    return integer_value<std::int64_t>(source_, key, at(key));
}

float GgufFile::get_float32(std::string_view key) const {
    return exact_value<float>(source_, key, at(key), "float32");
}

double GgufFile::get_float64(std::string_view key) const {
    return exact_value<double>(source_, key, at(key), "float64");
}

const GgufArray& GgufFile::get_array(std::string_view key) const {
    return exact_value<GgufArray>(source_, key, at(key), "array");
}

const std::vector<std::string>& GgufFile::get_string_array(std::string_view key) const {
    return exact_array<std::string>(source_, key, at(key), "array of string");
}

std::vector<std::int32_t> GgufFile::get_int32_array(std::string_view key) const {
    return integer_array<std::int32_t>(source_, key, at(key));
}

std::vector<std::uint32_t> GgufFile::get_uint32_array(std::string_view key) const {
    return integer_array<std::uint32_t>(source_, key, at(key));
}

std::vector<std::int64_t> GgufFile::get_int64_array(std::string_view key) const {
    return integer_array<std::int64_t>(source_, key, at(key));
}

const std::vector<float>& GgufFile::get_float32_array(std::string_view key) const {
    return exact_array<float>(source_, key, at(key), "array of float32");
}

// ---- Tensors.

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const noexcept {
    const auto found = tensor_index_.find(name);
    return found == tensor_index_.end() ? nullptr : &tensors_[found->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
    const GgufTensorInfo* found = find_tensor(name);
    if (found == nullptr) {
        throw GgufFormatError("gguf: " + source_ + ": tensor " + in_quotes(printable(name)) +
                              " is absent");
    }
    return *found;
}

std::size_t GgufFile::tensor_index_of(const GgufTensorInfo& tensor) const {
    // Compared as integers: relational operators on pointers into different arrays are
    // unspecified.
    const auto address = reinterpret_cast<std::uintptr_t>(&tensor);
    const auto first = reinterpret_cast<std::uintptr_t>(tensors_.data());
    const std::size_t entry = sizeof(GgufTensorInfo);
    if (tensors_.empty() || address < first || address >= first + tensors_.size() * entry ||
        (address - first) % entry != 0) {
        throw std::invalid_argument("gguf: " + source_ + ": tensor " +
                                    in_quotes(printable(tensor.name)) +
                                    " is not one of this file's tensor infos");
    }
    return (address - first) / entry;
}

std::span<const std::uint8_t> GgufFile::tensor_bytes(const GgufTensorInfo& tensor) const {
    const GgufTensorInfo& own = tensors_[tensor_index_of(tensor)];
    return {bytes_ + data_offset_ + own.offset, static_cast<std::size_t>(own.byte_size)};
}

std::vector<std::uint8_t> GgufFile::read_tensor_bytes(const GgufTensorInfo& tensor) const {
    const GgufTensorInfo& own = tensors_[tensor_index_of(tensor)];
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(own.byte_size));
    read_data(own.offset, bytes);
    return bytes;
}

void GgufFile::read_data(std::uint64_t offset, std::span<std::uint8_t> out) const {
    if (descriptor_ < 0) {
        std::memcpy(out.data(), bytes_ + data_offset_ + offset, out.size());
        return;
    }
    const std::uint64_t begin = data_offset_ + offset;
    const std::size_t got = read_at(descriptor_, out.data(), out.size(), begin, source_);
    if (got != out.size()) {
        throw GgufFormatError(
            "gguf: " + source_ + ": the file shrank while it was being read: it was " +
            std::to_string(size_) + " bytes, and a read of bytes [" + std::to_string(begin) + ", " +
            std::to_string(begin + out.size()) + ") ended at byte " + std::to_string(begin + got));
    }
}

}  // namespace riftco_transformer
