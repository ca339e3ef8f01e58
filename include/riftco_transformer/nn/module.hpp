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
// - Every parameter has a scope. Base parameters are the model's schema: parameters() lists
//   only them. Adapter parameters (LoRA factors) are listed by adapter_parameters() alone, so
//   attaching an adapter never changes the base list an optimizer, a checkpoint or an artifact
//   relies on. A parameter slot may be empty (a packed NF4 weight has released its dense
//   value): empty slots are skipped by both lists and keep their place in the order.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/nn/parameter.hpp"

namespace riftco_transformer {

enum class ParameterScope : std::uint8_t { Base = 0, Adapter = 1 };

class Module {
  public:
    virtual ~Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;
    Module(Module&&) = delete;
    Module& operator=(Module&&) = delete;

    // Base parameters (the schema), depth-first in registration order.
    [[nodiscard]] ParameterList parameters() const;
    // Adapter parameters, in the same walk order (e.g. "blocks.0.attention.query.lora_a.weight").
    [[nodiscard]] ParameterList adapter_parameters() const;
    [[nodiscard]] std::size_t parameter_count() const;  // scalars of the base parameters
    // The backend of the first base parameter (std::logic_error for a module without any).
    [[nodiscard]] ExecutionBackend backend() const;
    // Moves every parameter of both scopes and every module's extra state (prepare_transfer),
    // transactionally: everything is prepared first, then committed.
    virtual void to(ExecutionBackend backend);

    // The descendant at a dot-qualified path ("blocks.0.attention.query"), or null.
    [[nodiscard]] Module* find_module(std::string_view path) noexcept;
    [[nodiscard]] const Module* find_module(std::string_view path) const noexcept;

  protected:
    Module() = default;
    // Registers a new trainable leaf holding `value` and returns a handle on it (handles are
    // shared: keep a copy in the layer).
    Variable register_parameter(std::string name, Tensor value,
                                ParameterScope scope = ParameterScope::Base);
    // Registers an existing leaf (shared with the caller).
    void register_parameter(std::string name, Variable leaf, ParameterScope scope);
    // Registers the slot `name` empty, as a released one (set_parameter_slot with an empty
    // Variable): a weight that arrives packed after construction (DeferredWeightsScope).
    void register_released_parameter(std::string name);
    // A child's parameters all take `scope` (an Adapter child's base parameters are adapter
    // parameters of this module).
    // `name` is moved into adopt; clang-tidy 14 does not see the move in a member template.
    // NOLINTBEGIN(performance-unnecessary-value-param)
    template <typename Child>
    Child& register_module(std::string name, std::unique_ptr<Child> child,
                           ParameterScope scope = ParameterScope::Base) {
        Child& reference = *child;
        adopt(std::move(name), std::move(child), scope);
        return reference;
    }
    // NOLINTEND(performance-unnecessary-value-param)
    // Sets the parameter slot `name` (registered by this module) to `parameter`, or empties it
    // (an empty Variable). std::logic_error for an unknown name.
    void set_parameter_slot(std::string_view name, Variable parameter);
    // Removes the entry `name` (a rollback of a registration); no-op when absent.
    void remove_entry(std::string_view name) noexcept;
    // Extra backend state of this module that is not a parameter (packed weights): prepare its
    // move to `backend` (may throw; changes nothing) and append a commit that cannot throw.
    virtual void prepare_transfer(ExecutionBackend backend,
                                  std::vector<std::function<void()>>& commits);

  private:
    struct Entry {
        std::string name;
        Variable parameter;             // set for parameters (empty: a released slot)
        std::unique_ptr<Module> child;  // set for children
        ParameterScope scope = ParameterScope::Base;
    };

    void adopt(std::string name, std::unique_ptr<Module> child, ParameterScope scope);
    void require_new_name(const std::string& name) const;
    // Parameters whose effective scope is `scope` (an adapter child turns all it holds into
    // adapter parameters); `all` lists both scopes.
    void collect(const std::string& prefix, ParameterScope inherited, bool all,
                 ParameterScope scope, ParameterList& out) const;
    void collect_transfers(ExecutionBackend backend, std::vector<std::function<void()>>& commits);
    // The first parameter collect(Base) would list, or null; no list and no names are built
    // (backend() runs on every decode step).
    [[nodiscard]] const Variable* first_base_parameter(ParameterScope inherited) const noexcept;

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
