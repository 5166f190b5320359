// The measured GEMM dispatch (kernels/cpu/gemm_dispatch.hpp), through fresh processes
// (gemm_choice_probe), since its choices are made once per process:
//
//  * the first process measures a shape and records the winner in the machine's file;
//    later processes follow the record (same backend, same bits), also one that names a
//    backend that is not the fastest;
//  * processes measuring one shape at once agree;
//  * a garbled, foreign, oversized or non-regular file is ignored (the product is still
//    right), TROUPE_GEMM_CACHE=off records nothing, forcing records nothing;
//  * TROUPE_MAX_CPU_ISA hides AVX-512, AVX512-BF16 and AMX: the fallbacks run, and are right.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_half.hpp"
#include "tests/support/support.hpp"

namespace fs = std::filesystem;
namespace k = troupe::kernels::cpu;
using troupe::testing::run_command;

namespace {

struct Probe {
  int code = -1;
  std::map<std::string, std::string> kv;
  std::string out;
};

// gemm_choice_probe <args> under `env` (VAR=value ...).
Probe probe(const std::string& env, const std::string& args) {
  const auto r =
      run_command("env " + env + " " + TROUPE_BINARY_DIR + "/tests/kernels/gemm_choice_probe " + args);
  Probe p;
  p.code = r.code;
  p.out = r.out;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line))
    if (auto eq = line.find('='); eq != std::string::npos) p.kv[line.substr(0, eq)] = line.substr(eq + 1);
  return p;
}

// The one gemm-*.txt file in dir, or "".
std::string cache_file(const std::string& dir) {
  if (!fs::exists(dir)) return "";
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("gemm-", 0) == 0) return e.path().string();
  return "";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void check_right(const Probe& p) {
  INFO(p.out);
  REQUIRE(p.code == 0);
  CHECK(std::stod(p.kv.at("max_rel_err")) < 1e-5);
}

const char* kShape = "bf16 NT 256 384 512";  // 100 MFLOP: measured

}  // namespace

TEST_CASE("gemm dispatch: the first process measures a shape, later ones follow its record",
          "[kernels][gemm]") {
  const std::string dir = troupe::testing::temp_dir("gemm_record");
  const std::string env = "TROUPE_GEMM_CACHE=" + dir;
  const Probe first = probe(env, kShape);
  check_right(first);
  CHECK(first.kv.at("how") == "measured");
  CHECK(std::stoi(first.kv.at("timings")) >= 1);
  const std::string file = cache_file(dir);
  REQUIRE(!file.empty());
  const std::string text = slurp(file);
  INFO(text);
  CHECK(text.rfind("troupe-gemm-choices-1 ", 0) == 0);
  CHECK(text.find("bf16 NT 256 384 512 " + first.kv.at("backend") + "\n") != std::string::npos);

  const Probe again = probe(env, kShape);
  check_right(again);
  CHECK(again.kv.at("how") == "recorded");
  CHECK(again.kv.at("backend") == first.kv.at("backend"));
  CHECK(again.kv.at("bits") == first.kv.at("bits"));

  // A record naming another backend (convert runs everywhere) is followed, not re-measured.
  std::string edited = text;
  const std::string line = "bf16 NT 256 384 512 " + first.kv.at("backend");
  edited.replace(edited.find(line), line.size(), "bf16 NT 256 384 512 convert");
  std::ofstream(file, std::ios::trunc) << edited;
  const Probe followed = probe(env, kShape);
  check_right(followed);
  CHECK(followed.kv.at("how") == "recorded");
  CHECK(followed.kv.at("backend") == "convert");

  // fp32 shapes are recorded beside the 16-bit ones.
  const Probe f32 = probe(env, "f32 TN 300 200 700");
  check_right(f32);
  CHECK(f32.kv.at("how") == "measured");
  CHECK(slurp(file).find("f32 TN 300 200 700 " + f32.kv.at("backend") + "\n") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("gemm dispatch: processes that measure one shape at once agree", "[kernels][gemm]") {
  const std::string dir = troupe::testing::temp_dir("gemm_race");
  std::string cmd;
  for (int i = 0; i < 4; ++i)
    cmd += "(env TROUPE_GEMM_CACHE=" + dir + " " + TROUPE_BINARY_DIR +
           "/tests/kernels/gemm_choice_probe f32 NN 320 320 320 > " + dir + "/out" + std::to_string(i) +
           ") & ";
  cmd += "wait";
  REQUIRE(run_command(cmd).code == 0);
  std::string backend, bits;
  for (int i = 0; i < 4; ++i) {
    const std::string out = slurp(dir + "/out" + std::to_string(i));
    INFO(out);
    const auto b = out.find("backend="), h = out.find("bits=");
    REQUIRE(b != std::string::npos);
    REQUIRE(h != std::string::npos);
    const std::string mine = out.substr(b, out.find('\n', b) - b),
                      mine_bits = out.substr(h, out.find('\n', h) - h);
    if (i == 0) {
      backend = mine;
      bits = mine_bits;
    }
    CHECK(mine == backend);
    CHECK(mine_bits == bits);
  }
  // One record for the shape, whoever measured first.
  const std::string text = slurp(cache_file(dir));
  CHECK(text.find("f32 NN 320 320 320 ") == text.rfind("f32 NN 320 320 320 "));
  fs::remove_all(dir);
}

TEST_CASE("gemm dispatch: a garbled, foreign, oversized or non-regular file is ignored", "[kernels][gemm]") {
  const std::string dir = troupe::testing::temp_dir("gemm_hostile");
  const std::string env = "TROUPE_GEMM_CACHE=" + dir;
  const Probe first = probe(env, kShape);
  check_right(first);
  const std::string file = cache_file(dir);
  REQUIRE(!file.empty());
  const std::string header = slurp(file).substr(0, slurp(file).find('\n') + 1);

  SECTION("garbled records after a good header") {
    std::ofstream(file, std::ios::trunc) << header << "bf16 NT 256 384 512\n"           // no backend
                                         << "bf16 NT 256 384 512 nosuchbackend\n"       // unknown
                                         << "bf16 XY 256 384 512 convert\n"             // bad transposes
                                         << "bf16 NT 99999999999999 384 512 convert\n"  // out of range
                                         << "bf16 NT -256 384 512 convert\n"            // negative
                                         << "bf16 NT 256 384 512 convert extra\n"       // trailing field
                                         << std::string(5000, '[') << "\n"
                                         << "\x01\x02\xff\xfe garbage\n";
    const Probe p = probe(env, kShape);
    check_right(p);
    CHECK(p.kv.at("how") == "measured");
  }
  SECTION("another machine's header") {
    std::ofstream(file, std::ios::trunc) << "troupe-gemm-choices-1 Some Other CPU|avx2|cap=\n"
                                         << "bf16 NT 256 384 512 convert\n";
    const Probe p = probe(env, kShape);
    check_right(p);
    CHECK(p.kv.at("how") == "measured");
    CHECK(slurp(file).rfind(header, 0) == 0);  // started over with this machine's header
  }
  SECTION("a file over the size bound") {
    std::ofstream out(file, std::ios::trunc);
    out << header;
    const std::string filler = "bf16 NT 1 1 1 convert\n";
    for (size_t n = header.size(); n < (1u << 20) + 100; n += filler.size()) out << filler;
    out << "bf16 NT 256 384 512 convert\n";
    out.close();
    const Probe p = probe(env, kShape);
    check_right(p);
    CHECK(p.kv.at("how") == "measured");
  }
  SECTION("a FIFO where the file should be: nothing blocks") {
    fs::remove(file);
    REQUIRE(::mkfifo(file.c_str(), 0600) == 0);
    const Probe p = probe(env, kShape);
    check_right(p);
    CHECK(p.kv.at("how") == "measured");
  }
  SECTION("a cache directory that is a file") {
    const std::string not_dir = dir + "/plainfile";
    std::ofstream(not_dir) << "x";
    const Probe p = probe("TROUPE_GEMM_CACHE=" + not_dir, kShape);
    check_right(p);
    CHECK(p.kv.at("how") == "measured");
  }
  fs::remove_all(dir);
}

TEST_CASE("gemm dispatch: TROUPE_GEMM_CACHE=off and forcing record nothing", "[kernels][gemm]") {
  const std::string dir = troupe::testing::temp_dir("gemm_off");
  for (int i = 0; i < 2; ++i) {
    const Probe p = probe("TROUPE_GEMM_CACHE=off HOME=" + dir + " XDG_CACHE_HOME=" + dir, kShape);
    check_right(p);
    CHECK(p.kv.at("how") == "measured");
  }
  CHECK(cache_file(dir + "/troupe").empty());
  const Probe forced = probe("TROUPE_GEMM_CACHE=" + dir + " TROUPE_GEMM_HALF=convert", kShape);
  check_right(forced);
  CHECK(forced.kv.at("backend") == "convert");
  CHECK(forced.kv.at("how") == "forced-or-small");
  const Probe forced32 = probe("TROUPE_GEMM_CACHE=" + dir + " TROUPE_GEMM=openblas", "f32 NN 300 300 300");
  check_right(forced32);
  CHECK(forced32.kv.at("backend") == "openblas");
  const std::string file = cache_file(dir);
  // (convert runs fp32 products, which are measured and recorded as f32 shapes.)
  CHECK((file.empty() || slurp(file).find("bf16 NT 256 384 512") == std::string::npos));
  // A product under ~2 MFLOP takes the static choice without a measurement.
  const Probe small = probe("TROUPE_GEMM_CACHE=" + dir, "f32 NN 16 16 16");
  check_right(small);
  CHECK(small.kv.at("how") == "forced-or-small");
  CHECK(small.kv.at("backend") == k::gemm_backend_name(k::gemm_default_backend()));
  fs::remove_all(dir);
}

TEST_CASE("gemm dispatch: TROUPE_MAX_CPU_ISA forces the fallbacks, and they are right", "[kernels][gemm]") {
  const std::string dir = troupe::testing::temp_dir("gemm_isa");
  const std::string cache = "TROUPE_GEMM_CACHE=" + dir + " ";
  SECTION("no AVX-512: OpenBLAS (or oneDNN's sgemm) and convert") {
    for (const char* shape : {"f32 NT 256 384 512", "f32 TN 256 384 512"}) {
      const Probe p = probe(cache + "TROUPE_MAX_CPU_ISA=avx2", shape);
      check_right(p);
      CHECK(p.kv.at("backend") != "avx512");
    }
    for (const char* shape : {"bf16 NT 256 384 512", "bf16 TN 129 257 65", "f16 NN 256 384 512"}) {
      const Probe p = probe(cache + "TROUPE_MAX_CPU_ISA=avx2", shape);
      check_right(p);
      CHECK(p.kv.at("backend") != "avx512bf16");
    }
    // Each forced backend, under the cap.
    check_right(probe(cache + "TROUPE_MAX_CPU_ISA=avx2 TROUPE_GEMM=openblas", "f32 NN 200 300 100"));
    check_right(probe(cache + "TROUPE_MAX_CPU_ISA=avx2 TROUPE_GEMM_HALF=convert", "bf16 NN 200 300 100"));
    const Probe refused = probe(cache + "TROUPE_MAX_CPU_ISA=avx2 TROUPE_GEMM=avx512", "f32 NN 200 300 100");
    CHECK(refused.code == 1);
    CHECK(refused.out.find("TROUPE_GEMM=avx512 is not available") != std::string::npos);
  }
  SECTION("no AVX512-BF16: the vdpbf16ps kernel is hidden") {
    const Probe p = probe(cache + "TROUPE_MAX_CPU_ISA=avx512", kShape);
    check_right(p);
    CHECK(p.kv.at("backend") != "avx512bf16");
    const Probe refused = probe(cache + "TROUPE_MAX_CPU_ISA=avx512 TROUPE_GEMM_HALF=avx512bf16", kShape);
    CHECK(refused.code == 1);
    CHECK(refused.out.find("not available for bf16") != std::string::npos);
  }
  SECTION("no AMX: everything else stays") {
    const Probe p = probe(cache + "TROUPE_MAX_CPU_ISA=avx512_bf16", kShape);
    check_right(p);
  }
  SECTION("an unknown level is refused by name") {
    const Probe p = probe(cache + "TROUPE_MAX_CPU_ISA=sse9", kShape);
    CHECK(p.code == 1);
    CHECK(p.out.find("TROUPE_MAX_CPU_ISA=sse9 is not one of avx2, avx512, avx512_bf16, all") !=
          std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("cpu features: the capped levels are nested and the model is named", "[kernels][gemm]") {
  const k::CpuFeatures& f = k::cpu_features();
  CHECK(!f.model.empty());
  CHECK((!f.avx512 || f.avx2));
  CHECK((!f.avx512_bf16 || f.avx512));
  CHECK((!f.amx_bf16 || f.avx512_bf16));
  CHECK(k::cpu_feature_list(f).size() > 0);
  // Every backend the dispatch may pick is one the features allow.
  CHECK(k::gemm_backend_available(k::GemmBackend::avx512) == f.avx512);
  CHECK(k::half_gemm_backend_available(k::HalfGemmBackend::avx512bf16, troupe::DType::bf16) == f.avx512_bf16);
  CHECK(!k::half_gemm_backend_available(k::HalfGemmBackend::avx512bf16, troupe::DType::f16));
}
