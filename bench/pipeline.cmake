# Pipeline bubble: the executor over the local backend (ranks as threads), measured
# against the theoretical and the checker's simulated bubble.
add_executable(pipeline_bubble ${CMAKE_CURRENT_SOURCE_DIR}/pipeline_bubble.cpp)
target_link_libraries(pipeline_bubble PRIVATE troupe_parallel troupe_model troupe_comm troupe_core)
