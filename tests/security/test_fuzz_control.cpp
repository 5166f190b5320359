// Seeded random traffic into the real coordinator actor and API server, in one
// process: every message type of the control plane with random fields (ill-formed
// UTF-8, huge strings, path tricks, negative and huge numbers), and random or
// mutated API requests. Nothing may throw out of a handler, the actor must
// answer afterwards, and every API reply must be a JSON object. setup.sh --test
// also runs this under AddressSanitizer and UndefinedBehaviorSanitizer.
//
// TROUPE_FUZZ_SEED=<n> replays one seed; TROUPE_FUZZ_ROUNDS=<n> sets the length.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <zmq.hpp>

#include "actors/protocol.hpp"
#include "actors/secret.hpp"
#include "actors/system.hpp"
#include "checkpoint/checkpoint.hpp"
#include "coordinator/api.hpp"
#include "coordinator/api_server.hpp"
#include "coordinator/coordinator_actor.hpp"
#include "core/text.hpp"
#include "tests/control/cluster.hpp"
#include "tests/support/support.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

uint64_t seed() {
  const char* s = std::getenv("TROUPE_FUZZ_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261201;
}
int rounds(int fallback) {
  const char* s = std::getenv("TROUPE_FUZZ_ROUNDS");
  return s ? std::atoi(s) : fallback;
}

struct Gen {
  std::mt19937_64 rng;
  std::vector<std::string> ids;  // real job ids, so that some messages reach deep
  explicit Gen(uint64_t s) : rng(s) {}
  uint64_t u(uint64_t n) { return n ? rng() % n : 0; }
  std::string bytes(size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  }
  std::string str() {
    switch (u(10)) {
      case 0:
        return "";
      case 1:
        return bytes(u(16));
      case 2:
        return std::string(70000 + u(1000), 'x');
      case 3:
        return "../../../../etc/passwd";
      case 4:
        return "evil\xff";
      case 5:
        return "\xed\xa0\x80";
      case 6:
        return ids.empty() ? "job" : ids[u(ids.size())];
      case 7:
        return "cpu:" + std::to_string(u(4));
      case 8:
        return "/tmp";
      default:
        return "w" + std::to_string(u(100));
    }
  }
  int32_t i32() {
    switch (u(5)) {
      case 0:
        return -1;
      case 1:
        return static_cast<int32_t>(rng());
      case 2:
        return std::numeric_limits<int32_t>::max();
      default:
        return static_cast<int32_t>(u(4));
    }
  }
  int64_t i64() { return u(3) == 0 ? static_cast<int64_t>(rng()) : static_cast<int64_t>(u(50)); }
  double real() {
    switch (u(5)) {
      case 0:
        return std::numeric_limits<double>::quiet_NaN();
      case 1:
        return std::numeric_limits<double>::infinity();
      case 2:
        return -1e308;
      default:
        return static_cast<double>(u(1000)) / 7.0;
    }
  }
  json value(int depth = 0) {
    switch (u(depth > 2 ? 5 : 7)) {
      case 0:
        return nullptr;
      case 1:
        return static_cast<int64_t>(rng());
      case 2:
        return real() == real() ? json(real()) : json(1.5);
      case 3:
        return str();
      case 4:
        return u(2) == 1;
      case 5: {
        json a = json::array();
        for (size_t i = u(4); i > 0; --i) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (size_t i = u(4); i > 0; --i) o[sanitize_utf8(str(), 64)] = value(depth + 1);
        return o;
      }
    }
  }
  // JSON texts that attacked the readers: nesting a million deep, a bomb of empty containers,
  // a key many times, numbers past every range, and one of Gen's values.
  std::string hostile_json() {
    switch (u(7)) {
      case 0:
        return std::string(1 + u(1000000), '[') + std::string(u(2) ? 0 : 1000000, ']');
      case 1: {
        std::string t = "{\"op\":\"list\",\"x\":";
        for (size_t i = u(200000); i > 0; --i) t += "{\"a\":";
        return t;
      }
      case 2: {
        std::string t = "[";
        for (size_t i = 100000 + u(100000); i > 0; --i) t += i > 1 ? "{}," : "{}]";
        return t;
      }
      case 3: {
        std::string t = "{";
        for (size_t i = 1 + u(50000); i > 0; --i) t += "\"k\":1,";
        return t + "\"op\":\"list\"}";
      }
      case 4:
        return R"({"op":"scale","job":"x","devices":1e999})";
      case 5:
        return R"({"op":"status","job":18446744073709551616})";
      default:
        return json_text(value());
    }
  }
  json request() {
    static const char* ops[] = {"submit", "status", "list", "cancel", "scale", "info", "nope"};
    json r = {{"op", ops[u(7)]}};
    if (u(2)) r["job"] = u(3) ? json(str()) : value();
    if (u(3) == 0) r["devices"] = value();
    if (u(3) == 0) r["spec"] = u(2) ? json(test::tiny_spec("fuzz", 1 + static_cast<int>(u(5)))) : value();
    if (u(4) == 0) r["resume"] = value();
    return r;
  }
};

}  // namespace

TEST_CASE("fuzz: every control-plane message type with random fields, the coordinator answers on",
          "[security][fuzz]") {
  const std::string dir = troupe::testing::temp_dir("fuzz_control");
  const uint64_t s = seed();
  INFO("seed " << s << " (replay with TROUPE_FUZZ_SEED=" << s << ")");
  Gen g(s);
  EphemeralSecret secret;
  NodeConfig cfg(secret.path());
  caf::actor_system sys{cfg};
  coord::CoordinatorActorOptions opt;
  opt.runs_dir = dir + "/runs";
  opt.kill_grace = 10ms;
  auto c = coord::spawn_coordinator(sys, opt);
  caf::scoped_actor self{sys};
  auto api = [&](const std::string& text) {
    std::string out;
    self->request(c, 10s, api_atom::value, text)
        .receive([&](std::string& r) { out = std::move(r); }, [&](caf::error&) {});
    return out;
  };
  // Devices and jobs for the messages to reach: an agent (this scoped actor), and a few jobs.
  self->request(c, 10s, reg_agent_atom::value, AgentHello{kProtocolVersion, "fuzz", 1, {"cpu:0", "cpu:1"}})
      .receive([](const Welcome&) {}, [](caf::error&) {});
  for (int i = 0; i < 3; ++i) {
    auto r = json::parse(api(json{{"op", "submit"}, {"spec", test::tiny_spec("fuzz", 5)}}.dump()));
    if (r.value("ok", false)) g.ids.push_back(r["job"]);
  }
  REQUIRE(!g.ids.empty());

  int answered = 0;
  const int n = rounds(5000);
  for (int i = 0; i < n; ++i) {
    auto done = [&](auto&&...) { ++answered; };
    auto failed = [&](caf::error&) { ++answered; };
    switch (g.u(11)) {
      case 0:
        self->request(c, 5s, reg_agent_atom::value,
                      AgentHello{g.u(4) ? kProtocolVersion : g.i32(), g.str(), g.i32(),
                                 std::vector<std::string>(g.u(4), g.str())})
            .receive([&](const Welcome&) { ++answered; }, failed);
        break;
      case 1:
        self->request(c, 5s, reg_worker_atom::value,
                      WorkerHello{kProtocolVersion, g.str(), g.i32(), g.i32(), g.i32(), g.str(), g.str()})
            .receive([&](const Assignment&) { ++answered; }, failed);
        break;
      case 2:
        if (g.u(2))
          self->send(c, worker_exit_atom::value,
                     WorkerExit{g.str(), g.i32(), g.i32(), g.i32(), g.i32(), g.i32()});
        else
          self->send(c, worker_stop_atom::value,
                     WorkerStopped{g.str(), g.i32(), g.i32(), g.i32(), g.i32(), g.i32()});
        break;
      case 3: {
        auto step = [&] {
          return StepMetrics{g.str(),  g.i32(),  g.i32(),  g.i64(),     g.real(), g.real(),
                             g.i64(),  g.real(), g.real(), g.u(2) == 1, g.real(), g.real(),
                             g.real(), g.real(), g.real(), g.u(2) == 1, g.i64(),  g.i64()};
        };
        if (g.u(2)) {
          self->send(c, step_atom::value, step());
        } else {  // a host's batch, of any size (past kMaxStepBatch too)
          std::vector<StepMetrics> batch;
          for (size_t k = g.u(4) == 0 ? kMaxStepBatch + 1 + g.u(8) : g.u(8); k > 0; --k)
            batch.push_back(step());
          self->send(c, steps_atom::value, batch);
        }
        break;
      }
      case 4:
        self->request(c, 5s, worker_done_atom::value,
                      WorkerResult{g.str(), g.i32(), g.i32(), g.u(2) == 1, g.str(), g.str(), g.u(2) == 1,
                                   g.u(2) == 1, std::vector<int64_t>(g.u(4), g.i64()), g.u(2) == 1,
                                   std::vector<int64_t>(g.u(4), g.i64()), g.i32()})
            .receive([&](bool) { ++answered; }, failed);
        break;
      case 5: {
        CkptShard m{g.str(), g.i32(), g.i32(), g.i32(),
                    g.i64(), g.str(), g.i32(), g.u(3) == 0 ? g.hostile_json() : g.str(),
                    {}};
        for (size_t k = g.u(3); k > 0; --k) m.files.push_back({g.str(), g.rng(), g.str()});
        self->request(c, 5s, ckpt_shard_atom::value, m)
            .receive([&](const CkptCommitted&) { ++answered; }, failed);
        break;
      }
      case 6:
        self->request(c, 5s, store_set_atom::value, StoreKey{g.str(), g.i32(), g.str(), g.str()}, g.str())
            .receive([&](const StoreValue&) { ++answered; }, failed);
        break;
      case 7:
        self->request(c, 5s, store_add_atom::value, StoreKey{g.str(), g.i32(), g.str(), g.str()}, g.i64())
            .receive([&](const StoreValue&) { ++answered; }, failed);
        break;
      case 8:
        self->request(c, 5s, store_get_atom::value, StoreKey{g.str(), g.i32(), g.str(), g.str()},
                      static_cast<int64_t>(g.u(3)) - 1)
            .receive([&](const StoreValue&) { ++answered; }, failed);
        break;
      case 9: {
        const auto pick = g.u(4);
        std::string text = pick == 0   ? g.bytes(g.u(64))
                           : pick == 1 ? g.hostile_json()
                                       : json_text(g.request());
        auto reply = json::parse(api(text), nullptr, false);
        CHECK(reply.is_object());
        ++answered;
        break;
      }
      default:
        self->send(c, lost_atom::value, g.str(), g.i32(), g.i32());
        break;
    }
    (void)done;
  }
  // Still alive, still answering, its views still JSON.
  auto list = json::parse(api(R"({"op":"list"})"), nullptr, false);
  REQUIRE(list.is_object());
  CHECK(list["ok"] == true);
  for (const auto& id : g.ids)
    CHECK(json::parse(api(json{{"op", "status"}, {"job", id}}.dump()))["ok"] == true);
  CHECK(answered > 0);
  caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  std::filesystem::remove_all(dir);
}

TEST_CASE("fuzz: the ZeroMQ API answers random and mutated requests with a JSON object each",
          "[security][fuzz][api]") {
  const uint64_t s = seed() + 1;
  INFO("seed " << s);
  Gen g(s);
  coord::CoordinatorState state(troupe::testing::temp_dir("fuzz_api") + "/runs", kProtocolVersion);
  std::mutex mu;
  coord::ApiOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.token = "tok";
  coord::ApiServer server(o, [&](const std::string& text) {
    // As the coordinator actor answers (coordinator_actor.cpp), on the pure state.
    std::lock_guard<std::mutex> lock(mu);
    coord::Actions ignored;
    return json_text(coord::handle_api_request(state, json::parse(text), &ignored));
  });
  zmq::context_t ctx;
  zmq::socket_t sock(ctx, zmq::socket_type::req);
  sock.set(zmq::sockopt::rcvtimeo, 10000);
  sock.set(zmq::sockopt::linger, 0);
  sock.connect(server.endpoint());
  const int n = rounds(5000);
  for (int i = 0; i < n; ++i) {
    json r = g.request();
    if (g.u(3)) r["token"] = g.u(4) ? json("tok") : g.value();
    std::string text = json_text(r);
    switch (g.u(5)) {
      case 0:
        text = g.bytes(g.u(200));
        break;
      case 3:
        text = g.hostile_json();
        break;
      case 1:
        for (size_t k = g.u(4) + 1; k > 0 && !text.empty(); --k)
          text[g.u(text.size())] = static_cast<char>(g.rng());
        break;
      case 2:
        text = text.substr(0, g.u(text.size() + 1));
        break;
      default:
        break;
    }
    sock.send(zmq::buffer(text), zmq::send_flags::none);
    zmq::message_t m;
    REQUIRE(sock.recv(m));
    auto reply = json::parse(m.to_string(), nullptr, false);
    INFO("request " << i << ": " << json(sanitize_utf8(text, 300)).dump());
    REQUIRE(reply.is_object());
    CHECK(reply.contains("ok"));
  }
  sock.send(zmq::buffer(std::string(R"({"op":"info","token":"tok"})")), zmq::send_flags::none);
  zmq::message_t m;
  REQUIRE(sock.recv(m));
  CHECK(json::parse(m.to_string())["ok"] == true);
  server.stop();
}

TEST_CASE("fuzz: checkpoint manifests, mutated and hostile, are read or refused with a CheckpointError",
          "[security][fuzz][checkpoint]") {
  const uint64_t s = seed() + 2;
  INFO("seed " << s);
  Gen g(s);
  const std::string dir = troupe::testing::temp_dir("fuzz_manifest");
  // A real checkpoint to start from.
  const std::string tmp = checkpoint::prepare(dir + "/root", 7);
  Tensor t = Tensor::zeros({3, 5});
  checkpoint::Manifest m;
  m.step = 7;
  m.data_cursor = 7;
  m.files = {checkpoint::write_shard(tmp, "rank0.safetensors", {safetensors::entry("w", t)})};
  const std::string real = checkpoint::commit(dir + "/root", m, 0);
  const std::string good = checkpoint::to_json(m).dump();
  std::filesystem::copy_file(real + "/rank0.safetensors", dir + "/outside.bin");
  const std::string victim = dir + "/victim";
  std::filesystem::create_directories(victim);
  std::filesystem::copy_file(real + "/rank0.safetensors", victim + "/rank0.safetensors");
  int accepted = 0, refused = 0;
  const int n = rounds(3000);
  for (int i = 0; i < n; ++i) {
    std::string text;
    switch (g.u(6)) {
      case 0:
        text = g.hostile_json();
        break;
      case 1: {  // a field replaced by any value
        json j = json::parse(good);
        static const char* keys[] = {"step",           "data_cursor", "layout",     "rng",  "files",
                                     "format_version", "optimizer",   "loss_scale", "spec", "format"};
        j[keys[g.u(10)]] = g.value();
        text = j.dump(-1, ' ', false, json::error_handler_t::replace);
        break;
      }
      case 2: {  // a file entry replaced or renamed
        json j = json::parse(good);
        static const char* names[] = {"../outside.bin", "/etc/passwd",      "a/b", "..", ".", "",
                                      "manifest.json",  "rank0.safetensors"};
        if (g.u(2))
          j["files"][0]["name"] = names[g.u(8)];
        else
          j["files"][0][g.u(2) ? "size" : "xxh64"] = g.value();
        text = j.dump(-1, ' ', false, json::error_handler_t::replace);
        break;
      }
      default: {  // bytes flipped, cut or repeated
        text = good;
        for (size_t k = 1 + g.u(4); k > 0 && !text.empty(); --k) {
          const size_t at = g.u(text.size());
          switch (g.u(3)) {
            case 0:
              text[at] = static_cast<char>(g.rng());
              break;
            case 1:
              text = text.substr(0, at);
              break;
            default:
              text.insert(at, std::string(1 + g.u(64), "[{\",:1"[g.u(6)]));
          }
        }
      }
    }
    std::ofstream(victim + "/manifest.json", std::ios::binary | std::ios::trunc) << text;
    try {
      checkpoint::verify(victim);
      ++accepted;
    } catch (const checkpoint::CheckpointError&) {
      ++refused;
    } catch (const std::exception& e) {
      INFO("manifest " << i << ": " << sanitize_utf8(text, 300));
      FAIL("verify threw something other than CheckpointError: " << e.what());
    }
  }
  CHECK(refused > 0);
  CHECK(accepted + refused == n);
  // Files that are not regular files: a FIFO manifest or shard, a shard that links outside.
  std::ofstream(victim + "/manifest.json", std::ios::binary | std::ios::trunc) << good;
  CHECK_NOTHROW(checkpoint::verify(victim));
  std::filesystem::remove(victim + "/rank0.safetensors");
  std::filesystem::create_symlink(dir + "/outside.bin", victim + "/rank0.safetensors");
  CHECK_THROWS_AS(checkpoint::verify(victim), checkpoint::RefusedCheckpoint);
  std::filesystem::remove(victim + "/rank0.safetensors");
  REQUIRE(::mkfifo((victim + "/rank0.safetensors").c_str(), 0600) == 0);
  CHECK_THROWS_AS(checkpoint::verify(victim), checkpoint::RefusedCheckpoint);
  std::filesystem::remove(victim + "/manifest.json");
  REQUIRE(::mkfifo((victim + "/manifest.json").c_str(), 0600) == 0);
  CHECK_THROWS_AS(checkpoint::verify(victim), checkpoint::RefusedCheckpoint);
  std::filesystem::remove_all(dir);
}
