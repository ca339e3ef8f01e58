list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/programmed/multilinear_map.cpp
    src/programmed/neural_lowering.cpp
    src/programmed/program_augmented_model.cpp)
