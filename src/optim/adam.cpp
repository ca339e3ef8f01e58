// Adam: construction, the two-pass step, and the accessors (docs/ARCHITECTURE.md, 'Adam').
// State capture and restore live in adam_state.cpp.

#include "riftco_transformer/optim/adam.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "optim/adam_backend.hpp"
#include "optim/moment_layout.hpp"
#include "optim/number_text.hpp"
#include "riftco_transformer/core/autograd/leaf_access.hpp"
#include "riftco_transformer/core/tensor_ops/optimizer.hpp"

namespace riftco_transformer {

namespace {

LeafView node_of(const NamedParameter& entry) {
    return leaf_view(entry.parameter, "Adam");
}

std::string quoted(const NamedParameter& entry) {
    return "parameter '" + entry.name + "'";
}

// The structural rules of the constructor's list (all std::invalid_argument).
void check_list_structure(const ParameterList& parameters) {
    if (parameters.empty()) {
        throw std::invalid_argument("Adam: the parameter list is empty");
    }
    std::unordered_map<std::string_view, std::size_t> names;
    std::unordered_set<const void*> nodes;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
        const NamedParameter& entry = parameters[i];
        if (entry.name.empty()) {
            throw std::invalid_argument("Adam: parameter entry " + std::to_string(i) +
                                        " has an empty name");
        }
        if (const auto [it, inserted] = names.emplace(entry.name, i); !inserted) {
            throw std::invalid_argument("Adam: the name '" + entry.name + "' is used by entries " +
                                        std::to_string(it->second) + " and " + std::to_string(i));
        }
        if (!entry.parameter.defined()) {
            throw std::invalid_argument("Adam: " + quoted(entry) + " is an empty Variable");
        }
        const LeafView node = node_of(entry);
        if (!node.leaf) {
            throw std::invalid_argument("Adam: " + quoted(entry) +
                                        " is not a leaf (it is the result of '" +
                                        std::string(node.operation) + "')");
        }
        if (!node.requires_gradient) {
            throw std::invalid_argument("Adam: " + quoted(entry) +
                                        " is frozen (requires_gradient is false); pass only "
                                        "trainable parameters");
        }
        if (!nodes.insert(node.identity).second) {
            throw std::invalid_argument("Adam: " + quoted(entry) +
                                        " is the same Variable as an earlier entry");
        }
    }
}

[[noreturn]] void throw_backend_mismatch(const char* operation, const NamedParameter& entry,
                                         const char* what, ExecutionBackend found,
                                         ExecutionBackend expected) {
    std::ostringstream message;
    message << operation << ": the " << what << " of " << quoted(entry) << " is on "
            << execution_backend_name(found) << ", the optimizer's parameters on "
            << execution_backend_name(expected);
    throw std::invalid_argument(message.str());
}

}  // namespace

Adam::Adam(ParameterList parameters, AdamOptions options)
    : parameters_(std::move(parameters)), options_(options) {
    validate_adam_options(options_);
    check_list_structure(parameters_);
    backend_ = parameters_.front().parameter.backend();
    for (const NamedParameter& entry : parameters_) {
        shapes_.push_back(node_of(entry).value.shape());
    }
    check_parameters("Adam");

    std::vector<std::size_t> element_counts;
    for (const NamedParameter& entry : parameters_) {
        element_counts.push_back(node_of(entry).value.numel());
    }
    value_count_ = detail::checked_state_value_count(element_counts);
    std::size_t offset = 0;
    for (const std::size_t count : element_counts) {
        parameter_offsets_.push_back(offset);
        offset += count;
    }

    tensor_ops::require_optimizer_backend(backend_, "Adam");
    require_finite_values("Adam");
    static_cast<void>(detail::gradient_norm(backend_, parameters_, "Adam"));

    for (const detail::MomentPageExtent& extent :
         detail::moment_page_extents(element_counts, options_.state_storage, options_.page_size)) {
        pages_.push_back({extent.parameter, extent.offset, Tensor::zeros({extent.count}, backend_),
                          Tensor::zeros({extent.count}, backend_)});
    }
}

void Adam::check_parameters(const char* operation) const {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const NamedParameter& entry = parameters_[i];
        const LeafView node = node_of(entry);
        if (!node.requires_gradient) {
            throw std::logic_error(std::string(operation) + ": " + quoted(entry) +
                                   " was frozen after the optimizer was built");
        }
        if (node.value.backend() != backend_) {
            throw_backend_mismatch(operation, entry, "value", node.value.backend(), backend_);
        }
        if (node.value.shape() != shapes_[i]) {
            throw std::logic_error(std::string(operation) + ": " + quoted(entry) +
                                   " changed shape from " + shape_to_string(shapes_[i]) + " to " +
                                   shape_to_string(node.value.shape()) +
                                   " after the optimizer was built");
        }
        if (node.gradient.is_singular()) {
            continue;
        }
        if (node.gradient.backend() != backend_) {
            throw_backend_mismatch(operation, entry, "gradient", node.gradient.backend(), backend_);
        }
        if (node.gradient.shape() != node.value.shape()) {
            throw std::logic_error(std::string(operation) + ": the gradient of " + quoted(entry) +
                                   " has shape " + shape_to_string(node.gradient.shape()) +
                                   ", its value " + shape_to_string(node.value.shape()));
        }
    }
}

void Adam::require_finite_values(const char* operation) const {
    std::vector<const Tensor*> values;
    values.reserve(parameters_.size());
    for (const NamedParameter& entry : parameters_) {
        values.push_back(&node_of(entry).value);
    }
    // One batched request and one host read, whatever the parameter count.
    const tensor_ops::FirstNonFinite bad = tensor_ops::first_non_finite(backend_, values);
    if (bad.tensor != values.size()) {
        throw std::domain_error(std::string(operation) + ": the value of " +
                                quoted(parameters_[bad.tensor]) + " has element " +
                                std::to_string(bad.element) + " = " +
                                detail::number_text(bad.value) + " (values must be finite)");
    }
}

AdamStepStats Adam::step() {
    return step_with(nullptr);
}

AdamStepStats Adam::step(AdamShardPeers& peers) {
    return step_with(&peers);
}

AdamStepStats Adam::step_with(AdamShardPeers* peers) {
    constexpr const char* operation = "Adam::step";
    if (step_count_ == std::numeric_limits<std::uint64_t>::max()) {
        throw std::overflow_error("Adam::step: the step count " + std::to_string(step_count_) +
                                  " cannot advance");
    }
    tensor_ops::require_optimizer_backend(backend_, operation);
    check_parameters(operation);

    // Pass 1: everything that can fail, without writing, as one request and one host read:
    // the gradients' global norm and finiteness, the clip factor, and the check of every
    // candidate value and moment under it.
    const std::uint64_t step = step_count_ + 1;
    const double beta1_power = std::pow(options_.beta1, static_cast<double>(step));
    const double beta2_power = std::pow(options_.beta2, static_cast<double>(step));
    const double learning_rate =
        scheduled_learning_rate(options_.learning_rate, options_.schedule, step);
    tensor_ops::AdamUpdateScalars scalars{
        .beta1 = options_.beta1,
        .beta2 = options_.beta2,
        .bias_correction1 = 1.0 - beta1_power,
        .bias_correction2 = 1.0 - beta2_power,
        .learning_rate = learning_rate,
        .epsilon = options_.epsilon,
        .clip_scale = 1.0,  // the step check computes s on the backend
        .decay_factor = 1.0 - learning_rate * options_.weight_decay,
    };
    std::vector<tensor_ops::AdamSlice> slices;
    slices.reserve(pages_.size());
    for (MomentPage& page : pages_) {
        const LeafView node = node_of(parameters_[page.parameter]);
        slices.push_back({&node.value, node.gradient.is_singular() ? nullptr : &node.gradient,
                          page.offset, &page.first_moment, &page.second_moment});
    }
    const std::vector<const Tensor*> gradients = detail::gradients_of(parameters_);
    tensor_ops::AdamStepCheck pass;
    if (peers == nullptr) {
        pass = tensor_ops::adam_step_check(backend_, scalars, options_.maximum_gradient_norm,
                                           gradients, slices);
    } else {
        // Sharded: the statistics of this shard, merged with the others' before the clip
        // factor exists, then the check under the global factor.
        pass.gradients = tensor_ops::gradient_statistics(backend_, gradients);
        const bool mine_bad = pass.gradients.first_non_finite.tensor != gradients.size();
        bool any_bad = false;
        pass.gradients.squares = peers->merge(pass.gradients.squares, mine_bad, any_bad);
        if (any_bad && !mine_bad) {
            throw std::domain_error(
                "Adam::step: another shard has a NaN/inf gradient; nothing was changed");
        }
        if (!mine_bad) {
            pass.clip_scale = tensor_ops::clip_scale_for(pass.gradients.squares.norm(),
                                                         options_.maximum_gradient_norm);
            scalars.clip_scale = pass.clip_scale;
            pass.check = tensor_ops::adam_check(backend_, scalars, slices);
        }
    }
    if (pass.gradients.first_non_finite.tensor != gradients.size()) {
        detail::throw_non_finite_gradient(operation, parameters_, pass.gradients.first_non_finite);
    }
    const double norm = pass.gradients.squares.norm();
    const double clip_scale = pass.clip_scale;
    scalars.clip_scale = clip_scale;
    const tensor_ops::AdamCheck& check = pass.check;
    if (peers != nullptr) {
        const bool passed =
            check.value_slice == slices.size() && check.update_slice == slices.size();
        if (!peers->all_passed(passed) && passed) {
            throw std::overflow_error(
                "Adam::step: another shard's check failed (a non-finite value or update); "
                "nothing was changed");
        }
    }
    if (check.value_slice != slices.size()) {
        const MomentPage& page = pages_[check.value_slice];
        const NamedParameter& entry = parameters_[page.parameter];
        const std::size_t element = page.offset + check.value_element;
        throw std::domain_error("Adam::step: the value of " + quoted(entry) + " has element " +
                                std::to_string(element) + " = " + detail::number_text(check.value) +
                                " (values must be finite)");
    }
    if (check.update_slice != slices.size()) {
        const MomentPage& page = pages_[check.update_slice];
        throw std::overflow_error(
            "Adam::step: the update of " + quoted(parameters_[page.parameter]) + " element " +
            std::to_string(page.offset + check.update_element) +
            " is not finite in float (value, first or second moment); nothing was changed");
    }

    // Pass 2, inside the adapter: it writes in place after copy-on-write, or hands every
    // value and moment a new buffer; either way no copy or gradient observes the write.
    tensor_ops::adam_apply(backend_, scalars, slices);
    for (NamedParameter& entry : parameters_) {
        mark_leaf_updated(entry.parameter);
    }
    step_count_ = step;
    beta1_power_ = beta1_power;
    beta2_power_ = beta2_power;
    return {step, norm, clip_scale, learning_rate};
}

void Adam::zero_gradients() {
    for (NamedParameter& entry : parameters_) {
        node_of(entry).gradient = Tensor();
    }
}

double Adam::learning_rate() const {
    const std::uint64_t next =
        step_count_ == std::numeric_limits<std::uint64_t>::max() ? step_count_ : step_count_ + 1;
    return scheduled_learning_rate(options_.learning_rate, options_.schedule, next);
}

std::size_t Adam::state_page_count() const noexcept {
    return options_.state_storage == AdamStateStorage::Paged ? pages_.size() : 0;
}

}  // namespace riftco_transformer
