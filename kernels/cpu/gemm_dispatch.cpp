// The measured GEMM dispatch (contract: gemm_dispatch.hpp).
//
//   gemm_dispatch(shape)
//     forced by TROUPE_GEMM / TROUPE_GEMM_HALF, or a small product -> the static choice
//     this thread has seen it                  -> that (no lock)
//     the process has it (or the file had it)  -> that
//     else: measure every candidate (no lock held: measuring convert runs fp32 products,
//           which may measure their own shapes), then under the file's lock adopt a record
//           another process wrote meanwhile, or append ours.
#include "kernels/cpu/gemm_dispatch.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <unordered_map>

#include "core/dtype_convert.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_backends.hpp"
#include "kernels/cpu/gemm_half.hpp"

#ifdef TROUPE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

namespace troupe::kernels::cpu {
namespace {

constexpr double kMinMeasuredFlops = double(1 << 21);  // below: the static choice
constexpr double kMaxTrialFlops = 2.5e8;               // a measured run is capped at this
constexpr int kTimedRuns = 3;
constexpr size_t kMaxFileBytes = 1 << 20;
constexpr const char* kMagic = "troupe-gemm-choices-1";

struct Key {
  int dt, ta, tb, M, N, K;
  bool operator==(const Key& o) const {
    return dt == o.dt && ta == o.ta && tb == o.tb && M == o.M && N == o.N && K == o.K;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int v : {k.dt, k.ta, k.tb, k.M, k.N, k.K}) h = (h ^ static_cast<unsigned>(v)) * 1099511628211ull;
    return h;
  }
};

// ---------------------------------------------------------------- backends by dtype

std::vector<int> candidates(DType dt) {
  std::vector<int> out;
  if (dt == DType::f32) {
    for (GemmBackend b : {GemmBackend::avx512, GemmBackend::dnnl, GemmBackend::openblas})
      if (gemm_backend_available(b)) out.push_back(static_cast<int>(b));
  } else {
    for (HalfGemmBackend b : {HalfGemmBackend::onednn, HalfGemmBackend::avx512bf16, HalfGemmBackend::convert})
      if (half_gemm_backend_available(b, dt)) out.push_back(static_cast<int>(b));
  }
  return out;
}

const char* name_of(DType dt, int b) {
  return dt == DType::f32 ? gemm_backend_name(static_cast<GemmBackend>(b))
                          : half_gemm_backend_name(static_cast<HalfGemmBackend>(b));
}

int backend_named(DType dt, const std::string& name) {
  for (int b : candidates(dt))
    if (name == name_of(dt, b)) return b;
  return -1;
}

int static_choice(DType dt) {
  return dt == DType::f32 ? static_cast<int>(gemm_default_backend())
                          : static_cast<int>(half_gemm_default_backend(dt));
}

// TROUPE_GEMM / TROUPE_GEMM_HALF set: read once (this is on every product's path).
bool forced(DType dt) {
  static const bool f32 = [] {
    const char* env = std::getenv("TROUPE_GEMM");
    return env != nullptr && *env != '\0';
  }();
  static const bool half = [] {
    const char* env = std::getenv("TROUPE_GEMM_HALF");
    return env != nullptr && *env != '\0';
  }();
  return dt == DType::f32 ? f32 : half;
}

const char* dt_tag(DType dt) { return dt == DType::f32 ? "f32" : dt == DType::bf16 ? "bf16" : "f16"; }

// ---------------------------------------------------------------- measuring

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The shape actually timed: the largest dimension halved (down to 256) until one run is at
// most kMaxTrialFlops.
void cap_shape(int& M, int& N, int& K) {
  while (2.0 * M * N * K > kMaxTrialFlops) {
    int* largest = &M;
    if (N > *largest) largest = &N;
    if (K > *largest) largest = &K;
    if (*largest <= 256) break;
    *largest = (*largest + 1) / 2;
  }
}

std::vector<GemmTiming> measure(DType dt, bool ta, bool tb, int M0, int N0, int K0) {
  int M = M0, N = N0, K = K0;
  cap_shape(M, N, K);
  const std::vector<int> cands = candidates(dt);
  const size_t na = size_t(M) * K, nb = size_t(K) * N;
  std::vector<float> af(na), bf(nb), c(size_t(M) * N);
  std::mt19937 gen(12345);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (float& x : af) x = d(gen);
  for (float& x : bf) x = d(gen);
  std::vector<uint16_t> ah, bh;
  if (dt != DType::f32) {
    ah.resize(na);
    bh.resize(nb);
    to_half(dt, ah.data(), af.data(), na);
    to_half(dt, bh.data(), bf.data(), nb);
  }
  const int lda = ta ? M : K, ldb = tb ? K : N;
  auto run = [&](int b) {
    if (dt == DType::f32)
      gemm_with(static_cast<GemmBackend>(b), ta, tb, M, N, K, 1.0f, af.data(), lda, bf.data(), ldb, 0.0f,
                c.data(), N);
    else
      gemm_half_with(static_cast<HalfGemmBackend>(b), dt, ta, tb, M, N, K, ah.data(), lda, bh.data(), ldb,
                     0.0f, c.data(), N);
  };
  std::vector<double> best(cands.size(), 1e30);
  for (size_t i = 0; i < cands.size(); ++i) run(cands[i]);  // warm-up: packing buffers, primitives
  for (int r = 0; r < kTimedRuns; ++r)
    for (size_t i = 0; i < cands.size(); ++i) {
      const double t0 = thread_seconds();
      run(cands[i]);
      best[i] = std::min(best[i], std::max(thread_seconds() - t0, 1e-9));
    }
  std::vector<GemmTiming> out;
  for (size_t i = 0; i < cands.size(); ++i)
    out.push_back({name_of(dt, cands[i]), best[i], 2.0 * M * N * K / best[i] * 1e-9});
  return out;
}

// ---------------------------------------------------------------- the machine's file

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// What a choice depends on beyond the shape.
std::string machine_header() {
  const CpuFeatures& f = cpu_features();
  std::string h = f.model + "|" + cpu_feature_list(f) + "|cap=" + f.cap +
                  "|OPENBLAS_CORETYPE=" + env_or("OPENBLAS_CORETYPE", "") +
                  "|ONEDNN_MAX_CPU_ISA=" + env_or("ONEDNN_MAX_CPU_ISA", "") + "," +
                  env_or("DNNL_MAX_CPU_ISA", "");
#ifdef TROUPE_HAVE_DNNL
  const dnnl_version_t* v = dnnl_version();
  h +=
      "|onednn=" + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#endif
  h += "|build=" __DATE__;
  for (char& ch : h)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return h;
}

std::string cache_dir() {
  const std::string env = env_or("TROUPE_GEMM_CACHE", "");
  if (env == "off") return "";
  if (!env.empty()) return env;
  const std::string xdg = env_or("XDG_CACHE_HOME", "");
  if (!xdg.empty()) return xdg + "/troupe";
  const std::string home = env_or("HOME", "");
  if (!home.empty()) return home + "/.cache/troupe";
  return "";
}

// mkdir -p for the cache directory (0700 for directories this creates).
bool make_dirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string file_path() {
  static const std::string path = [] {
    const std::string dir = cache_dir();
    if (dir.empty() || !make_dirs(dir)) return std::string();
    const std::string header = machine_header();
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : header) h = (h ^ ch) * 1099511628211ull;
    char name[40];
    std::snprintf(name, sizeof name, "/gemm-%016llx.txt", static_cast<unsigned long long>(h));
    return dir + name;
  }();
  return path;
}

// Records of `text` (the file's content) that this process can use, by key.
std::unordered_map<Key, int, KeyHash> parse_records(const std::string& text) {
  std::unordered_map<Key, int, KeyHash> out;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != std::string(kMagic) + " " + machine_header()) return out;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string dt, tr, backend, extra;
    long M = 0, N = 0, K = 0;
    if (!(ls >> dt >> tr >> M >> N >> K >> backend) || (ls >> extra)) continue;
    const DType t = dt == "f32"    ? DType::f32
                    : dt == "bf16" ? DType::bf16
                    : dt == "f16"  ? DType::f16
                                   : DType::u8;
    if (t == DType::u8 || tr.size() != 2 || (tr[0] != 'N' && tr[0] != 'T') || (tr[1] != 'N' && tr[1] != 'T'))
      continue;
    if (M < 1 || N < 1 || K < 1 || M > (1 << 30) || N > (1 << 30) || K > (1 << 30)) continue;
    const int b = backend_named(t, backend);
    if (b < 0) continue;
    out.emplace(Key{static_cast<int>(t), tr[0] == 'T', tr[1] == 'T', int(M), int(N), int(K)},
                b);  // first wins
  }
  return out;
}

// The file's text through an open descriptor, "" when it is too large or unreadable.
std::string read_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size_t(st.st_size) > kMaxFileBytes) return "";
  std::string text(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + got, text.size() - got, off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  text.resize(got);
  return text;
}

int open_file() {
  const std::string& path = file_path();
  if (path.empty()) return -1;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

// Under the file's lock: the record another process made for `key`, or ours appended.
// Returns the backend to use; `*recorded` says whether it came from the file.
int settle_with_file(const Key& key, int measured, bool* recorded) {
  *recorded = false;
  const int fd = open_file();
  if (fd < 0) return measured;
  int chosen = measured;
  if (::flock(fd, LOCK_EX) == 0) {
    const std::string text = read_fd(fd);
    const auto records = parse_records(text);
    if (auto it = records.find(key); it != records.end()) {
      chosen = it->second;
      *recorded = true;
    } else if (text.size() < kMaxFileBytes) {
      const DType dt = static_cast<DType>(key.dt);
      std::string line;
      const std::string header = std::string(kMagic) + " " + machine_header() + "\n";
      if (text.compare(0, header.size(), header) != 0) {
        // A new file, or one that is not ours (truncated, garbled): it starts over.
        if (::ftruncate(fd, 0) != 0) {
          ::flock(fd, LOCK_UN);
          ::close(fd);
          return measured;
        }
        line = header;
      }
      line += std::string(dt_tag(dt)) + " " + (key.ta ? "T" : "N") + (key.tb ? "T" : "N") + " " +
              std::to_string(key.M) + " " + std::to_string(key.N) + " " + std::to_string(key.K) + " " +
              name_of(dt, measured) + "\n";
      ::lseek(fd, 0, SEEK_END);
      write_all(fd, line);
    }
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return chosen;
}

// ---------------------------------------------------------------- the process's choices

struct Registry {
  std::mutex mu;
  bool loaded = false;
  std::unordered_map<Key, int, KeyHash> recorded;  // the file's records, read once
  std::unordered_map<Key, int, KeyHash> chosen;
  std::vector<GemmChoice> log;
};

Registry& registry() {
  static Registry* r = new Registry;  // used from any thread until exit
  return *r;
}

GemmChoice make_choice(const Key& k, int backend, const char* how, std::vector<GemmTiming> timings = {}) {
  const DType dt = static_cast<DType>(k.dt);
  return {dt, k.ta != 0, k.tb != 0, k.M, k.N, k.K, name_of(dt, backend), how, std::move(timings)};
}

int choose(const Key& k) {
  const DType dt = static_cast<DType>(k.dt);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (auto it = r.chosen.find(k); it != r.chosen.end()) return it->second;
    if (!r.loaded) {
      r.loaded = true;
      const int fd = open_file();
      if (fd >= 0) {
        if (::flock(fd, LOCK_SH) == 0) {
          r.recorded = parse_records(read_fd(fd));
          ::flock(fd, LOCK_UN);
        }
        ::close(fd);
      }
    }
    if (auto it = r.recorded.find(k); it != r.recorded.end()) {
      r.chosen.emplace(k, it->second);
      r.log.push_back(make_choice(k, it->second, "recorded"));
      spdlog::info("gemm {}", describe(r.log.back()));
      return it->second;
    }
  }
  std::vector<GemmTiming> t = measure(dt, k.ta, k.tb, k.M, k.N, k.K);
  size_t fastest = 0;
  for (size_t i = 1; i < t.size(); ++i)
    if (t[i].seconds < t[fastest].seconds) fastest = i;
  bool from_file = false;
  const int b = settle_with_file(k, backend_named(dt, t[fastest].backend), &from_file);
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, fresh] = r.chosen.emplace(k, b);  // another thread of ours may have settled first
  if (fresh) {
    r.log.push_back(make_choice(k, b, from_file ? "recorded" : "measured", std::move(t)));
    spdlog::info("gemm {}", describe(r.log.back()));
  }
  return it->second;
}

}  // namespace

int gemm_dispatch(DType dt, bool ta, bool tb, int M, int N, int K) {
  TROUPE_CHECK(dt == DType::f32 || dt == DType::bf16 || dt == DType::f16, "gemm_dispatch: dtype ",
               dtype_name(dt));
  if (forced(dt) || 2.0 * M * N * K < kMinMeasuredFlops) return static_choice(dt);
  const Key k{static_cast<int>(dt), ta, tb, M, N, K};
  thread_local std::unordered_map<Key, int, KeyHash> seen;
  if (auto it = seen.find(k); it != seen.end()) return it->second;
  const int b = choose(k);
  if (seen.size() > 4096) seen.clear();
  seen.emplace(k, b);
  return b;
}

std::vector<GemmTiming> gemm_measure(DType dt, bool ta, bool tb, int M, int N, int K) {
  TROUPE_CHECK(M > 0 && N > 0 && K > 0, "gemm_measure: M=", M, " N=", N, " K=", K);
  return measure(dt, ta, tb, M, N, K);
}

std::vector<GemmChoice> gemm_choices() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.log;
}

std::string describe(const GemmChoice& c) {
  std::ostringstream s;
  s << dt_tag(c.dt) << " " << (c.ta ? "T" : "N") << (c.tb ? "T" : "N") << " " << c.M << "x" << c.N << "x"
    << c.K << ":";
  for (size_t i = 0; i < c.timings.size(); ++i) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s %s %.3f ms (%.0f GFLOP/s)", i ? "," : "", c.timings[i].backend.c_str(),
                  c.timings[i].seconds * 1e3, c.timings[i].gflops);
    s << buf;
  }
  s << " -> " << c.backend << " (" << c.how << ")";
  return s.str();
}

std::string gemm_cache_file() { return file_path(); }

}  // namespace troupe::kernels::cpu
