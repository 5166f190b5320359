#include "checkpoint/shard.hpp"

#include <cerrno>
#include <filesystem>

#include "core/error.hpp"

namespace troupe::checkpoint {

std::string shard_file_name(int rank) { return "shard_r" + std::to_string(rank) + ".safetensors"; }

ShardSnapshot snapshot_shard(const std::string& root, int64_t step, int rank, int world, int generation,
                             const std::string& layout, int keep, std::vector<HeldTensor> tensors,
                             const std::string& manifest_json) {
  ShardSnapshot s;
  s.root = std::filesystem::absolute(root).lexically_normal().string();
  s.step = step;
  s.rank = rank;
  s.world = world;
  s.generation = generation;
  s.keep = keep;
  s.file = shard_file_name(rank);
  nlohmann::json slices = nlohmann::json::object();
  for (HeldTensor& t : tensors) {
    const Spread part = spread(t.held, t.replica, t.replicas);
    if (part.end <= part.begin) continue;
    const Shape shape = local_shape(part.stored);
    int64_t n = 1;
    for (auto d : shape) n *= d;
    const float* sources[3] = {t.data, t.m, t.v};
    const char* prefixes[3] = {"", "optim.m.", "optim.v."};
    for (int k = 0; k < 3; ++k) {
      s.names.push_back(prefixes[k] + t.name);
      s.shapes.push_back(shape);
      std::vector<float>& given = k == 1 ? t.m_part : t.v_part;
      if (k > 0 && !sources[k]) {
        TROUPE_CHECK(given.size() == size_t(n), t.name, ": a moment part of ", given.size(), " floats for ",
                     n);
        s.buffers.push_back(std::move(given));
        continue;
      }
      s.buffers.emplace_back(size_t(n));
      copy_block(sources[k], t.local_shape, part.dim, part.begin, part.end, s.buffers.back().data());
    }
    slices[t.name] = slice_json(part.stored);
  }
  s.meta = {{"format", "troupe"},
            {"step", std::to_string(step)},
            {"rank", std::to_string(rank)},
            {"layout", layout},
            {"slices", slices.dump()}};
  s.manifest_json = manifest_json;
  return s;
}

ShardReport write_snapshot(const ShardSnapshot& s) {
  const std::string tmp = prepare(s.root, s.step);
  std::vector<safetensors::WriteEntry> entries;
  for (size_t k = 0; k < s.names.size(); ++k)
    entries.push_back({s.names[k], DType::f32, s.shapes[k], s.buffers[k].data()});
  FileRecord record;
  try {
    record = write_shard(tmp, s.file, entries, s.meta);
  } catch (const IoError& e) {
    if (e.code() != ENOSPC && e.code() != EDQUOT) throw;
    // The partial file is gone (safetensors::write); so is step_N.tmp once no rank has a file in it.
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw DiskFullError(std::string(e.what()) + " (checkpoint of step " + std::to_string(s.step) +
                        "; the partial file was removed, earlier checkpoints are intact): free "
                        "space under " +
                        s.root + " or set checkpoint.dir elsewhere");
  }
  fault_point("write", s.step, s.rank, s.generation, tmp + "/" + s.file);
  ShardReport rep;
  rep.root = s.root;
  rep.step = s.step;
  rep.rank = s.rank;
  rep.world = s.world;
  rep.keep = s.keep;
  rep.manifest_json = s.manifest_json;
  rep.files.push_back(std::move(record));
  return rep;
}

}  // namespace troupe::checkpoint
