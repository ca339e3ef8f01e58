list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/interchange/gguf_reader.cpp
    src/interchange/gguf_dequantize.cpp
    src/interchange/llama_gguf.cpp
    src/interchange/checkpoint_names.cpp
    src/interchange/gguf_tokenizer.cpp)
