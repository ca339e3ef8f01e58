# Optimizers (docs/ARCHITECTURE.md, 'Adam'), and the CPU reference of the Adam capability
# they run on.
list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/optim/learning_rate_schedule.cpp
    src/optim/adam_options.cpp
    src/optim/moment_layout.cpp
    src/optim/adam_backend.cpp
    src/optim/gradient_norm.cpp
    src/optim/adam.cpp
    src/optim/adam_state.cpp
    src/core/backend/cpu/adam.cpp
)
# Both passes of a step evaluate the same double expressions and must agree bit for bit (the
# write stores exactly what the check accepted): no contraction into fused multiply-adds.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    set_source_files_properties(src/core/backend/cpu/adam.cpp PROPERTIES
        COMPILE_OPTIONS "-ffp-contract=off")
endif()
