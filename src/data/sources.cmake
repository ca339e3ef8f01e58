list(APPEND RIFTCO_TRANSFORMER_SOURCES src/data/batching.cpp)
