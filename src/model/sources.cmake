list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/model/causal_language_model.cpp
    src/model/transformer.cpp
    src/model/decoder.cpp)
