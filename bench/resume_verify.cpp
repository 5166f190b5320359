// What checking a checkpoint's checksums costs the ranks that resume from it: a checkpoint of
// K shards (one tensor split by rows, one shard per rank, as a same-layout resume finds it),
// read back by K ranks in turn, each reading its own rows. Verify::all (every rank checks every
// file, as ranks did) against Verify::on_read (each rank checks the files it reads). Files are
// in the page cache after the first pass: the figures are checksum and read costs, not disk.
//
//   build/bench/resume_verify [--shards 16] [--mib 16] [--dir DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/commit.hpp"
#include "core/safetensors.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kCols = 1024;

// dir/step_000001: tensor "x" of (shards * rows, kCols), shard r holding rows [r * rows, (r+1) * rows).
std::string write_checkpoint(const std::string& dir, int shards, int64_t rows) {
  checkpoint::CommitTracker tracker;
  checkpoint::Manifest m;
  m.step = 1;
  const std::string tmp = dir + "/step_000001.tmp";
  fs::create_directories(tmp);
  std::vector<float> buf(size_t(rows * kCols));
  std::string out;
  for (int r = 0; r < shards; ++r) {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(r) + float(i % 977) * 1e-3f;
    checkpoint::SliceSpec held{{shards * rows, kCols}, 0, {{r * rows, rows, 0}}};
    const nlohmann::json slices = {{"x", checkpoint::slice_json(held)}};
    const std::string name = "rank" + std::to_string(r) + ".safetensors";
    safetensors::write(tmp + "/" + name, {{"x", DType::f32, {rows, kCols}, buf.data()}},
                       {{"slices", slices.dump()}});
    checkpoint::ShardReport rep;
    rep.root = dir;
    rep.step = 1;
    rep.rank = r;
    rep.world = shards;
    rep.manifest_json = checkpoint::to_json(m).dump();
    rep.files.push_back({name, fs::file_size(tmp + "/" + name), checkpoint::file_xxh64(tmp + "/" + name)});
    if (auto ready = tracker.add("bench/0", rep)) out = checkpoint::commit(ready->root, ready->manifest, 0);
  }
  return out;
}

// Seconds for every rank in turn to open the checkpoint and read its rows; *checked: files
// whose checksums were checked, over all ranks.
double resume_all(const std::string& ck, int shards, int64_t rows, checkpoint::Verify v, size_t* checked) {
  std::vector<float> mine(size_t(rows * kCols));
  *checked = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < shards; ++r) {
    checkpoint::TensorSource src(ck, v);
    src.read_slice("x", {{shards * rows, kCols}, 0, {{r * rows, rows, 0}}}, mine.data());
    if (mine[0] != float(r)) std::abort();
    *checked += src.files_verified();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int shards = 16, mib = 16;
  std::string dir = (fs::temp_directory_path() / "troupe-resume-verify").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--shards")
      shards = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--mib")
      mib = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--dir")
      dir = argv[i + 1];
  }
  fs::remove_all(dir);
  const int64_t rows = int64_t(mib) * (1 << 20) / int64_t(sizeof(float)) / kCols;
  const std::string ck = write_checkpoint(dir, shards, rows);
  std::printf("checkpoint: %d shards of %d MiB (%s)\n", shards, mib, ck.c_str());
  std::printf("%-10s %10s %16s %18s\n", "verify", "seconds", "files checked", "MiB hashed/rank");
  for (int pass = 0; pass < 2; ++pass)  // the first pass warms the page cache
    for (auto [v, name] :
         {std::pair{checkpoint::Verify::all, "all"}, std::pair{checkpoint::Verify::on_read, "on_read"}}) {
      size_t checked = 0;
      const double s = resume_all(ck, shards, rows, v, &checked);
      if (pass == 1)
        std::printf("%-10s %10.3f %16zu %18.1f\n", name, s, checked, double(checked) / shards * mib);
    }
  fs::remove_all(dir);
  return 0;
}
