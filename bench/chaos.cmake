# Chaos soak: seeded random faults against one endless job on the three-host network
# namespace cluster of tests/multihost (needs root; exits 77 without namespaces).
add_executable(chaos ${CMAKE_CURRENT_SOURCE_DIR}/chaos.cpp)
target_link_libraries(chaos PRIVATE troupe_coordinator cppzmq)
target_compile_definitions(chaos PRIVATE TROUPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                         TROUPE_BINARY_DIR="${PROJECT_BINARY_DIR}")
add_dependencies(chaos troupe)
