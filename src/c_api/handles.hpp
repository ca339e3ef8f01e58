#pragma once
// What the opaque C handles are. Each rt_* struct is the C++ object behind one handle.
//
// Ownership (docs/ARCHITECTURE.md, 'The C ABI'): a model's state lives in a shared ModelState. The
// model handle and every handle derived from it (parameter lists, variables, Adam) hold a
// shared_ptr to it, so releasing the model handle invalidates nothing. Variables and
// optimizers additionally hold a ModelPin: while an optimizer lives, or a variable whose graph
// no backward has consumed (Variable::holds_graph), operations that would change the backend
// or the parameters underneath them (rt_model_to, parameter loads, LoRA merge) are rejected.
// A consumed graph holds only its output's value, so it pins nothing.
// The parameter epoch counts parameter replacements (Adam steps, loads): a graph records the
// epoch it was built at, and backward rejects a graph from an older epoch.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "riftco_transformer/c_api.h"
#include "riftco_transformer/core/autograd/variable.hpp"
#include "riftco_transformer/core/backend.hpp"
#include "riftco_transformer/core/tensor.hpp"
#include "riftco_transformer/data/tokenizer.hpp"
#include "riftco_transformer/distributed/process_group.hpp"
#include "riftco_transformer/distributed/zero_redundancy_adam.hpp"
#include "riftco_transformer/model/decoder.hpp"
#include "riftco_transformer/model/transformer.hpp"
#include "riftco_transformer/nn/parameter.hpp"
#include "riftco_transformer/optim/adam.hpp"
#include "riftco_transformer/programmed/program_augmented_model.hpp"
#include "riftco_transformer/serving/decode_session.hpp"

namespace riftco_transformer::c_api {

struct ModelState {
    // Exactly one is set: the handle type says which (rt_model or rt_program_augmented_model).
    // An rt_model holds a GPT decoder (rt_model_create) or a Llama/Mistral decoder
    // (rt_llama_mistral_model_*), both behind the CausalLanguageModel interface.
    std::unique_ptr<CausalLanguageModel> model;
    std::unique_ptr<ProgramAugmentedModel> program_model;
    rt_transformer_config config{};  // GPT decoder: as created (struct_size = sizeof)
    // Llama/Mistral decoder: as created (struct_size = sizeof); struct_size 0 otherwise.
    rt_llama_mistral_config llama_config{};
    std::size_t live_variables = 0;
    std::set<const riftco_transformer::Variable*> variables;  // of the live rt_variables
    std::size_t live_optimizers = 0;
    std::size_t live_parameter_lists = 0;  // base and adapter lists
    std::size_t live_adapter_lists = 0;
    std::size_t live_sessions = 0;  // decode sessions (rt_decode_session)
    std::uint64_t parameter_epoch = 0;

    // The live variables that still hold a graph (Variable::holds_graph).
    [[nodiscard]] std::size_t live_graphs() const noexcept;
    // std::logic_error when a graph, an optimizer or a decode session pins the model (the
    // boundary prefixes the function name).
    void require_unpinned() const;
    // std::logic_error when a graph or a decode session pins the model (optimizers allowed).
    void require_no_live_graph() const;
    // std::logic_error while a decode session lives (its cached keys and values describe the
    // current parameters).
    void require_no_session() const;
};

// RAII registration of one live variable or optimizer with its model.
class ModelPin {
  public:
    enum class Kind { Variable, Optimizer };
    ModelPin(std::shared_ptr<ModelState> state, Kind kind);
    ~ModelPin();
    ModelPin(const ModelPin&) = delete;
    ModelPin& operator=(const ModelPin&) = delete;
    ModelPin(ModelPin&&) = delete;
    ModelPin& operator=(ModelPin&&) = delete;

    [[nodiscard]] ModelState& state() const noexcept { return *state_; }
    [[nodiscard]] const std::shared_ptr<ModelState>& shared_state() const noexcept {
        return state_;
    }

  private:
    std::shared_ptr<ModelState> state_;
    Kind kind_;
};

}  // namespace riftco_transformer::c_api

struct rt_tokenizer {
    std::shared_ptr<const riftco_transformer::Tokenizer> tokenizer;
};

struct rt_context {
    riftco_transformer::ExecutionBackend backend = riftco_transformer::ExecutionBackend::Cpu;
};

struct rt_tensor {
    riftco_transformer::Tensor tensor;  // never mutated after creation
};

struct rt_model {
    std::shared_ptr<riftco_transformer::c_api::ModelState> state;
};

struct rt_parameter_list {
    rt_parameter_list(std::shared_ptr<riftco_transformer::c_api::ModelState> model_state,
                      riftco_transformer::ParameterList list, bool adapter_list)
        : state(std::move(model_state)), parameters(std::move(list)), adapter(adapter_list) {
        ++state->live_parameter_lists;
        state->live_adapter_lists += adapter ? 1 : 0;
    }
    ~rt_parameter_list() {
        --state->live_parameter_lists;
        state->live_adapter_lists -= adapter ? 1 : 0;
    }
    rt_parameter_list(const rt_parameter_list&) = delete;
    rt_parameter_list& operator=(const rt_parameter_list&) = delete;
    std::shared_ptr<riftco_transformer::c_api::ModelState> state;
    riftco_transformer::ParameterList parameters;
    bool adapter;  // from rt_model_lora_parameters
};

struct rt_variable {
    rt_variable(std::shared_ptr<riftco_transformer::c_api::ModelState> state,
                riftco_transformer::Variable value)
        : pin(std::move(state), riftco_transformer::c_api::ModelPin::Kind::Variable),
          variable(std::move(value)),
          epoch(pin.state().parameter_epoch) {
        pin.state().variables.insert(&variable);
    }
    ~rt_variable() { pin.state().variables.erase(&variable); }
    rt_variable(const rt_variable&) = delete;
    rt_variable& operator=(const rt_variable&) = delete;
    riftco_transformer::c_api::ModelPin pin;
    riftco_transformer::Variable variable;
    std::uint64_t epoch;             // the model's parameter epoch when the graph was built
    bool backward_consumed = false;  // a backward through this handle succeeded
};

namespace riftco_transformer::c_api {
// What an rt_process_group owns; a sharded rt_adam shares it, so the group outlives it.
struct DistributedState {
    explicit DistributedState(std::unique_ptr<ProcessGroup> native)
        : group(std::move(native)), parallel(*group) {}
    std::unique_ptr<ProcessGroup> group;
    DataParallel parallel;
};
}  // namespace riftco_transformer::c_api

struct rt_process_group {
    std::shared_ptr<riftco_transformer::c_api::DistributedState> state;
};

// An Adam over the whole list, or (rt_adam_create_sharded) one rank's shard of a ZeRO-1
// optimizer; the accessors below answer for either.
namespace riftco_transformer::c_api {
// A backward through `native` may run: its graph not consumed by an earlier backward, and
// built at the model's current parameter epoch (std::logic_error otherwise).
void require_differentiable(const rt_variable& native);
}  // namespace riftco_transformer::c_api

struct rt_adam {
    rt_adam(std::shared_ptr<riftco_transformer::c_api::ModelState> state,
            riftco_transformer::Adam optimizer)
        : pin(std::move(state), riftco_transformer::c_api::ModelPin::Kind::Optimizer),
          adam(std::move(optimizer)) {}
    rt_adam(std::shared_ptr<riftco_transformer::c_api::ModelState> state,
            std::shared_ptr<riftco_transformer::c_api::DistributedState> distributed,
            const riftco_transformer::ParameterList& parameters,
            const riftco_transformer::AdamOptions& options)
        : pin(std::move(state), riftco_transformer::c_api::ModelPin::Kind::Optimizer),
          group(std::move(distributed)),
          sharded(std::in_place, group->parallel, parameters, options) {}
    riftco_transformer::c_api::ModelPin pin;
    std::optional<riftco_transformer::Adam> adam;
    std::shared_ptr<riftco_transformer::c_api::DistributedState> group;  // sharded only
    // Mutable: reading a sharded optimizer's state is a collective (it gathers the moments),
    // though it changes nothing.
    mutable std::optional<riftco_transformer::ZeroRedundancyAdam> sharded;

    [[nodiscard]] riftco_transformer::AdamStepStats step() {
        return adam ? adam->step() : sharded->step();
    }
    [[nodiscard]] riftco_transformer::AdamState state() const {  // collective when sharded
        return adam ? adam->state() : sharded->state();
    }
    void load_state(const riftco_transformer::AdamState& state) {
        if (adam)
            adam->load_state(state);
        else
            sharded->load_state(state);
    }
    [[nodiscard]] const riftco_transformer::ParameterList& parameters() const {
        return adam ? adam->parameters() : sharded->parameters();
    }
    [[nodiscard]] std::uint64_t step_count() const {
        return adam ? adam->step_count() : sharded->step_count();
    }
    [[nodiscard]] std::size_t state_value_count() const {
        return adam ? adam->state_value_count() : sharded->state_value_count();
    }
    // This process's Adam: the whole list's, or its shard's (null when it owns nothing).
    [[nodiscard]] const riftco_transformer::Adam* local() const {
        return adam ? &*adam : sharded->shard();
    }
    // The moment bytes this process holds (its shard's when sharded).
    [[nodiscard]] std::size_t state_payload_bytes() const {
        return adam ? adam->state_payload_bytes() : sharded->owned_state_bytes();
    }
};

struct rt_multilinear_map {
    riftco_transformer::MultilinearMap map;
};

struct rt_program_augmented_model {
    std::shared_ptr<riftco_transformer::c_api::ModelState> state;
};

struct rt_representation_trace {
    riftco_transformer::RepresentationTrace trace;
};

struct rt_kv_cache_pool {
    std::shared_ptr<riftco_transformer::c_api::ModelState> state;
    std::shared_ptr<riftco_transformer::KeyValueCachePool> pool;
};

struct rt_decode_session {
    rt_decode_session(std::shared_ptr<riftco_transformer::c_api::ModelState> model_state,
                      std::shared_ptr<riftco_transformer::KeyValueCachePool> shared_pool,
                      std::unique_ptr<riftco_transformer::DecodeSession> decode)
        : state(std::move(model_state)),
          pool(std::move(shared_pool)),
          session(std::move(decode)),
          epoch(state->parameter_epoch) {
        ++state->live_sessions;
    }
    ~rt_decode_session() {
        session.reset();  // returns its pages before the pool reference goes
        --state->live_sessions;
    }
    rt_decode_session(const rt_decode_session&) = delete;
    rt_decode_session& operator=(const rt_decode_session&) = delete;
    std::shared_ptr<riftco_transformer::c_api::ModelState> state;
    std::shared_ptr<riftco_transformer::KeyValueCachePool> pool;  // null for a private cache
    std::unique_ptr<riftco_transformer::DecodeSession> session;
    std::uint64_t epoch;  // the model's parameter epoch when the session was created
};
