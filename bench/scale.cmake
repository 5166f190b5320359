# The control plane at scale: the real coordinator (mutual TLS, --state-dir) against N
# simulated ranks on N/8 simulated agents, packed into a few processes of this executable
# (docs/scale.md). The test scale_256 below runs it at 256 ranks as a correctness test.
add_executable(scale ${CMAKE_CURRENT_SOURCE_DIR}/scale/main.cpp ${CMAKE_CURRENT_SOURCE_DIR}/scale/driver.cpp
                     ${CMAKE_CURRENT_SOURCE_DIR}/scale/phases.cpp ${CMAKE_CURRENT_SOURCE_DIR}/scale/observed.cpp
                     ${CMAKE_CURRENT_SOURCE_DIR}/scale/measure.cpp ${CMAKE_CURRENT_SOURCE_DIR}/scale/sim.cpp
                     ${CMAKE_CURRENT_SOURCE_DIR}/scale/sim_worker.cpp
                     ${CMAKE_CURRENT_SOURCE_DIR}/scale/rendezvous_script.cpp
                     ${CMAKE_CURRENT_SOURCE_DIR}/scale/node_ids.cpp)
target_link_libraries(scale PRIVATE troupe_worker troupe_coordinator troupe_checkpoint troupe_comm cppzmq
                                    CLI11::CLI11)
target_compile_definitions(scale PRIVATE TROUPE_BINARY_DIR="${PROJECT_BINARY_DIR}")
add_dependencies(scale troupe)
# The harness at 256 ranks as a correctness test: every rank gets its assignment and reads
# its peers' rendezvous values, the killed rank, the hung rank and the lost agent each abort
# every survivor and the next generation forms. The exit code says so; no time is asserted
# (--patience stretches every wait on a loaded machine).
if(TROUPE_BUILD_TESTS)
  add_test(NAME scale_256 COMMAND scale --ranks 256 --steady 4 --checkpoint-every 4 --patience 3)
  # Alone: its thousand-odd threads would starve a test beside it, and be starved by it.
  set_tests_properties(scale_256 PROPERTIES TIMEOUT 240 RUN_SERIAL TRUE LABELS "multiprocess;scale")
endif()
# The coordinator's JSON views (status, list, /metrics) at 256 to 16,384 ranks, on its state
# alone (docs/scale.md, "Answers at sizes beyond the harness").
add_executable(control_views ${CMAKE_CURRENT_SOURCE_DIR}/control_views.cpp)
target_include_directories(control_views PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(control_views PRIVATE troupe_coordinator)
