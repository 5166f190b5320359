// The onednn backend of gemm_half (gemm_half.hpp): oneDNN's matmul primitive, bf16 or f16
// operands, f32 accumulation and an f32 result, the bias fused, beta == 1 as a sum post-op.
// oneDNN picks its own kernel by the CPU: AMX tiles (tdpbf16ps) on Sapphire Rapids and later
// (it asks the kernel for the tile state itself), vdpbf16ps on AVX512-BF16, and so on.
//
// A primitive costs ~0.2-10 ms to create and microseconds to run, so each thread keeps one
// per problem (shape, strides, transposes, bias, beta) it has met: a training step meets the
// same few dozen again and again. The cache is bounded; past the bound it starts over.
//
// Where oneDNN has only its reference implementation for a data type on this CPU (f16
// without AVX512-FP16 or AMX-FP16, any 16-bit type without AVX-512), the backend reports
// itself unavailable: a reference loop is orders of magnitude slower than convert.
#ifdef TROUPE_HAVE_DNNL
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "core/error.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_backends.hpp"

// libgomp comes with libdnnl; declared here so that nothing else needs -fopenmp.
extern "C" void omp_set_num_threads(int);

namespace troupe::kernels::cpu::detail {
namespace {

using dnnl::memory;

memory::data_type dnnl_type(DType dt) {
  return dt == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f16;
}

// Holds oneDNN to TROUPE_MAX_CPU_ISA (cpu_features.hpp) before anything is created.
void cap_isa() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CpuFeatures& f = cpu_features();
    if (f.cap.empty() || f.cap == "all") return;
    const dnnl::cpu_isa isa = f.cap == "avx2"     ? dnnl::cpu_isa::avx2
                              : f.cap == "avx512" ? dnnl::cpu_isa::avx512_core
                                                  : dnnl::cpu_isa::avx512_core_bf16;
    try {
      dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error&) {
      // Already fixed by an earlier primitive (or ONEDNN_MAX_CPU_ISA): nothing to do.
    }
  });
}

dnnl::engine& cpu_engine() {
  static dnnl::engine* e = [] {
    cap_isa();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);  // lives for the process
  }();
  return *e;
}

struct Key {
  int dt, ta, tb, M, N, K, lda, ldb, ldc, beta1, bias;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    const int* p = &k.dt;
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(Key) / sizeof(int); ++i)
      h = (h ^ static_cast<unsigned>(p[i])) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  memory::desc a, b, c, bias;
};

constexpr size_t kMaxCached = 1024;

dnnl::matmul::primitive_desc describe(const Key& k, memory::desc* a, memory::desc* b, memory::desc* c,
                                      memory::desc* bias) {
  const memory::data_type t = dnnl_type(static_cast<DType>(k.dt));
  // Logical op(A) (M,K) and op(B) (K,N); a transpose is a swap of strides.
  *a = memory::desc({k.M, k.K}, t, k.ta ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
  *b = memory::desc({k.K, k.N}, t, k.tb ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
  *c = memory::desc({k.M, k.N}, memory::data_type::f32, memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  if (k.beta1) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  if (k.bias) {
    *bias = memory::desc({1, k.N}, memory::data_type::f32, memory::dims{k.N, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(*a, *b, *bias, *c), attr, cpu_engine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(*a, *b, *c), attr, cpu_engine());
}

// The implementation oneDNN picks for dt on this CPU ("brg:avx512_core_amx", "ref:any", ...),
// or "" when it has none.
std::string probe_impl(DType dt) {
  try {
    const Key k{static_cast<int>(dt), 0, 1, 64, 64, 64, 64, 64, 64, 0, 0};
    memory::desc a, b, c, bias;
    return describe(k, &a, &b, &c, &bias).impl_info_str();
  } catch (const dnnl::error&) {
    return "";
  }
}

}  // namespace

const std::string& onednn_half_impl(DType dt) {
  static const std::string bf16 = probe_impl(DType::bf16), f16 = probe_impl(DType::f16);
  return dt == DType::bf16 ? bf16 : f16;
}

bool onednn_half_usable(DType dt) {
  const std::string& impl = onednn_half_impl(dt);
  return !impl.empty() && impl.rfind("ref", 0) != 0;
}

void gemm_half_onednn(DType dt, bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
                      const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  thread_local std::unordered_map<Key, Entry, KeyHash> cache;
  thread_local std::unique_ptr<dnnl::stream> stream;
  if (stream == nullptr) {
    omp_set_num_threads(1);  // OpenMP's thread count is per calling thread: one compute thread
    stream = std::make_unique<dnnl::stream>(cpu_engine());
  }
  const Key key{static_cast<int>(dt), trans_a,        trans_b, M, N, K, lda, ldb, ldc,
                beta != 0.0f,         bias != nullptr};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxCached) cache.clear();
    Entry e;
    try {
      const auto pd = describe(key, &e.a, &e.b, &e.c, &e.bias);
      e.prim = dnnl::matmul(pd);
    } catch (const dnnl::error& err) {
      TROUPE_CHECK(false, "oneDNN matmul for ", dtype_name(dt), " ", M, "x", N, "x", K, ": ", err.what());
    }
    it = cache.emplace(key, std::move(e)).first;
  }
  const Entry& e = it->second;
  // oneDNN takes non-const handles; it does not write the inputs.
  memory ma(e.a, cpu_engine(), const_cast<uint16_t*>(A));
  memory mb(e.b, cpu_engine(), const_cast<uint16_t*>(B));
  memory mc(e.c, cpu_engine(), C);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, memory(e.bias, cpu_engine(), const_cast<float*>(bias)));
  e.prim.execute(*stream, args);
  stream->wait();
}

}  // namespace troupe::kernels::cpu::detail
#endif  // TROUPE_HAVE_DNNL
