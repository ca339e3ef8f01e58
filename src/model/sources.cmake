list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/model/transformer.cpp
    src/model/llama_mistral.cpp)
