#pragma once
// Module: a named tree of parameters and child modules.
//
// - Parameters and children share one namespace per module; a name segment is non-empty and
//   has no '.' (std::invalid_argument), and is unique (std::invalid_argument).
// - parameters() walks the tree depth-first in registration order and returns dot-qualified
//   names ("blocks.0.attention.query.weight"). The order is a contract: optimizers, state
//   capture and artifacts rely on it.
// - Modules own their children; they are neither copyable nor movable (children are
//   referred to by address), but parameters are shared handles that outlive the module.
// - to(backend) is transactional: every destination value is prepared first, then all are
//   committed; parameters already there are untouched; moved leaves get a new version (graphs
//   built before the move go stale) and lose their gradient.
// - There is no virtual forward: each layer has a typed forward.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer {

class Module {
  public:
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;
    Module(Module&&) = delete;
    Module& operator=(Module&&) = delete;

    [[nodiscard]] ParameterList parameters() const;
    [[nodiscard]] std::size_t parameter_count() const;  // scalars
    // The backend of the first parameter (std::logic_error for a module without any).
    [[nodiscard]] ExecutionBackend backend() const;
    virtual void to(ExecutionBackend backend);

  protected:
    Module() = default;
    // Registers a new trainable leaf holding `value` and returns a handle on it (handles are
    // shared: keep a copy in the layer).
    Variable register_parameter(std::string name, Tensor value);
    template <typename Child>
    Child& register_module(std::string name, std::unique_ptr<Child> child) {
        Child& reference = *child;
        adopt(std::move(name), std::move(child));
        return reference;
    }

  private:
    void adopt(std::string name, std::unique_ptr<Module> child);
    void require_new_name(const std::string& name) const;
    void collect(const std::string& prefix, ParameterList& out) const;

    struct Entry {
        std::string name;
        Variable parameter;             // set for parameters
        std::unique_ptr<Module> child;  // set for children
    };
    std::vector<Entry> entries_;
};

// An ordered list of child modules named "0", "1", ...
class ModuleList final : public Module {
  public:
    template <typename Child>
    Child& append(std::unique_ptr<Child> child) {
        return register_module(std::to_string(size_++), std::move(child));
    }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }

  private:
    std::size_t size_ = 0;
};

}  // namespace riftco_transformer
