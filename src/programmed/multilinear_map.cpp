#include "riftco_transformer/programmed/multilinear_map.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace riftco_transformer {

std::size_t checked_multilinear_element_count(const char* operation, std::size_t output_dimension,
                                              std::span<const std::size_t> input_dimensions,
                                              std::size_t limit) {
    if (output_dimension == 0) {
        throw std::invalid_argument(std::string(operation) + ": output_dimension must be > 0");
    }
    std::size_t count = output_dimension;
    for (std::size_t i = 0; i < input_dimensions.size(); ++i) {
        if (input_dimensions[i] == 0) {
            throw std::invalid_argument(std::string(operation) + ": input_dimensions[" +
                                        std::to_string(i) + "] must be > 0");
        }
    }
    for (std::size_t i = 0; i < input_dimensions.size(); ++i) {
        if (count > limit / input_dimensions[i]) {
            std::ostringstream message;
            message << operation << ": the map has more than " << limit
                    << " elements (output_dimension " << output_dimension << " times input "
                    << "dimensions up to index " << i << ")";
            throw std::overflow_error(message.str());
        }
        count *= input_dimensions[i];
    }
    if (count > limit) {
        throw std::overflow_error(std::string(operation) + ": the map's " + std::to_string(count) +
                                  " elements exceed the limit of " + std::to_string(limit));
    }
    return count;
}

MultilinearMap MultilinearMap::from_dense(std::size_t output_dimension,
                                          std::vector<std::size_t> input_dimensions,
                                          std::span<const double> values) {
    constexpr const char* op = "MultilinearMap::from_dense";
    const std::size_t count = checked_multilinear_element_count(
        op, output_dimension, input_dimensions, max_multilinear_map_elements);
    if (values.size() != count) {
        throw std::invalid_argument(std::string(op) + ": " + std::to_string(values.size()) +
                                    " values given for " + std::to_string(count) + " elements");
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (!std::isfinite(values[i])) {
            std::ostringstream message;
            message << op << ": values[" << i << "] = " << values[i] << " is not finite";
            throw std::invalid_argument(message.str());
        }
    }
    return {output_dimension, std::move(input_dimensions),
            std::vector<double>(values.begin(), values.end())};
}

MultilinearMap MultilinearMap::from_sparse(std::size_t output_dimension,
                                           std::vector<std::size_t> input_dimensions,
                                           std::span<const std::uint64_t> indices,
                                           std::span<const double> values) {
    constexpr const char* op = "MultilinearMap::from_sparse";
    const std::size_t count = checked_multilinear_element_count(
        op, output_dimension, input_dimensions, max_multilinear_map_elements);
    if (indices.size() != values.size()) {
        throw std::invalid_argument(std::string(op) + ": " + std::to_string(indices.size()) +
                                    " indices but " + std::to_string(values.size()) + " values");
    }
    for (std::size_t i = 0; i < indices.size(); ++i) {
        if (indices[i] >= count) {
            throw std::out_of_range(std::string(op) + ": indices[" + std::to_string(i) +
                                    "] = " + std::to_string(indices[i]) + " is past the " +
                                    std::to_string(count) + " elements");
        }
        if (!std::isfinite(values[i]) || values[i] == 0.0) {
            std::ostringstream message;
            message << op << ": values[" << i << "] = " << values[i]
                    << (values[i] == 0.0 ? " is an explicit zero (leave zeros out)"
                                         : " is not finite");
            throw std::invalid_argument(message.str());
        }
    }
    // Duplicates: sort a copy of the (index, entry) pairs, name the first repeated index.
    std::vector<std::pair<std::uint64_t, std::size_t>> order(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i)
        order[i] = {indices[i], i};
    std::sort(order.begin(), order.end());
    for (std::size_t i = 1; i < order.size(); ++i) {
        if (order[i].first == order[i - 1].first) {
            throw std::invalid_argument(
                std::string(op) + ": index " + std::to_string(order[i].first) +
                " appears twice (entries " + std::to_string(order[i - 1].second) + " and " +
                std::to_string(order[i].second) + ")");
        }
    }
    std::vector<double> dense(count, 0.0);
    for (std::size_t i = 0; i < indices.size(); ++i)
        dense[static_cast<std::size_t>(indices[i])] = values[i];
    return {output_dimension, std::move(input_dimensions), std::move(dense)};
}

std::size_t MultilinearMap::nonzero_count() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(values_.begin(), values_.end(), [](double v) { return v != 0.0; }));
}

std::vector<double> MultilinearMap::evaluate(std::span<const std::vector<double>> inputs) const {
    if (inputs.size() != arity()) {
        throw std::invalid_argument("MultilinearMap::evaluate: " + std::to_string(inputs.size()) +
                                    " inputs for arity " + std::to_string(arity()));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].size() != input_dimensions_[i]) {
            throw std::invalid_argument("MultilinearMap::evaluate: input " + std::to_string(i) +
                                        " has " + std::to_string(inputs[i].size()) +
                                        " values, not " + std::to_string(input_dimensions_[i]));
        }
    }
    // Walk every element once, keeping the product of the selected input entries.
    const std::size_t per_output = values_.size() / output_dimension_;
    std::vector<double> y(output_dimension_, 0.0);
    std::vector<std::size_t> index(arity(), 0);
    for (std::size_t flat = 0; flat < per_output; ++flat) {
        double product = 1.0;
        for (std::size_t i = 0; i < arity(); ++i)
            product *= inputs[i][index[i]];
        for (std::size_t o = 0; o < output_dimension_; ++o)
            y[o] += values_[o * per_output + flat] * product;
        for (std::size_t i = arity(); i-- > 0;) {  // odometer, last input fastest
            if (++index[i] < input_dimensions_[i])
                break;
            index[i] = 0;
        }
    }
    return y;
}

}  // namespace riftco_transformer
