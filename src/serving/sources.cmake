list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/serving/kv_cache.cpp
    src/serving/decode_session.cpp)
