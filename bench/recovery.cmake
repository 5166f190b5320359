# Recovery: detection latency and fault-to-first-step time for each fault kind,
# against real coordinator, agent and worker processes of the built `troupe`.
add_executable(recovery ${CMAKE_CURRENT_SOURCE_DIR}/recovery.cpp)
target_link_libraries(recovery PRIVATE troupe_coordinator cppzmq)
target_compile_definitions(recovery PRIVATE TROUPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                            TROUPE_BINARY_DIR="${PROJECT_BINARY_DIR}")
add_dependencies(recovery troupe)
