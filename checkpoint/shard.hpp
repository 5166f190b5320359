// One rank's part of a checkpoint: a snapshot of the tensors it holds, copied out of
// the live buffers at a step boundary (so training may go on while it is written), and
// the write of that snapshot into <root>/step_N.tmp/shard_r<rank>.safetensors.
//
// Replicas of a tensor share its bytes out instead of writing them twice: replica
// `index` of `count` ranks that hold the same slice writes its part of it (spread()).
// Every tensor is stored with its AdamW moments as "optim.m.<name>" / "optim.v.<name>"
// and its slice in the "slices" metadata, so any layout can read it back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/commit.hpp"

namespace troupe::checkpoint {

// A tensor a rank holds, with its optimizer moments (live buffers of local_shape).
struct HeldTensor {
  std::string name;
  SliceSpec held;  // what this rank holds of the global tensor
  Shape local_shape;
  const float* data = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;
  int replica = 0, replicas = 1;  // this rank among the ranks holding the same slice
  // Instead of m and v: this replica's part of them (spread(held, replica, replicas), in
  // copy_block's layout), moved into the snapshot as it is. ZeRO ranks own no whole moments.
  std::vector<float> m_part, v_part;
};

struct ShardSnapshot {
  std::string root;  // absolute checkpoint root
  int64_t step = 0;
  int rank = 0, world = 1, generation = 0, keep = 0;
  std::string file;  // shard_r<rank>.safetensors
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<float>> buffers;
  safetensors::Metadata meta;
  std::string manifest_json;  // the manifest without its file list (the same on every rank)
};

std::string shard_file_name(int rank);

// Copies this rank's part of `tensors` (each replica its share) into a snapshot; moves
// the moments' parts where a tensor comes with them.
ShardSnapshot snapshot_shard(const std::string& root, int64_t step, int rank, int world, int generation,
                             const std::string& layout, int keep, std::vector<HeldTensor> tensors,
                             const std::string& manifest_json);

// Writes the snapshot into step_N.tmp (fsynced) and returns the report a committer
// takes. A full disk throws DiskFullError after removing the partial file (and
// step_N.tmp once no rank has a file in it): earlier checkpoints stay intact.
ShardReport write_snapshot(const ShardSnapshot& s);

}  // namespace troupe::checkpoint
