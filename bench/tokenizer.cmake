# Tokenizer figures: BPE training and encoding MB/s, bytes per token (fortunes corpus).
add_executable(tokenizer_throughput ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_throughput.cpp)
target_link_libraries(tokenizer_throughput PRIVATE troupe_core)
