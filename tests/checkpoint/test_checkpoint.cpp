// Checkpoints under any layout: saved by ranks as threads over the `local` backend and
// committed once every rank reported, resumed under another layout with the 1x1x1 losses,
// damaged files detected and skipped, export read back by init_from and by Python.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/verified.hpp"
#include "core/dtype_convert.hpp"
#include "core/safetensors.hpp"
#include "core/spec.hpp"
#include "tests/support/local_ranks.hpp"
#include "tests/support/support.hpp"
#include "worker/engine.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

constexpr int kSteps = 8;

JobSpec spec_with(bool async = true) {
  return parse_spec(
      "name: c\nmodel: {type: gpt, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 4}\n"
      "data: {source: synthetic}\n"
      "train: {steps: " +
          std::to_string(kSteps) +
          ", global_batch: 8, micro_batch: 2, seed: 5, warmup_steps: 2, optimizer: {lr: 0.003}}\n"
          "checkpoint: {keep: 2, async: " +
          (async ? "true" : "false") + "}\n",
      "c.yaml");
}

std::string temp_dir(const std::string& name) { return testing::temp_dir("test_ckpt_" + name); }

// Runs layout `l` as threads from `resume` ("" = fresh) until step `stop`, saves a
// checkpoint into `root` when `root` is set, and returns rank 0's losses.
std::vector<double> run(const JobSpec& spec, Layout l, const std::string& resume, int64_t stop,
                        const std::string& root = "", bool use_committer = true) {
  const testing::LayoutRun out = testing::run_layout(spec, l, resume, stop, root, use_committer);
  for (int r = 0; r < l.world(); ++r) {
    INFO("layout " << l.str() << " rank " << r);
    REQUIRE(out.errors[size_t(r)] == "");
  }
  std::vector<double> losses;
  for (const StepReport& s : out.reports[0]) losses.push_back(s.loss);
  return losses;
}

std::vector<char> read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

// Damages a file in place: its size stays, the bits of its last byte flip.
void flip_last_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get());
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(~c));
}

// Checkpoint dir/step_000001 of a (6, 4) tensor "x" held whole by 3 replicas, spread over
// their shards s0, s1, s2 (rows [0, 2), [2, 4), [4, 6)), committed through the tracker.
void three_replica_checkpoint(const std::string& dir, const std::vector<float>& full) {
  std::vector<std::vector<float>> bufs;
  std::vector<std::string> files;
  for (int r = 0; r < 3; ++r) {
    checkpoint::Spread sp = checkpoint::spread(checkpoint::whole({6, 4}), r, 3);
    REQUIRE(sp.stored.pieces.size() == 1);
    CHECK(sp.stored.pieces[0].offset == 2 * r);
    bufs.emplace_back(size_t((sp.end - sp.begin) * 4));
    checkpoint::copy_block(full.data(), {6, 4}, sp.dim, sp.begin, sp.end, bufs.back().data());
    nlohmann::json slices = {{"x", checkpoint::slice_json(sp.stored)}};
    const std::string f = dir + "/s" + std::to_string(r) + ".safetensors";
    safetensors::write(f, {{"x", DType::f32, {sp.end - sp.begin, 4}, bufs.back().data()}},
                       {{"slices", slices.dump()}});
    files.push_back(f);
  }
  checkpoint::CommitTracker tr;
  checkpoint::Manifest m;
  m.step = 1;
  for (int r = 0; r < 3; ++r) {
    checkpoint::ShardReport rep;
    rep.root = dir;
    rep.step = 1;
    rep.rank = r;
    rep.world = 3;
    rep.manifest_json = checkpoint::to_json(m).dump();
    const std::string name = "s" + std::to_string(r) + ".safetensors";
    fs::create_directories(dir + "/step_000001.tmp");
    fs::rename(files[size_t(r)], dir + "/step_000001.tmp/" + name);
    rep.files.push_back({name, fs::file_size(dir + "/step_000001.tmp/" + name),
                         checkpoint::file_xxh64(dir + "/step_000001.tmp/" + name)});
    auto ready = tr.add("job/0", rep);
    REQUIRE(ready.has_value() == (r == 2));
    if (ready) checkpoint::commit(ready->root, ready->manifest, 0);
  }
}

}  // namespace

TEST_CASE("checkpoint: spread splits replicated slices without overlap and read_slice reassembles them",
          "[checkpoint]") {
  // A (6, 4) tensor held whole by 3 replicas, and a column slice [1, 3) held by 2.
  std::vector<float> full(24);
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  const std::string dir = temp_dir("spread");
  three_replica_checkpoint(dir, full);
  checkpoint::TensorSource src(dir + "/step_000001");
  // Columns [1, 3) of every row: a split along dim 1 read from shards split along dim 0.
  checkpoint::SliceSpec want{{6, 4}, 1, {{1, 2, 0}}};
  std::vector<float> got(12);
  src.read_slice("x", want, got.data());
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 2; ++j) CHECK(got[size_t(i * 2 + j)] == full[size_t(i * 4 + 1 + j)]);
  // Only the wanted bytes were read.
  CHECK(src.bytes_read() == 12 * sizeof(float));
  Tensor whole = checkpoint::read_full(dir + "/step_000001", *src.manifest(), "x");
  for (size_t i = 0; i < full.size(); ++i) CHECK(whole.f32()[i] == full[i]);
  // A gap in the coverage is named.
  checkpoint::SliceSpec too_wide{{6, 8}, 1, {{0, 8, 0}}};
  std::vector<float> none(48);
  CHECK_THROWS_AS(src.read_slice("x", too_wide, none.data()), checkpoint::CheckpointError);
}

TEST_CASE("checkpoint: a reader that verifies on read checks the files it reads, and only those",
          "[checkpoint]") {
  std::vector<float> full(24);
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  const std::string dir = temp_dir("on_read");
  three_replica_checkpoint(dir, full);
  const std::string ck = dir + "/step_000001";
  // Shard s2 (rows 4 and 5) damaged in place: its size stays, a byte of its data changes.
  flip_last_byte(ck + "/s2.safetensors");
  CHECK_THROWS_WITH(checkpoint::TensorSource(ck),
                    Catch::Contains("s2.safetensors checksum") && Catch::Contains("(corrupt)"));
  checkpoint::TensorSource src(ck, checkpoint::Verify::on_read);
  CHECK(src.files_verified() == 0);
  // Rows [0, 2) are all in s0: one file checked, the wanted bytes right.
  std::vector<float> got(8);
  src.read_slice("x", {{6, 4}, 0, {{0, 2, 0}}}, got.data());
  CHECK(src.files_verified() == 1);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == full[i]);
  src.read_slice("x", {{6, 4}, 0, {{2, 2, 0}}}, got.data());
  CHECK(src.files_verified() == 2);
  // A read that needs s2 names it.
  CHECK_THROWS_WITH(src.read_slice("x", {{6, 4}, 0, {{4, 2, 0}}}, got.data()),
                    Catch::Contains("s2.safetensors checksum") && Catch::Contains("(corrupt)"));
  // What it checks without reading bytes still holds: a truncated file is refused at once.
  fs::resize_file(ck + "/s1.safetensors", 10);
  CHECK_THROWS_WITH(checkpoint::TensorSource(ck, checkpoint::Verify::on_read),
                    Catch::Contains("s1.safetensors has 10 bytes"));
}

TEST_CASE("checkpoint: verified checkpoints are checked again by their files' stats until one changes",
          "[checkpoint]") {
  std::vector<float> full(24);
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  const std::string dir = temp_dir("verified");
  three_replica_checkpoint(dir, full);
  const std::string ck = dir + "/step_000001";
  checkpoint::VerifiedCheckpoints v;
  CHECK_FALSE(v.known(ck));
  // Verified on its own thread: a later pick reads no bytes.
  v.verify_later(ck);
  v.drain();
  CHECK(v.verifications() == 1);
  CHECK(v.known(ck));
  CHECK(v.latest_valid(dir) == ck);
  v.check(ck);
  CHECK(v.verifications() == 1);
  // Rewritten in place with the same size: no longer known, and verified again (and refused).
  flip_last_byte(ck + "/s0.safetensors");
  CHECK_FALSE(v.known(ck));
  std::vector<std::string> skipped;
  CHECK_FALSE(v.latest_valid(dir, &skipped).has_value());
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].find("s0.safetensors checksum") != std::string::npos);
  // A file replaced by another (a new inode) is not the file verified either.
  const std::string other = temp_dir("verified_other");
  three_replica_checkpoint(other, full);
  const std::string ck2 = other + "/step_000001";
  v.check(ck2);
  CHECK(v.known(ck2));
  fs::copy_file(ck2 + "/s1.safetensors", ck2 + "/s1.copy");
  fs::rename(ck2 + "/s1.copy", ck2 + "/s1.safetensors");
  CHECK_FALSE(v.known(ck2));
  v.check(ck2);  // the same bytes: verified again, and passes
  CHECK(v.known(ck2));
}

TEST_CASE("checkpoint: BF16, F16 and F64 tensors read into f32, converted, and integers are refused",
          "[checkpoint][dtype]") {
  const std::string dir = temp_dir("dtypes");
  // (6, 4) with values that are not all exact in 16 bits: bf16 and f16 round them.
  std::vector<float> full(24);
  for (size_t i = 0; i < full.size(); ++i) full[i] = 0.1f * float(i) - 1.0f;
  for (DType dt : {DType::bf16, DType::f16, DType::f64}) {
    INFO(dtype_name(dt));
    std::vector<char> stored(full.size() * dtype_size(dt));
    convert(DType::f32, full.data(), dt, stored.data(), full.size());
    std::vector<float> want(full.size());
    convert(dt, stored.data(), DType::f32, want.data(), want.size());
    // Two shards of rows [0, 3) and [3, 6), as a dp = 2 spread writes them.
    std::vector<std::string> files;
    for (int r = 0; r < 2; ++r) {
      checkpoint::Spread sp = checkpoint::spread(checkpoint::whole({6, 4}), r, 2);
      nlohmann::json slices = {{"x", checkpoint::slice_json(sp.stored)}};
      files.push_back(dir + "/" + dtype_name(dt) + std::to_string(r) + ".safetensors");
      safetensors::write(files.back(),
                         {{"x", dt, {sp.end - sp.begin, 4}, stored.data() + sp.begin * 4 * dtype_size(dt)}},
                         {{"slices", slices.dump()}});
    }
    // One shard file is a TensorSource of its own: the rows it holds, of the global shape.
    checkpoint::TensorSource first(files[0]);
    checkpoint::SliceSpec rows{{6, 4}, 0, {{0, 3, 0}}};
    std::vector<float> got(12, -7.f);
    first.read_slice("x", rows, got.data());
    for (size_t i = 0; i < 12; ++i) CHECK(got[i] == want[i]);
    CHECK(first.bytes_read() == 12 * dtype_size(dt));  // the stored bytes, not the f32 ones
    // The whole tensor from a file of the whole tensor.
    const std::string whole_file = dir + "/" + dtype_name(dt) + "_whole.safetensors";
    safetensors::write(whole_file, {{"x", dt, {6, 4}, stored.data()}});
    checkpoint::TensorSource src(whole_file);
    std::vector<float> all(24);
    src.read("x", {6, 4}, all.data());
    CHECK(all == want);
    // Columns [1, 3): runs of two elements, each converted.
    checkpoint::SliceSpec cols{{6, 4}, 1, {{1, 2, 0}}};
    std::vector<float> c(12);
    src.read_slice("x", cols, c.data());
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 2; ++j) CHECK(c[size_t(i * 2 + j)] == want[size_t(i * 4 + 1 + j)]);
  }
  const std::vector<int32_t> ints(24);
  safetensors::write(dir + "/ints.safetensors", {{"x", DType::i32, {6, 4}, ints.data()}});
  CHECK_THROWS_WITH(checkpoint::TensorSource(dir + "/ints.safetensors"),
                    Catch::Contains("tensor x is I32") && Catch::Contains("floating-point"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: saved under one layout, resumed under another, continues the 1x1x1 losses",
          "[checkpoint][layouts]") {
  const JobSpec spec = spec_with();
  const std::vector<double> ref = run(spec, {}, "", kSteps);
  REQUIRE(ref.size() == size_t(kSteps));
  const std::vector<std::pair<Layout, Layout>> pairs = {{{2, 2, 2}, {1, 1, 1}}, {{1, 1, 1}, {2, 1, 2}},
                                                        {{2, 2, 1}, {1, 2, 2}}, {{1, 2, 2}, {2, 2, 1}},
                                                        {{4, 1, 1}, {1, 1, 2}}, {{1, 1, 2}, {2, 2, 2}}};
  for (const auto& [x, y] : pairs) {
    INFO("save under " << x.str() << ", resume under " << y.str());
    const std::string root = temp_dir("xy_" + x.str() + "_" + y.str());
    const std::vector<double> first = run(spec, x, "", 4, root);
    REQUIRE(checkpoint::verify(root + "/step_000004").dp == x.dp);
    const std::vector<double> second = run(spec, y, root, kSteps);
    REQUIRE(first.size() + second.size() == size_t(kSteps));
    for (size_t i = 0; i < first.size(); ++i) CHECK(std::abs(first[i] - ref[i]) < 1e-4);
    for (size_t i = 0; i < second.size(); ++i) CHECK(std::abs(second[i] - ref[4 + i]) < 1e-4);
    fs::remove_all(root);
  }
}

TEST_CASE("checkpoint: the same layout continues bit for bit, and replicas store each byte once",
          "[checkpoint][layouts]") {
  for (bool async : {true, false}) {
    const JobSpec spec = spec_with(async);
    for (Layout l : {Layout{1, 1, 1}, Layout{2, 2, 2}, Layout{4, 1, 1}}) {
      INFO("layout " << l.str() << " async " << async);
      const std::vector<double> ref = run(spec, l, "", kSteps);
      const std::string root = temp_dir("same");
      run(spec, l, "", 3, root);
      const std::vector<double> rest = run(spec, l, root, kSteps);
      REQUIRE(rest.size() == size_t(kSteps - 3));
      for (size_t i = 0; i < rest.size(); ++i) REQUIRE(rest[i] == ref[3 + i]);
      // Data-parallel replicas do not duplicate bytes: 4x1x1 stores what 1x1x1 stores.
      const checkpoint::Manifest m = checkpoint::verify(root + "/step_000003");
      uint64_t bytes = 0;
      for (const auto& f : m.files) bytes += f.size;
      if (l.dp == 4) {
        const std::string one = temp_dir("one");
        run(spec, {}, "", 3, one);
        uint64_t one_bytes = fs::file_size(one + "/step_000003/shard_r0.safetensors");
        CHECK(m.files.size() == 4);
        CHECK(bytes < one_bytes + 4 * 16384);  // the data is the same; only headers add up
        fs::remove_all(one);
      }
      fs::remove_all(root);
    }
  }
}

TEST_CASE("checkpoint: a flipped byte, a truncated file and a deleted file are named and skipped",
          "[checkpoint]") {
  const JobSpec spec = spec_with(false);
  JobSpec keep_all = spec;
  keep_all.checkpoint.keep = 0;
  const std::string root = temp_dir("damage");
  // Four checkpoints of one 2x1x1 run: steps 1..4.
  for (int64_t s = 1; s <= 4; ++s) run(keep_all, {2, 1, 1}, s == 1 ? "" : root, s, root);
  REQUIRE(checkpoint::list(root).size() == 4);
  const std::string f = "/shard_r1.safetensors";
  {  // step 4: one flipped byte in the middle of the data
    std::fstream io(root + "/step_000004" + f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(std::streamoff(fs::file_size(root + "/step_000004" + f) / 2));
    char c = 0;
    io.read(&c, 1);
    c = char(c ^ 0x10);
    io.seekp(std::streamoff(fs::file_size(root + "/step_000004" + f) / 2));
    io.write(&c, 1);
  }
  fs::resize_file(root + "/step_000003" + f, fs::file_size(root + "/step_000003" + f) - 100);  // truncated
  fs::remove(root + "/step_000002" + f);                                                       // deleted
  std::vector<std::string> skipped;
  auto good = checkpoint::latest_valid(root, &skipped);
  REQUIRE(good.has_value());
  CHECK(fs::path(*good).filename() == "step_000001");
  REQUIRE(skipped.size() == 3);
  CHECK(skipped[0].find("step_000004") != std::string::npos);
  CHECK(skipped[0].find("(corrupt)") != std::string::npos);
  CHECK(skipped[1].find("(truncated") != std::string::npos);
  CHECK(skipped[2].find("is missing") != std::string::npos);
  // Resuming from the root uses the newest good one (step 1) under another layout.
  const std::vector<double> ref = run(spec, {}, "", kSteps);
  const std::vector<double> rest = run(spec, {1, 2, 1}, root, kSteps);
  REQUIRE(rest.size() == size_t(kSteps - 1));
  for (size_t i = 0; i < rest.size(); ++i) CHECK(std::abs(rest[i] - ref[1 + i]) < 1e-4);
  // Naming a damaged checkpoint directly is refused with the named error.
  EngineAssignment a;
  a.resume_from = root + "/step_000004";
  CHECK_THROWS_AS(Engine(spec, a), checkpoint::CheckpointError);
  fs::remove_all(root);
}

TEST_CASE("checkpoint: a crash before commit leaves the previous checkpoint and leftovers are removed",
          "[checkpoint]") {
  const JobSpec spec = spec_with(false);
  const std::string root = temp_dir("leftover");
  run(spec, {2, 1, 1}, "", 2, root);
  // Rank 0 of step 4 wrote its shard and nobody committed (the others died): a .tmp directory.
  fs::create_directories(root + "/step_000004.tmp");
  std::ofstream(root + "/step_000004.tmp/shard_r0.safetensors") << "partial";
  REQUIRE(checkpoint::resolve(root) == root + "/step_000002");
  run(spec, {2, 1, 1}, root, 3, root);
  CHECK(checkpoint::list(root).size() == 2);
  run(spec, {2, 1, 1}, root, 5, root);
  // Step 5 committed; keep = 2 leaves steps 3 and 5; the stale .tmp of step 4 is gone.
  CHECK(checkpoint::list(root) == std::vector<std::string>{root + "/step_000005", root + "/step_000003"});
  CHECK_FALSE(fs::exists(root + "/step_000004.tmp"));
  CHECK(fs::read_symlink(root + "/latest") == "step_000005");
  fs::remove_all(root);
}

TEST_CASE("checkpoint: export writes full tensors that init_from and Python read back",
          "[checkpoint][export]") {
  const JobSpec spec = spec_with();
  const std::string root = temp_dir("export");
  run(spec, {2, 2, 2}, "", 3, root);
  const std::string out = root + "/model.safetensors";
  const size_t n = checkpoint::export_model(root + "/step_000003", out);
  CHECK(n == 4 * 12 + 4);  // 12 per block, wte, wpe, ln_f.weight, ln_f.bias
  safetensors::Reader r(out);
  for (const auto& name : r.names()) CHECK(name.rfind("optim.", 0) != 0);
  CHECK(r.info("h.0.attn.c_attn.weight").shape == Shape{96, 32});
  CHECK(r.info("wte.weight").shape == Shape{256, 32});
  // Every tensor equals the checkpoint's full tensor.
  const checkpoint::Manifest m = checkpoint::verify(root + "/step_000003");
  for (const auto& name : r.names()) {
    Tensor a = r.read(name), b = checkpoint::read_full(root + "/step_000003", m, name);
    REQUIRE(a.numel() == b.numel());
    REQUIRE(std::memcmp(a.data(), b.data(), size_t(a.numel()) * 4) == 0);
  }
  // init_from the exported file under 1x2x2 and save: the parameters are identical.
  JobSpec s2 = spec;
  s2.model.init_from = out;
  s2.train.seed = 77;  // another init: init_from must win
  const std::string root2 = temp_dir("export2");
  run(s2, {1, 2, 2}, "", 0, root2);
  const std::string again = root2 + "/again.safetensors";
  checkpoint::export_model(root2 + "/step_000000", again);
  CHECK(read_file(again).size() > 0);
  safetensors::Reader r2(again);
  REQUIRE(r2.names() == r.names());
  for (const auto& name : r.names()) {
    Tensor a = r.read(name), b = r2.read(name);
    REQUIRE(std::memcmp(a.data(), b.data(), size_t(a.numel()) * 4) == 0);
  }
  // An independent reader: Python's json + struct.
  const std::string py = std::string(TROUPE_SOURCE_DIR) + "/tests/checkpoint/read_safetensors.py";
  const testing::CommandResult py_run = testing::run_command("/usr/bin/python3 " + py + " " + out);
  const std::string& text = py_run.out;
  INFO(text);
  REQUIRE(py_run.code == 0);
  // The script prints "name shape sum" per tensor; check them against the C++ reader.
  for (const auto& name : r.names()) {
    Tensor t = r.read(name);
    double sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) sum += t.f32()[i];
    const std::string key = "\n" + name + " " + shape_str(t.shape()) + " ";
    auto at = text.find(key);
    REQUIRE(at != std::string::npos);
    const double py_sum = std::stod(text.substr(at + key.size()));
    CHECK(py_sum == Approx(sum).margin(1e-3));
  }
  CHECK(text.find("torch:") != std::string::npos);  // "torch: ok" or "torch: skipped (...)"
  CHECK(text.find("torch: MISMATCH") == std::string::npos);
  fs::remove_all(root);
  fs::remove_all(root2);
}

TEST_CASE("checkpoint: ranks without a committer meet at barriers and rank 0 commits", "[checkpoint]") {
  const JobSpec spec = spec_with(true);  // async is set aside on this path
  const std::vector<double> ref = run(spec, {}, "", kSteps);
  const std::string root = temp_dir("barrier");
  run(spec, {2, 1, 2}, "", 4, root, /*use_committer=*/false);
  const checkpoint::Manifest m = checkpoint::verify(root + "/step_000004");
  CHECK(m.files.size() == 4);
  const std::vector<double> rest = run(spec, {1, 2, 1}, root, kSteps, "", false);
  REQUIRE(rest.size() == size_t(kSteps - 4));
  for (size_t i = 0; i < rest.size(); ++i) CHECK(std::abs(rest[i] - ref[4 + i]) < 1e-4);
  fs::remove_all(root);
}
