list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/data/tokenizer.cpp
    src/data/utf8.cpp
    src/data/byte_tokenizer.cpp
    src/data/bpe_validation.cpp
    src/data/bpe_reference.cpp
    src/data/bpe_trainer.cpp
    src/data/bpe_encoder.cpp
    src/data/bpe_tokenizer.cpp
    src/data/tokenizer_factory.cpp)
list(APPEND RIFTCO_TRANSFORMER_SOURCES src/data/batching.cpp)  # next-token windows
