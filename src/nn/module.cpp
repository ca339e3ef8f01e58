#include "riftco_transformer/nn/module.hpp"

#include <stdexcept>
#include <string_view>
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

Variable Module::register_parameter(std::string name, Tensor value, ParameterScope scope) {
    require_new_name(name);
    entries_.push_back({std::move(name), Variable(std::move(value), true), nullptr, scope});
    return entries_.back().parameter;
}

void Module::register_parameter(std::string name, Variable leaf, ParameterScope scope) {
    require_new_name(name);
    if (!leaf.defined() || !leaf.is_leaf()) {
        throw std::invalid_argument("Module: parameter '" + name + "' must be a defined leaf");
    }
    entries_.push_back({std::move(name), std::move(leaf), nullptr, scope});
}

void Module::register_released_parameter(std::string name) {
    require_new_name(name);
    entries_.push_back({std::move(name), Variable(), nullptr, ParameterScope::Base});
}

void Module::adopt(std::string name, std::unique_ptr<Module> child, ParameterScope scope) {
    require_new_name(name);
    if (child == nullptr) {
        throw std::invalid_argument("Module: child '" + name + "' is null");
    }
    entries_.push_back({std::move(name), Variable(), std::move(child), scope});
}

void Module::set_parameter_slot(std::string_view name, Variable parameter) {
    for (Entry& entry : entries_) {
        if (entry.child == nullptr && entry.name == name) {
            entry.parameter = std::move(parameter);
            return;
        }
    }
    throw std::logic_error("Module: no parameter slot '" + std::string(name) + "'");
}

void Module::remove_entry(std::string_view name) noexcept {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->name == name) {
            entries_.erase(it);
            return;
        }
    }
}

void Module::prepare_transfer(ExecutionBackend /*backend*/,
                              std::vector<std::function<void()>>& /*commits*/) {}

void Module::collect(const std::string& prefix, ParameterScope inherited, bool all,
                     ParameterScope scope, ParameterList& out) const {
    for (const Entry& entry : entries_) {
        const ParameterScope effective =
            inherited == ParameterScope::Adapter ? ParameterScope::Adapter : entry.scope;
        if (entry.child) {
            entry.child->collect(prefix + entry.name + ".", effective, all, scope, out);
        } else if (entry.parameter.defined() && (all || effective == scope)) {
            out.push_back({prefix + entry.name, entry.parameter});
        }
    }
}

void Module::collect_transfers(ExecutionBackend backend,
                               std::vector<std::function<void()>>& commits) {
    prepare_transfer(backend, commits);
    for (const Entry& entry : entries_) {
        if (entry.child) {
            entry.child->collect_transfers(backend, commits);
        }
    }
}

ParameterList Module::parameters() const {
    ParameterList list;
    collect("", ParameterScope::Base, false, ParameterScope::Base, list);
    return list;
}

ParameterList Module::adapter_parameters() const {
    ParameterList list;
    collect("", ParameterScope::Base, false, ParameterScope::Adapter, list);
    return list;
}

const Module* Module::find_module(std::string_view path) const noexcept {
    const Module* module = this;
    while (!path.empty() && module != nullptr) {
        const std::size_t dot = path.find('.');
        const std::string_view segment = path.substr(0, dot);
        const Module* next = nullptr;
        for (const Entry& entry : module->entries_) {
            if (entry.child && entry.name == segment) {
                next = entry.child.get();
                break;
            }
        }
        module = next;
        path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
    }
    return module;
}

Module* Module::find_module(std::string_view path) noexcept {
    return const_cast<Module*>(std::as_const(*this).find_module(path));
}

std::size_t Module::parameter_count() const {
    std::size_t count = 0;
    for (const NamedParameter& named : parameters())
        count += named.parameter.value().numel();
    return count;
}

const Variable* Module::first_base_parameter(ParameterScope inherited) const noexcept {
    for (const Entry& entry : entries_) {
        const ParameterScope effective =
            inherited == ParameterScope::Adapter ? ParameterScope::Adapter : entry.scope;
        if (entry.child) {
            if (const Variable* found = entry.child->first_base_parameter(effective)) {
                return found;
            }
        } else if (entry.parameter.defined() && effective == ParameterScope::Base) {
            return &entry.parameter;
        }
    }
    return nullptr;
}

ExecutionBackend Module::backend() const {
    const Variable* first = first_base_parameter(ParameterScope::Base);
    if (first == nullptr) {
        throw std::logic_error("Module::backend: the module has no parameters");
    }
    return first->backend();
}

void Module::to(ExecutionBackend backend) {
    // Prepare every destination value (this is where a transfer can fail), then commit with
    // operations that cannot throw.
    ParameterList list;
    collect("", ParameterScope::Base, true, ParameterScope::Base, list);
    std::vector<Tensor> moved(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (list[i].parameter.backend() != backend) {
            moved[i] = list[i].parameter.value().to(backend);
        }
    }
    std::vector<std::function<void()>> commits;
    collect_transfers(backend, commits);
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (!moved[i].is_singular()) {
            list[i].parameter.replace_value(std::move(moved[i]));
        }
    }
    for (const std::function<void()>& commit : commits) {
        commit();
    }
}

}  // namespace riftco_transformer
