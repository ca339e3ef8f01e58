list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/nn/module.cpp
    src/nn/initialization.cpp
    src/nn/layers.cpp
    src/nn/lora.cpp
    src/nn/packed_state.cpp
    src/nn/attention.cpp
    src/nn/rotary_embedding.cpp
    src/nn/grouped_query_attention.cpp)
