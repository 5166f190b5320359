#include "actors/tls.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <caf/actor_system_config.hpp>
#include <caf/openssl/manager.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

// Definitions in the executable take precedence over libssl's for libcaf_openssl (and for
// any other caller in this process); each does what libssl's does, then calls it or hands
// the context objects libssl would have made from the same bytes.
namespace {

// The definition this executable's replaces (libssl's, libc's).
template <class Fn>
Fn next_definition(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

// A file's bytes, read without blocking (a FIFO or a device is not a file to parse) and
// bounded: a secret is a few KiB. False when it cannot be read, is not a regular file or is
// larger: the caller then leaves it to libssl.
constexpr off_t kMaxFileBytes = 1 << 20;
bool read_bytes(const char* path, std::string* out) {
  const int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kMaxFileBytes;
  out->clear();
  char buf[4096];
  while (ok) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    out->append(buf, static_cast<size_t>(n));
    ok = out->size() <= static_cast<size_t>(kMaxFileBytes);
  }
  ::close(fd);
  return ok;
}

enum class Kind { chain, key, trust };

// One file's parsed objects, each holding a reference of its own; contexts take more.
struct Parsed {
  std::string bytes;  // what they were parsed from
  X509* cert = nullptr;
  STACK_OF(X509) * chain = nullptr;
  EVP_PKEY* key = nullptr;
  X509_STORE* store = nullptr;

  Parsed() = default;
  Parsed(const Parsed&) = delete;
  Parsed& operator=(const Parsed&) = delete;
  ~Parsed() {
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
    X509_STORE_free(store);
  }
};

// A process names one or two secret files; more than kMaxFiles entries means files keep
// changing, and the oldest are forgotten (contexts keep the references they took).
constexpr size_t kMaxFiles = 16;
std::mutex cache_mutex;
std::map<std::pair<Kind, std::string>, std::shared_ptr<const Parsed>>& cache() {
  static auto* files = new std::map<std::pair<Kind, std::string>, std::shared_ptr<const Parsed>>;
  return *files;
}

// The trust stores handed out: shared by every context configured from their file.
std::set<const X509_STORE*>& shared_stores() {
  static auto* stores = new std::set<const X509_STORE*>;
  return *stores;
}

// The parsed objects of `path` for `kind`: from the cache while the file holds the same bytes,
// else loaded by libssl's own `load` into a scratch context and taken from it. Null when the
// file cannot be read or loaded, or changed while it was: the caller then lets libssl load it
// into the caller's context, errors and all. The error queue is as it was on return.
template <class Load, class Take>
std::shared_ptr<const Parsed> parsed(Kind kind, const char* path, Load load, Take take) {
  std::string before;
  if (path == nullptr || !read_bytes(path, &before)) return nullptr;
  const auto key = std::make_pair(kind, std::string(path));
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache().find(key);
    if (it != cache().end() && it->second->bytes == before) return it->second;
  }
  ERR_set_mark();
  SSL_CTX* scratch = SSL_CTX_new(TLS_method());
  auto fresh = std::make_shared<Parsed>();
  const bool ok = scratch != nullptr && load(scratch, path) == 1 && take(scratch, fresh.get());
  SSL_CTX_free(scratch);
  ERR_pop_to_mark();
  std::string after;
  if (!ok || !read_bytes(path, &after) || after != before) return nullptr;
  fresh->bytes = std::move(before);
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache().size() >= kMaxFiles) cache().clear();
  if (fresh->store != nullptr) shared_stores().insert(fresh->store);
  cache()[key] = fresh;
  return fresh;
}

// A context whose key is protected by a passphrase reads it through its callback, or the
// default callback reads the userdata as the passphrase: loaded by libssl every time, as asked.
bool has_passphrase(SSL_CTX* ctx) {
  return SSL_CTX_get_default_passwd_cb(ctx) != nullptr ||
         SSL_CTX_get_default_passwd_cb_userdata(ctx) != nullptr;
}

// ---- SIGPIPE around CAF's TLS calls
//
// CAF 0.17.6 wraps every SSL_read, SSL_write, SSL_connect and SSL_accept in three system
// calls: pthread_sigmask(SIG_BLOCK, {SIGPIPE}, &saved), then after the call
// sigtimedwait({SIGPIPE}, zero timeout) to swallow a SIGPIPE the call raised, then
// pthread_sigmask(SIG_SETMASK, &saved). A thread that runs this pattern (the multiplexer) keeps SIGPIPE
// blocked instead of unblocking it after each call ("holds" it): its later blocks and restores of the same
// mask and its swallowing waits answer without a system call, a SIGPIPE raised meanwhile stays pending and
// blocked. Any other signal-mask call of that thread first swallows a pending SIGPIPE and puts the mask back
// as the thread believes it is, then runs as asked: every caller sees the mask it set. A thread only holds
// SIGPIPE while it has not blocked it itself. TROUPE_SIGPIPE_HOLD=0 turns this off (every call goes to libc).
struct SigpipeHold {
  bool held = false;         // SIGPIPE is blocked for this thread by us, not by its code
  sigset_t believed;         // the mask its code set (held: SIGPIPE not in it)
  bool restore_due = false;  // the last call was a block of {SIGPIPE} that returned `before`
  sigset_t before;
};
thread_local SigpipeHold t_pipe;

using MaskFn = int (*)(int, const sigset_t*, sigset_t*);
using WaitFn = int (*)(const sigset_t*, siginfo_t*, const struct timespec*);
// libc's, resolved on first use: by the executable's static initialisation below at the
// latest, so that a child between fork and exec resolves nothing.
MaskFn real_pthread_sigmask() {
  static const auto f = next_definition<MaskFn>("pthread_sigmask");
  return f;
}
MaskFn real_sigprocmask() {
  static const auto f = next_definition<MaskFn>("sigprocmask");
  return f;
}
WaitFn real_sigtimedwait() {
  static const auto f = next_definition<WaitFn>("sigtimedwait");
  return f;
}
std::atomic<bool> g_hold_sigpipe{true};
[[maybe_unused]] const bool g_sigpipe_resolved = [] {
  real_pthread_sigmask();
  real_sigprocmask();
  real_sigtimedwait();
  const char* env = std::getenv("TROUPE_SIGPIPE_HOLD");
  if (env != nullptr && std::strcmp(env, "0") == 0) g_hold_sigpipe = false;
  return true;
}();

// These run on every TLS read and write of a connection thread (OpenSSL masks SIGPIPE around
// each): at 4,096 ranks a loop of sigismember over every signal here was 5 % of the coordinator's
// multiplexer thread. glibc keeps signal s at bit s-1 of the set's first word, and the kernel has
// no signal past 64.
static_assert(NSIG - 1 <= 64, "every signal in the first word of a sigset_t");
uint64_t signal_bits(const sigset_t* set) {
  return set->__val[0];
}  // glibc's layout, as the interposition above
bool same_signals(const sigset_t* a, const sigset_t* b) { return signal_bits(a) == signal_bits(b); }
bool only_sigpipe(const sigset_t* set) { return signal_bits(set) == uint64_t{1} << (SIGPIPE - 1); }
bool zero_timeout(const struct timespec* t) { return t != nullptr && t->tv_sec == 0 && t->tv_nsec == 0; }

// The thread's mask back to what its code set, a pending SIGPIPE swallowed first.
void release_sigpipe(MaskFn real) {
  t_pipe.restore_due = false;
  if (!t_pipe.held) return;
  t_pipe.held = false;
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  const struct timespec zero {};
  while (real_sigtimedwait()(&pipe, nullptr, &zero) == SIGPIPE) {
  }
  real(SIG_SETMASK, &t_pipe.believed, nullptr);
}

int mask_call(MaskFn real, int how, const sigset_t* set, sigset_t* old) {
  if (!g_hold_sigpipe.load(std::memory_order_relaxed)) {
    release_sigpipe(real);
    return real(how, set, old);
  }
  if (set != nullptr && how == SIG_BLOCK && only_sigpipe(set)) {
    if (t_pipe.held) {  // blocked already; the thread's code believes its own mask
      if (old != nullptr) *old = t_pipe.believed;
      return 0;
    }
    const int rc = real(how, set, old);
    t_pipe.restore_due = rc == 0 && old != nullptr && sigismember(old, SIGPIPE) == 0;
    if (t_pipe.restore_due) t_pipe.before = *old;
    return rc;
  }
  if (set != nullptr && how == SIG_SETMASK && old == nullptr && sigismember(set, SIGPIPE) == 0) {
    if (t_pipe.held && same_signals(set, &t_pipe.believed)) return 0;
    if (!t_pipe.held && t_pipe.restore_due && same_signals(set, &t_pipe.before)) {
      // The restore after the block: the thread's mask is `set` plus SIGPIPE, and stays so.
      t_pipe.restore_due = false;
      t_pipe.held = true;
      t_pipe.believed = *set;
      return 0;
    }
  }
  release_sigpipe(real);
  return real(how, set, old);
}

}  // namespace

extern "C" {

int pthread_sigmask(int how, const sigset_t* set, sigset_t* old) {
  return mask_call(real_pthread_sigmask(), how, set, old);
}

int sigprocmask(int how, const sigset_t* set, sigset_t* old) {
  return mask_call(real_sigprocmask(), how, set, old);
}

int sigtimedwait(const sigset_t* set, siginfo_t* info, const struct timespec* timeout) {
  // Held: a SIGPIPE is swallowed when the thread lets SIGPIPE through again.
  if (t_pipe.held && only_sigpipe(set) && zero_timeout(timeout)) {
    errno = EAGAIN;
    return -1;
  }
  return real_sigtimedwait()(set, info, timeout);
}

// OpenSSL requires an empty error queue before each I/O call; CAF 0.17.6 reads
// SSL_get_error() after each without clearing it first, and one multiplexer thread serves
// every connection: an error left by one peer (a closed connection, a stranger's failed
// handshake) made the next call on another, healthy connection look failed, and CAF closed
// it. Measured: a worker that exited after its abort took its agent's connection with it.
#define TROUPE_SSL_CLEAN_CALL(ret, name, params, args) \
  ret name params {                                    \
    ERR_clear_error();                                 \
    using Fn = ret(*) params;                          \
    static Fn real = next_definition<Fn>(#name);       \
    return real args;                                  \
  }
TROUPE_SSL_CLEAN_CALL(int, SSL_read, (SSL * s, void* buf, int n), (s, buf, n))
TROUPE_SSL_CLEAN_CALL(int, SSL_write, (SSL * s, const void* buf, int n), (s, buf, n))
TROUPE_SSL_CLEAN_CALL(int, SSL_connect, (SSL * s), (s))
TROUPE_SSL_CLEAN_CALL(int, SSL_accept, (SSL * s), (s))
#undef TROUPE_SSL_CLEAN_CALL

SSL* SSL_new(SSL_CTX* ctx) {
  static auto real = next_definition<SSL* (*)(SSL_CTX*)>("SSL_new");
  SSL* s = real(ctx);
  if (s != nullptr) SSL_set_mode(s, SSL_MODE_RELEASE_BUFFERS);
  return s;
}

int SSL_CTX_use_certificate_chain_file(SSL_CTX* ctx, const char* file) {
  using Fn = int (*)(SSL_CTX*, const char*);
  static auto real = next_definition<Fn>("SSL_CTX_use_certificate_chain_file");
  if (ctx == nullptr || has_passphrase(ctx)) return real(ctx, file);
  auto p = parsed(Kind::chain, file, real, [](SSL_CTX* scratch, Parsed* out) {
    X509* cert = SSL_CTX_get0_certificate(scratch);
    if (cert == nullptr || X509_up_ref(cert) != 1) return false;
    out->cert = cert;
    STACK_OF(X509)* chain = nullptr;
    SSL_CTX_get0_chain_certs(scratch, &chain);
    if (chain != nullptr && sk_X509_num(chain) > 0) {
      out->chain = X509_chain_up_ref(chain);
      if (out->chain == nullptr) return false;
    }
    return true;
  });
  if (p == nullptr) return real(ctx, file);
  // As libssl does: the certificate, then this chain in place of any other.
  if (SSL_CTX_use_certificate(ctx, p->cert) != 1) return 0;
  return p->chain != nullptr ? static_cast<int>(SSL_CTX_set1_chain(ctx, p->chain))
                             : static_cast<int>(SSL_CTX_clear_chain_certs(ctx));
}

int SSL_CTX_use_PrivateKey_file(SSL_CTX* ctx, const char* file, int type) {
  using Fn = int (*)(SSL_CTX*, const char*, int);
  static auto real = next_definition<Fn>("SSL_CTX_use_PrivateKey_file");
  if (ctx == nullptr || type != SSL_FILETYPE_PEM || has_passphrase(ctx)) return real(ctx, file, type);
  auto p = parsed(
      Kind::key, file,
      [](SSL_CTX* scratch, const char* path) { return real(scratch, path, SSL_FILETYPE_PEM); },
      [](SSL_CTX* scratch, Parsed* out) {
        EVP_PKEY* key = SSL_CTX_get0_privatekey(scratch);
        if (key == nullptr || EVP_PKEY_up_ref(key) != 1) return false;
        out->key = key;
        return true;
      });
  if (p == nullptr) return real(ctx, file, type);
  // Checked against the context's certificate as libssl checks it.
  return SSL_CTX_use_PrivateKey(ctx, p->key);
}

int SSL_CTX_load_verify_locations(SSL_CTX* ctx, const char* cafile, const char* capath) {
  using Fn = int (*)(SSL_CTX*, const char*, const char*);
  static auto real = next_definition<Fn>("SSL_CTX_load_verify_locations");
  // libssl adds to the context's store; the shared store stands in only for an empty one,
  // and a directory (looked up lazily, per certificate) is always libssl's. A context that
  // holds a shared store and is given more authorities gets a copy of its own first: what
  // one context trusts is never added to another's.
  X509_STORE* current = ctx != nullptr ? SSL_CTX_get_cert_store(ctx) : nullptr;
  bool shared = false;
  if (current != nullptr) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    shared = shared_stores().count(current) != 0;
  }
  if (shared) {
    X509_STORE* own = X509_STORE_new();
    if (own == nullptr) return 0;
    STACK_OF(X509)* certs = X509_STORE_get1_all_certs(current);
    for (int i = 0; certs != nullptr && i < sk_X509_num(certs); ++i)
      X509_STORE_add_cert(own, sk_X509_value(certs, i));
    sk_X509_pop_free(certs, X509_free);
    SSL_CTX_set_cert_store(ctx, own);  // takes `own`, lets go of the shared one
    return real(ctx, cafile, capath);
  }
  if (current == nullptr || cafile == nullptr || capath != nullptr ||
      sk_X509_OBJECT_num(X509_STORE_get0_objects(current)) != 0)
    return real(ctx, cafile, capath);
  auto p = parsed(
      Kind::trust, cafile, [](SSL_CTX* scratch, const char* path) { return real(scratch, path, nullptr); },
      [](SSL_CTX* scratch, Parsed* out) {
        X509_STORE* store = SSL_CTX_get_cert_store(scratch);
        if (store == nullptr || X509_STORE_up_ref(store) != 1) return false;
        out->store = store;
        return true;
      });
  if (p == nullptr) return real(ctx, cafile, capath);
  SSL_CTX_set1_cert_store(ctx, p->store);
  return 1;
}

}  // extern "C"

namespace troupe::actors {

void hold_sigpipe(bool on) { g_hold_sigpipe = on; }

void use_cluster_secret(caf::actor_system_config& cfg, const std::string& secret_file) {
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = secret_file;
  cfg.openssl_key = secret_file;
  cfg.openssl_cafile = secret_file;
}

}  // namespace troupe::actors
