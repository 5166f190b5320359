# Checkpoint write throughput against dd, and the step-time overhead of saving.
add_executable(ckpt_bench ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_bench.cpp)
target_link_libraries(ckpt_bench PRIVATE troupe_engine troupe_checkpoint troupe_core)
