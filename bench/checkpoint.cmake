# Checkpoint write throughput against dd, and the step-time overhead of saving.
add_executable(ckpt_bench ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_bench.cpp)
target_link_libraries(ckpt_bench PRIVATE troupe_engine troupe_checkpoint troupe_core)
# What checking a checkpoint's checksums costs the ranks resuming from it: every file by every
# rank, or each file by the ranks that read it.
add_executable(resume_verify ${CMAKE_CURRENT_SOURCE_DIR}/resume_verify.cpp)
target_link_libraries(resume_verify PRIVATE troupe_checkpoint troupe_core)
# What the committer pays to commit a checkpoint of N shards (the reports' collection, the
# manifest, fsync and rename).
add_executable(commit_cost ${CMAKE_CURRENT_SOURCE_DIR}/commit_cost.cpp)
target_link_libraries(commit_cost PRIVATE troupe_checkpoint troupe_core)
