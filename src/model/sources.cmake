list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/model/transformer.cpp)
