# GPU training throughput of the engine next to PyTorch (a CUDA build; runs where a GPU is).
if(TARGET troupe_cuda AND TARGET troupe_engine)
  add_executable(gpu_throughput ${CMAKE_CURRENT_SOURCE_DIR}/gpu_throughput.cpp)
  target_link_libraries(gpu_throughput PRIVATE troupe_engine troupe_cuda troupe_core)
  target_compile_definitions(gpu_throughput PRIVATE TROUPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()
