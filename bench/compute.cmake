# Compute benchmarks: GEMM backends and the single-core ceiling (gemm_peak).
add_executable(gemm_peak ${CMAKE_CURRENT_SOURCE_DIR}/gemm_peak.cpp)
target_link_libraries(gemm_peak PRIVATE troupe_kernels BLAS::BLAS)

# Training throughput and MFU of the engine (and the PyTorch ratio), once the
# engine library exists in this tree.
if(TARGET troupe_engine)
  add_executable(train_throughput ${CMAKE_CURRENT_SOURCE_DIR}/train_throughput.cpp)
  target_link_libraries(train_throughput PRIVATE troupe_engine troupe_kernels troupe_core)
  target_compile_definitions(train_throughput PRIVATE TROUPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  # What in-memory snapshots (checkpoint.memory_every) cost a step.
  add_executable(snapshot_cost ${CMAKE_CURRENT_SOURCE_DIR}/snapshot_cost.cpp)
  target_link_libraries(snapshot_cost PRIVATE troupe_engine troupe_core)
endif()

# Causal attention: fused against materialized against PyTorch (bench/attention_reference.py).
add_executable(attention_bench ${CMAKE_CURRENT_SOURCE_DIR}/attention_bench.cpp)
target_link_libraries(attention_bench PRIVATE troupe_kernels)
target_compile_definitions(attention_bench PRIVATE TROUPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
