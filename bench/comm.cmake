# Data-plane benchmark: collectives over gloo with ranks as processes, and raw gloo beside them.
add_executable(comm_bench ${CMAKE_CURRENT_SOURCE_DIR}/comm_bench.cpp)
target_link_libraries(comm_bench PRIVATE troupe_comm)
