// A local user with write access to a job's checkpoint folder: manifests nested a million
// levels deep, FIFOs where files belong, shard names and links that point outside, values out
// of range. `troupe ckpt verify|inspect` answers each with a named refusal and exit code 2,
// never hangs and never reads outside the checkpoint; a coordinator recovering the job skips
// each such checkpoint, says why, resumes from a real one and serves on throughout.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hf.hpp"
#include "core/tensor.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using namespace troupe::test;
using namespace std::chrono_literals;
using nlohmann::json;
using troupe::testing::CommandResult;
using troupe::testing::run_command;
namespace fs = std::filesystem;
namespace ck = troupe::checkpoint;

namespace {

// A committed checkpoint of one 4x4 tensor under root: what a job writes, in miniature.
std::string real_checkpoint(const std::string& root, int64_t step) {
  const std::string tmp = ck::prepare(root, step);
  Tensor t = Tensor::zeros({4, 4});
  for (int64_t i = 0; i < 16; ++i) t.f32()[i] = float(i) * 0.5f;
  ck::Manifest m;
  m.step = step;
  m.data_cursor = step;
  m.files = {ck::write_shard(tmp, "rank0.safetensors", {safetensors::entry("w", t)})};
  return ck::commit(root, m, 0);
}

json manifest_of(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  return json::parse(in);
}
void write_text(const std::string& path, const std::string& text) {
  fs::remove(path);
  std::ofstream(path, std::ios::binary) << text;
}
void write_manifest(const std::string& dir, const json& m) { write_text(dir + "/manifest.json", m.dump()); }

// The manifest with `value` (JSON text) in place of its "optimizer".
std::string with_optimizer(const std::string& dir, const std::string& value) {
  json m = manifest_of(dir);
  m["optimizer"] = "@@";
  std::string text = m.dump();
  text.replace(text.find("\"@@\""), 4, value);
  return text;
}

// A copy of a real checkpoint, to damage: root/step_<step>.
std::string copy_of(const std::string& real, const std::string& root, int64_t step) {
  const std::string dir = root + "/" + ck::step_dir_name(step);
  fs::create_directories(root);
  fs::copy(real, dir, fs::copy_options::recursive);
  return dir;
}

CommandResult ckpt(const std::string& what, const std::string& dir) {
  // `timeout`: a command that blocks on a FIFO fails the test (exit 124), it never stalls it.
  return troupe::testing::run_troupe("ckpt " + what + " " + dir, "timeout 120");
}

}  // namespace

TEST_CASE("hostile files: checkpoints troupe did not write are refused by ckpt verify and inspect, exit 2",
          "[security][checkpoint]") {
  const std::string top = troupe::testing::temp_dir("hostile_ckpt");
  const std::string real = real_checkpoint(top + "/real", 20);
  REQUIRE(ckpt("verify", real).code == 0);
  REQUIRE(ckpt("inspect", real).code == 0);
  int64_t step = 100;
  struct Case {
    std::string what, expect;
    std::string dir;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& what, const std::string& expect) -> std::string& {
    cases.push_back({what, expect, copy_of(real, top + "/" + std::to_string(step), step)});
    ++step;
    return cases.back().dir;
  };
  const json good = manifest_of(real);

  // 1. A value nested a million levels deep (the coordinator's stack overflow).
  {
    auto& d = add("a million levels", "JSON nested deeper than 64 levels");
    write_text(d + "/manifest.json",
               with_optimizer(d, std::string(1000000, '[') + std::string(1000000, ']')));
  }
  // 2. manifest.json a FIFO (blocked forever before), and a shard a FIFO.
  {
    auto& d = add("a FIFO manifest", "manifest.json: not a regular file");
    fs::remove(d + "/manifest.json");
    REQUIRE(::mkfifo((d + "/manifest.json").c_str(), 0600) == 0);
  }
  {
    auto& d = add("a FIFO shard", "file rank0.safetensors is refused");
    fs::remove(d + "/rank0.safetensors");
    REQUIRE(::mkfifo((d + "/rank0.safetensors").c_str(), 0600) == 0);
  }
  // 3. Reading outside: a name with "../" or an absolute path for a file with the right size
  // and checksum (a checksum oracle before), and a shard that is a link to such a file.
  const std::string outside = top + "/outside.bin";
  fs::copy_file(real + "/rank0.safetensors", outside);
  {
    auto& d = add("a name that leaves the directory",
                  "files[0].name is \"../../outside.bin\", not the name of a file");
    json m = good;
    m["files"][0]["name"] = "../../outside.bin";
    write_manifest(d, m);
  }
  {
    auto& d = add("an absolute name", "not the name of a file in the checkpoint directory");
    json m = good;
    m["files"][0]["name"] = outside;
    write_manifest(d, m);
  }
  {
    auto& d = add("a shard that is a link", "rank0.safetensors: is a symbolic link");
    fs::remove(d + "/rank0.safetensors");
    fs::create_symlink(outside, d + "/rank0.safetensors");
  }
  {
    auto& d = add("a manifest that is a link", "manifest.json: is a symbolic link");
    fs::rename(d + "/manifest.json", top + "/elsewhere.json");
    fs::create_symlink(top + "/elsewhere.json", d + "/manifest.json");
  }
  // 4. Values barely checked before, each named with the value read.
  auto edit = [&](const std::string& what, const std::string& expect, const std::function<void(json&)>& f) {
    auto& d = add(what, expect);
    json m = good;
    f(m);
    write_manifest(d, m);
  };
  edit("layout.data 2^40", "layout.data is 1099511627776, outside [1, 65536]",
       [](json& m) { m["layout"]["data"] = uint64_t(1) << 40; });
  edit("layout 0x0x0", "layout.data is 0, outside [1, 65536]", [](json& m) {
    m["layout"] = {{"data", 0}, {"pipeline", 0}, {"tensor", 0}};
  });
  edit("pipeline 5000", "layout.pipeline is 5000, outside [1, 4096]",
       [](json& m) { m["layout"]["pipeline"] = 5000; });
  edit("step -5", "step is -5, outside [0, ", [](json& m) { m["step"] = -5; });
  edit("files {}", "files is {}, not an array", [](json& m) { m["files"] = json::object(); });
  edit("files []", "files is empty", [](json& m) { m["files"] = json::array(); });
  edit("size 1e300", "files[0].size is 1e+300, not an integer",
       [](json& m) { m["files"][0]["size"] = 1e300; });
  edit("size -1", "files[0].size is -1, outside [0, ", [](json& m) { m["files"][0]["size"] = -1; });
  edit("size 2^64-1", "files[0].size is 18446744073709551615, outside",
       [](json& m) { m["files"][0]["size"] = UINT64_MAX; });
  edit("a checksum that is no checksum", "files[0].xxh64 is \"zz\", not 16 lowercase hex digits",
       [](json& m) { m["files"][0]["xxh64"] = "zz"; });
  edit("a name twice", "is listed twice", [](json& m) { m["files"].push_back(m["files"][0]); });
  edit("a seed that is negative", "rng.seed is -1", [](json& m) { m["rng"]["seed"] = -1; });
  {
    auto& d = add("a key twice", "the key \"step\" appears twice");
    std::string text = good.dump();
    text.insert(1, "\"step\": 3, ");
    write_text(d + "/manifest.json", text);
  }
  // 5. A manifest larger than any troupe writes: refused before it is parsed.
  {
    auto& d = add("a 70 MiB manifest", "a checkpoint manifest is at most 67108864 bytes");
    std::ofstream f(d + "/manifest.json", std::ios::binary | std::ios::trunc);
    f.seekp((70 << 20) - 1);
    f << ' ';
  }

  for (const auto& c : cases) {
    for (const char* what : {"verify", "inspect"}) {
      const CommandResult r = ckpt(what, c.dir);
      INFO(c.what << " (" << what << "): " << r.out);
      CHECK(r.code == 2);
      CHECK(r.out.find(c.expect) != std::string::npos);
    }
  }
  // 20 MB of '[' (1.7 GB and 6 s before): refused by its depth, in little memory.
  {
    auto& d = add("20 MB of [", "nested deeper");
    write_text(d + "/manifest.json", std::string(20 << 20, '['));
    const CommandResult r = ckpt("verify", d);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("JSON nested deeper than 64 levels") != std::string::npos);
    rusage ru{};
    REQUIRE(::getrusage(RUSAGE_CHILDREN, &ru) == 0);
    INFO("largest troupe ckpt so far: " << ru.ru_maxrss << " KiB");
    CHECK(ru.ru_maxrss < 256 * 1024);
  }
  // A root holding them all and the real one: verify names each, and exits 2.
  const std::string root = top + "/all";
  fs::create_directories(root);
  fs::copy(real, root + "/step_000020", fs::copy_options::recursive);
  const std::string deep = copy_of(real, root, 900);
  write_text(deep + "/manifest.json",
             with_optimizer(deep, std::string(100000, '[') + std::string(100000, ']')));
  const CommandResult all = ckpt("verify", root);
  INFO(all.out);
  CHECK(all.code == 2);
  CHECK(all.out.find("REFUSED  " + deep) != std::string::npos);
  CHECK(all.out.find("ok   " + root + "/step_000020") != std::string::npos);
  // inspect of the root takes the newest that verifies.
  const CommandResult newest = ckpt("inspect", root);
  INFO(newest.out);
  CHECK(newest.code == 0);
  CHECK(newest.out.find(root + "/step_000020") != std::string::npos);
  fs::remove_all(top);
}

TEST_CASE("hostile files: a Hugging Face config value past int64 is reported as read, not wrapped",
          "[security][checkpoint]") {
  ck::hf::ModelDims d;
  d.type = "gpt";
  d.vocab_size = 256;
  d.d_model = 64;
  d.n_layers = 2;
  d.n_heads = 4;
  d.ffn_hidden = 256;
  d.seq_len = 32;
  d.norm_eps = 1e-5;
  json config = {{"model_type", "gpt2"}, {"vocab_size", 256}, {"n_embd", UINT64_MAX},
                 {"n_layer", 2},         {"n_head", 4},       {"n_positions", 32}};
  try {
    ck::hf::check_config(config, d, "config.json");
    FAIL("the config was taken");
  } catch (const ck::CheckpointError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("n_embd is 18446744073709551615, out of range") != std::string::npos);
    CHECK(msg.find("-1") == std::string::npos);
  }
}

TEST_CASE("hostile files: a coordinator recovering from a checkpoint folder someone wrote into serves on",
          "[security][checkpoint][multiprocess]") {
  Cluster c;
  REQUIRE(c.ready());
  c.add_agent("cpu:1");
  REQUIRE(c.wait_devices(1));
  std::string spec = tiny_spec("planted", int(troupe::testing::kEndlessSteps));
  spec += "\ncheckpoint:\n  every: 5\n  keep: 1000\nfault:\n  max_restarts: 5\n";
  const std::string job = c.call({{"op", "submit"}, {"spec", spec}})["job"];
  REQUIRE(!job.empty());
  REQUIRE(c.wait_state(job, [](const json& s) { return s["state"] == "running" && s["steps_done"] > 6; }));
  const std::string root = std::string(c.status(job)["run_dir"]) + "/ckpt";
  REQUIRE(wait_until([&] { return fs::exists(root + "/step_000005/manifest.json"); }, 60s));
  const std::string real = root + "/step_000005";

  // Checkpoints "newer" than any the job wrote, each hostile in its own way.
  auto plant = [&](int64_t step) { return copy_of(real, root, step); };
  const std::string deep = plant(999999);
  write_text(deep + "/manifest.json",
             with_optimizer(deep, std::string(1000000, '[') + std::string(1000000, ']')));
  const std::string fifo = plant(999998);
  fs::remove(fifo + "/manifest.json");
  REQUIRE(::mkfifo((fifo + "/manifest.json").c_str(), 0600) == 0);
  const std::string link = plant(999997);
  fs::copy_file(real + "/" + manifest_of(real)["files"][0]["name"].get<std::string>(), c.dir() + "/copy.bin");
  fs::remove(link + "/" + manifest_of(real)["files"][0]["name"].get<std::string>());
  fs::create_symlink(c.dir() + "/copy.bin",
                     link + "/" + manifest_of(real)["files"][0]["name"].get<std::string>());
  const std::string wide = plant(999996);
  json m = manifest_of(real);
  m["layout"]["data"] = uint64_t(1) << 40;
  write_manifest(wide, m);

  // The job recovers: its worker dies, the coordinator looks for the newest valid checkpoint.
  const int worker = worker_pids(c.status(job))[0];
  REQUIRE(::kill(worker, SIGKILL) == 0);
  CHECK(c.wait_state(
      job, [](const json& s) { return s["state"] == "running" && s["generation"].get<int>() >= 1; }, 120s));
  // Served throughout, alive, and resumed from a checkpoint the job wrote.
  CHECK(process_alive(c.coordinator_pid()));
  CHECK(c.call({{"op", "list"}})["ok"] == true);
  const std::string events = read_file(std::string(c.status(job)["run_dir"]) + "/events.log");
  INFO(events);
  CHECK(events.find("JSON nested deeper than 64 levels") != std::string::npos);
  CHECK(events.find("manifest.json: not a regular file") != std::string::npos);
  CHECK(events.find("is a symbolic link") != std::string::npos);
  CHECK(events.find("layout.data is 1099511627776, outside [1, 65536]") != std::string::npos);
  const std::string resumed = c.status(job).value("resume_from", "");
  INFO("resumed from " << resumed);
  CHECK(resumed.find("step_9999") == std::string::npos);
  const int64_t at = c.status(job)["steps_done"];
  CHECK(c.wait_state(job, [&](const json& s) { return s["steps_done"].get<int64_t>() >= at + 5; }));
  c.call({{"op", "cancel"}, {"job", job}});
}
