list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/serving/kv_cache.cpp
    src/serving/decode_session.cpp
    src/serving/sampling.cpp)
# The samplers' doubles must equal the Python reference's bit for bit: no fused multiply-adds.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    set_source_files_properties(src/serving/sampling.cpp PROPERTIES
        COMPILE_OPTIONS "-ffp-contract=off")
endif()
