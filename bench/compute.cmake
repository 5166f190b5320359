# Compute benchmarks: GEMM backends and the single-core ceiling (gemm_peak).
add_executable(gemm_peak ${CMAKE_CURRENT_SOURCE_DIR}/gemm_peak.cpp)
target_link_libraries(gemm_peak PRIVATE troupe_kernels BLAS::BLAS)
