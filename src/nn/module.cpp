#include "riftco_transformer/nn/module.hpp"

#include <stdexcept>
#include <utility>

namespace riftco_transformer {

void Module::require_new_name(const std::string& name) const {
    if (name.empty() || name.find('.') != std::string::npos) {
        throw std::invalid_argument("Module: name '" + name +
                                    "' must be non-empty and contain no '.'");
    }
    for (const Entry& entry : entries_) {
        if (entry.name == name) {
            throw std::invalid_argument("Module: name '" + name + "' is already registered");
        }
    }
}

Variable Module::register_parameter(std::string name, Tensor value) {
    require_new_name(name);
    entries_.push_back({std::move(name), Variable(std::move(value), true), nullptr});
    return entries_.back().parameter;
}

void Module::adopt(std::string name, std::unique_ptr<Module> child) {
    require_new_name(name);
    if (child == nullptr) {
        throw std::invalid_argument("Module: child '" + name + "' is null");
    }
    entries_.push_back({std::move(name), Variable(), std::move(child)});
}

void Module::collect(const std::string& prefix, ParameterList& out) const {
    for (const Entry& entry : entries_) {
        if (entry.child) {
            entry.child->collect(prefix + entry.name + ".", out);
        } else {
            out.push_back({prefix + entry.name, entry.parameter});
        }
    }
}

ParameterList Module::parameters() const {
    ParameterList list;
    collect("", list);
    return list;
}

std::size_t Module::parameter_count() const {
    std::size_t count = 0;
    for (const NamedParameter& named : parameters())
        count += named.parameter.value().numel();
    return count;
}

ExecutionBackend Module::backend() const {
    const ParameterList list = parameters();
    if (list.empty()) {
        throw std::logic_error("Module::backend: the module has no parameters");
    }
    return list.front().parameter.backend();
}

void Module::to(ExecutionBackend backend) {
    // Prepare every destination value (this is where a transfer can fail), then commit with
    // operations that cannot throw.
    ParameterList list = parameters();
    std::vector<Tensor> moved(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (list[i].parameter.backend() != backend) {
            moved[i] = list[i].parameter.value().to(backend);
        }
    }
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (!moved[i].is_singular()) {
            list[i].parameter.replace_value(std::move(moved[i]));
        }
    }
}

}  // namespace riftco_transformer
