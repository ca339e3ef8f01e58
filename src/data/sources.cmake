list(APPEND RIFTCO_TRANSFORMER_SOURCES
    src/data/tokenizer.cpp
    src/data/utf8.cpp
    src/data/byte_tokenizer.cpp
    src/data/bpe_validation.cpp
    src/data/bpe_reference.cpp
    src/data/bpe_trainer.cpp
    src/data/bpe_encoder.cpp
    src/data/bpe_tokenizer.cpp
    src/data/tokenizer_factory.cpp
    src/data/pretokenizer.cpp
    src/data/pretrained_tokenizer.cpp)
list(APPEND RIFTCO_TRANSFORMER_SOURCES src/data/batching.cpp)  # next-token windows
