#include "riftco_transformer/nn/packed_state.hpp"

#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace riftco_transformer {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the packed-state encoding is written for little-endian hosts");

void append_u64(std::vector<std::uint8_t>& out, std::uint64_t value) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&value);
    out.insert(out.end(), bytes, bytes + sizeof value);
}
void append_u32(std::vector<std::uint8_t>& out, std::uint32_t value) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&value);
    out.insert(out.end(), bytes, bytes + sizeof value);
}
template <typename T>
void append_array(std::vector<std::uint8_t>& out, const std::vector<T>& values) {
    append_u64(out, values.size());
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(values.data());
    out.insert(out.end(), bytes, bytes + values.size() * sizeof(T));
}

// Bytes of one weight's record, from its metadata.
std::size_t record_size(const QuantizedWeight& weight) {
    const std::size_t m = weight.block_count();
    if (is_block_weight_format(weight.format())) {
        return 8 * 3 + 4 + 4 + 8 + 8 + m * gguf_block_bytes(weight.format());
    }
    std::size_t size = 8 * 3 + 4 + 4 + 8 + 8 + weight.packed_byte_count();
    if (weight.uses_double_quantized_scales()) {
        const std::size_t c = weight.scale_quantization_block_size();
        size += 4 + 4 + 8 + m + 8 + 4 * ((m + c - 1) / c);
    } else {
        size += 8 + 4 * m;
    }
    return size;
}

class Reader {
  public:
    explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

    void need(std::size_t count, std::size_t weight, const char* field) const {
        if (count > bytes_.size() - offset_) {
            fail(weight, field,
                 "needs " + std::to_string(count) + " bytes but only " +
                     std::to_string(bytes_.size() - offset_) + " remain");
        }
    }
    std::uint64_t u64(std::size_t weight, const char* field) {
        need(8, weight, field);
        std::uint64_t value = 0;
        std::memcpy(&value, bytes_.data() + offset_, 8);
        offset_ += 8;
        return value;
    }
    std::uint32_t u32(std::size_t weight, const char* field) {
        need(4, weight, field);
        std::uint32_t value = 0;
        std::memcpy(&value, bytes_.data() + offset_, 4);
        offset_ += 4;
        return value;
    }
    template <typename T>
    std::vector<T> array(std::size_t weight, const char* field) {
        const std::uint64_t count = u64(weight, field);
        if (count > (bytes_.size() - offset_) / sizeof(T)) {
            fail(weight, field,
                 "count " + std::to_string(count) + " runs past the end of the state");
        }
        std::vector<T> values(static_cast<std::size_t>(count));
        std::memcpy(values.data(), bytes_.data() + offset_, values.size() * sizeof(T));
        offset_ += values.size() * sizeof(T);
        return values;
    }
    [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size() - offset_; }
    [[noreturn]] static void fail(std::size_t weight, const char* field, const std::string& what) {
        throw std::invalid_argument("packed state: weight " + std::to_string(weight) + ": " +
                                    field + " " + what);
    }

  private:
    std::span<const std::uint8_t> bytes_;
    std::size_t offset_ = 0;
};

}  // namespace

std::size_t packed_state_size(std::span<const QuantizedWeight> weights) {
    std::size_t size = sizeof packed_nf4_state_magic + 8;
    for (std::size_t i = 0; i < weights.size(); ++i) {
        if (weights[i].is_singular()) {
            throw std::invalid_argument("packed state: weight " + std::to_string(i) +
                                        " is singular");
        }
        size += record_size(weights[i]);
    }
    return size;
}

std::vector<std::uint8_t> encode_packed_state(std::span<const QuantizedWeight> weights) {
    std::vector<std::uint8_t> out;
    out.reserve(packed_state_size(weights));
    out.insert(out.end(), std::begin(packed_nf4_state_magic), std::end(packed_nf4_state_magic));
    append_u64(out, weights.size());
    for (const QuantizedWeight& weight : weights) {
        if (is_block_weight_format(weight.format())) {
            const PackedBlockPayload blocks = weight.copy_blocks_to_host();
            append_u64(out, blocks.out_features);
            append_u64(out, blocks.in_features);
            append_u64(out, gguf_format_block_elements(blocks.format));
            append_u32(out, 0);
            append_u32(out, static_cast<std::uint32_t>(blocks.format));
            append_u64(out, 0);
            append_array(out, blocks.blocks);
            continue;
        }
        const PackedNf4Payload payload = weight.copy_payload_to_host();
        append_u64(out, payload.out_features);
        append_u64(out, payload.in_features);
        append_u64(out, payload.block_size);
        append_u32(out, payload.double_quantized ? 1U : 0U);
        append_u32(out, 0);
        append_u64(out, payload.double_quantized ? payload.scale_block_size : 0);
        append_array(out, payload.codes);
        if (payload.double_quantized) {
            append_u32(out, std::bit_cast<std::uint32_t>(payload.scale_offset));
            append_u32(out, 0);
            append_array(out, payload.scale_codes);
            append_array(out, payload.scale_ranges);
        } else {
            append_array(out, payload.scales);
        }
    }
    return out;
}

std::vector<PackedWeightPayload> decode_packed_state(std::span<const std::uint8_t> bytes) {
    if (bytes.size() < sizeof packed_nf4_state_magic + 8 ||
        std::memcmp(bytes.data(), packed_nf4_state_magic, sizeof packed_nf4_state_magic) != 0) {
        throw std::invalid_argument(
            "packed state: missing the RTNF4ST1 header (not a packed state, or truncated)");
    }
    Reader reader(bytes.subspan(sizeof packed_nf4_state_magic));
    const std::uint64_t count = reader.u64(0, "weight_count");
    // Each record takes at least 48 bytes: a count larger than that allows is malformed.
    if (count > reader.remaining() / 48) {
        throw std::invalid_argument("packed state: weight_count " + std::to_string(count) +
                                    " does not fit in the " + std::to_string(bytes.size()) +
                                    " bytes given");
    }
    std::vector<PackedWeightPayload> payloads;
    payloads.reserve(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < count; ++i) {
        PackedNf4Payload payload;
        payload.out_features = reader.u64(i, "out_features");
        payload.in_features = reader.u64(i, "in_features");
        payload.block_size = reader.u64(i, "block_size");
        const std::uint32_t double_quantized = reader.u32(i, "double_quantized");
        if (double_quantized > 1) {
            Reader::fail(i, "double_quantized",
                         "must be 0 or 1 (got " + std::to_string(double_quantized) + ")");
        }
        const std::uint32_t format_id = reader.u32(i, "format");
        const auto format = static_cast<WeightFormat>(format_id);
        if (format_id > 255 || (format != WeightFormat::nf4 && !is_block_weight_format(format))) {
            Reader::fail(i, "format",
                         "is not a weight format id (got " + std::to_string(format_id) + ")");
        }
        payload.double_quantized = double_quantized == 1;
        payload.scale_block_size = reader.u64(i, "scale_block_size");
        if (is_block_weight_format(format)) {
            if (payload.block_size != gguf_format_block_elements(format) ||
                payload.double_quantized || payload.scale_block_size != 0) {
                Reader::fail(i, "block_size",
                             "of a " + std::string(weight_format_name(format)) +
                                 " weight must be " +
                                 std::to_string(gguf_format_block_elements(format)) +
                                 " with double_quantized and scale_block_size 0 (got " +
                                 std::to_string(payload.block_size) + ", " +
                                 std::to_string(double_quantized) + ", " +
                                 std::to_string(payload.scale_block_size) + ")");
            }
            PackedBlockPayload blocks;
            blocks.format = format;
            blocks.out_features = payload.out_features;
            blocks.in_features = payload.in_features;
            blocks.blocks = reader.array<std::uint8_t>(i, "blocks");
            payloads.emplace_back(std::move(blocks));
            continue;
        }
        payload.codes = reader.array<std::uint8_t>(i, "codes");
        if (payload.double_quantized) {
            payload.scale_offset = std::bit_cast<float>(reader.u32(i, "scale_offset"));
            if (reader.u32(i, "reserved") != 0) {
                Reader::fail(i, "reserved", "must be zero");
            }
            payload.scale_codes = reader.array<std::uint8_t>(i, "scale_codes");
            payload.scale_ranges = reader.array<float>(i, "scale_ranges");
        } else {
            payload.scales = reader.array<float>(i, "scales");
        }
        payloads.emplace_back(std::move(payload));
    }
    if (reader.remaining() != 0) {
        throw std::invalid_argument("packed state: " + std::to_string(reader.remaining()) +
                                    " trailing bytes after the last weight");
    }
    return payloads;
}

QuantizedWeight upload_packed_payload(PackedWeightPayload payload, ExecutionBackend backend) {
    if (auto* blocks = std::get_if<PackedBlockPayload>(&payload)) {
        return QuantizedWeight::from_packed_blocks(std::move(*blocks), backend);
    }
    return QuantizedWeight::from_packed_nf4(std::get<PackedNf4Payload>(std::move(payload)),
                                            backend);
}

}  // namespace riftco_transformer
