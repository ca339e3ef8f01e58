# The PJRT adapter's sources (RIFTCO_TRANSFORMER_ENABLE_TPU=ON).
list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/core/backend/pjrt/runtime.cpp
    src/core/backend/pjrt/program.cpp
    src/core/backend/pjrt/pjrt_adapter.cpp
    src/core/backend/pjrt/elementwise.cpp
    src/core/backend/pjrt/layout.cpp
    src/core/backend/pjrt/reduction.cpp
    src/core/backend/pjrt/matmul.cpp
    src/core/backend/pjrt/attention.cpp
    src/core/backend/pjrt/paged_attention.cpp
    src/core/backend/pjrt/quantized_linear.cpp
    src/core/backend/pjrt/softmax.cpp
    src/core/backend/pjrt/normalization.cpp
    src/core/backend/pjrt/loss.cpp
    src/core/backend/pjrt/indexing.cpp
    src/core/backend/pjrt/adam.cpp
)
