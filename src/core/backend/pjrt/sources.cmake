# The PJRT adapter's sources (RIFTCO_TRANSFORMER_ENABLE_TPU=ON).
list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/core/backend/pjrt/runtime.cpp
    src/core/backend/pjrt/program.cpp
    src/core/backend/pjrt/pjrt_adapter.cpp
    src/core/backend/pjrt/elementwise.cpp
    src/core/backend/pjrt/layout.cpp
    src/core/backend/pjrt/reduction.cpp
    src/core/backend/pjrt/matmul.cpp
    src/core/backend/pjrt/pending_capabilities.cpp
)
