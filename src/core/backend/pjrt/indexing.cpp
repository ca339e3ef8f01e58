// Row gather and scatter-add programs, one per (operation, table shape, index count). The ids
// are u32 buffers, converted to i32 inside the program (tensor_ops range-checked them against
// the table, so they fit). gather_rows is stablehlo.gather of [1, W] slices; scatter_add_rows
// is stablehlo.scatter with an add body into zeros, repeated ids accumulating.

#include <vector>

#include "core/backend/pjrt/pjrt_device.hpp"

namespace riftco_transformer::detail::pjrt {
namespace {

using Dimensions = std::vector<std::size_t>;

// The u32 id parameter [n] as the start indices [n,1] (i32) of a row gather or scatter.
std::string row_starts(ProgramText& program, const std::string& ids, std::size_t count) {
    const Dimensions flat = {count};
    const Dimensions starts = {count, 1};
    const std::string signed_ids =
        program.let("stablehlo.convert " + ids + " : (" + tensor_type(flat, "ui32") + ") -> " +
                    tensor_type(flat, "i32"));
    return program.reshape(signed_ids, flat, starts, "i32");
}

class PjrtIndexing final : public IndexingCapability {
  public:
    explicit PjrtIndexing(const Context& context) : context_(context) {}

    // table [R,W], ids [n] -> out [n,W], out[i] = table[ids[i]].
    void gather_rows(const Tensor& table, const IndexTensor& indices, Tensor& out) const override {
        const Dimensions table_shape = {table.shape()[0], table.shape()[1]};
        const std::size_t count = indices.numel();
        const Dimensions out_shape = {count, table_shape[1]};
        const std::string key =
            "gather_rows/" + shape_key(table_shape) + "/" + std::to_string(count);
        auto text = [&] {
            ProgramText program;
            const std::string table_flat = program.parameter(flat_type(table_shape));
            const std::string ids = program.parameter(tensor_type({count}, "ui32"));
            const Dimensions flat = {element_count(table_shape)};
            const std::string rows = program.reshape(table_flat, flat, table_shape);
            const Dimensions slice = {1, table_shape[1]};
            const std::string gathered = program.let(
                "\"stablehlo.gather\"(" + rows + ", " + row_starts(program, ids, count) +
                ") {dimension_numbers = #stablehlo.gather<offset_dims = [1], "
                "collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, "
                "slice_sizes = " +
                i64_array(slice) + ", indices_are_sorted = false} : (" + tensor_type(table_shape) +
                ", " + tensor_type({count, 1}, "i32") + ") -> " + tensor_type(out_shape));
            const std::pair<std::string, std::string> results[] = {
                {program.flatten(gathered, out_shape), flat_type(out_shape)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(table), buffer_of(indices)},
                 {{ElementType::F32, out.numel()}})[0]);
    }

    // upstream [n,W], ids [n] -> out [R,W] = 0, then out[ids[i]] += upstream[i].
    void scatter_add_rows(const Tensor& upstream, const IndexTensor& indices,
                          Tensor& out) const override {
        const Dimensions out_shape = {out.shape()[0], out.shape()[1]};
        const std::size_t count = indices.numel();
        const Dimensions update_shape = {count, out_shape[1]};
        const std::string key =
            "scatter_add_rows/" + shape_key(out_shape) + "/" + std::to_string(count);
        auto text = [&] {
            ProgramText program;
            const std::string upstream_flat = program.parameter(flat_type(update_shape));
            const std::string ids = program.parameter(tensor_type({count}, "ui32"));
            const Dimensions flat = {element_count(update_shape)};
            const std::string updates = program.reshape(upstream_flat, flat, update_shape);
            const std::string zeros = program.constant(0.0F, out_shape);
            const std::string starts = row_starts(program, ids, count);
            const std::string sums = program.fresh();
            program.line(sums + " = \"stablehlo.scatter\"(" + zeros + ", " + starts + ", " +
                         updates + ") ({");
            program.line("  ^bb0(%accumulated: tensor<f32>, %addend: tensor<f32>):");
            program.line("    %total = stablehlo.add %accumulated, %addend : tensor<f32>");
            program.line("    stablehlo.return %total : tensor<f32>");
            program.line(
                "}) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], "
                "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
                "index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false} : (" +
                tensor_type(out_shape) + ", " + tensor_type({count, 1}, "i32") + ", " +
                tensor_type(update_shape) + ") -> " + tensor_type(out_shape));
            const std::pair<std::string, std::string> results[] = {
                {program.flatten(sums, out_shape), flat_type(out_shape)}};
            return program.finish(results);
        };
        give(context_, out,
             run(context_, key, text, {buffer_of(upstream), buffer_of(indices)},
                 {{ElementType::F32, out.numel()}})[0]);
    }

  private:
    const Context& context_;
};

}  // namespace

std::unique_ptr<IndexingCapability> make_indexing(const Context& context) {
    return std::make_unique<PjrtIndexing>(context);
}

}  // namespace riftco_transformer::detail::pjrt
