#include "actors/secret.hpp"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "core/error.hpp"

namespace troupe::actors {

namespace {

template <class T, void (*F)(T*)>
struct Free {
  void operator()(T* p) const { F(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Free<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Free<BIO, BIO_free_all>>;

std::string ssl_error() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

const char* kFix = "make one with `troupe secret init FILE` and give the same file to every node";

}  // namespace

void write_secret(const std::string& path, int valid_days) {
  TROUPE_CHECK(valid_days > 0, "a secret must be valid for at least one day");
  Key key(EVP_EC_gen("P-256"));
  TROUPE_CHECK(key != nullptr, "cannot make a key: ", ssl_error());
  Cert cert(X509_new());
  TROUPE_CHECK(cert != nullptr, "cannot make a certificate: ", ssl_error());
  X509_set_version(cert.get(), 2);
  // A random serial: two secrets made in the same second still differ everywhere.
  unsigned char serial[16];
  TROUPE_CHECK(RAND_bytes(serial, sizeof serial) == 1, "no random bytes: ", ssl_error());
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400L * valid_days);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("troupe cluster"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  TROUPE_CHECK(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0,
               "cannot sign the certificate: ", ssl_error());

  Bio mem(BIO_new(BIO_s_mem()));
  TROUPE_CHECK(PEM_write_bio_X509(mem.get(), cert.get()) == 1 &&
                   PEM_write_bio_PrivateKey(mem.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1,
               "cannot encode the secret: ", ssl_error());
  char* data = nullptr;
  long len = BIO_get_mem_data(mem.get(), &data);

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  TROUPE_CHECK(fd >= 0, "cannot create the secret file ", path, ": ", std::strerror(errno),
               errno == EEXIST ? " (an existing secret is never overwritten; remove it first)" : "");
  ::fchmod(fd, 0600);  // whatever the umask
  bool ok = ::write(fd, data, static_cast<size_t>(len)) == len && ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    TROUPE_CHECK(false, "cannot write the secret file ", path, ": ", std::strerror(err));
  }
}

void check_secret(const std::string& path) {
  TROUPE_CHECK(!path.empty(), "no cluster secret given: pass --secret-file FILE or set ", kSecretEnv, " (",
               kFix, ")");
  struct stat st {};
  TROUPE_CHECK(::stat(path.c_str(), &st) == 0, "cannot read the secret file ", path, ": ",
               std::strerror(errno), " (", kFix, ")");
  TROUPE_CHECK(S_ISREG(st.st_mode), "the secret file ", path, " is not a regular file");
  TROUPE_CHECK((st.st_mode & 077) == 0, "the secret file ", path, " is readable by other users (mode ",
               std::to_string((st.st_mode >> 6) & 7), std::to_string((st.st_mode >> 3) & 7),
               std::to_string(st.st_mode & 7), "): run `chmod 600 ", path, "`");
  TROUPE_CHECK(st.st_size > 0 && st.st_size < (1 << 20), "the secret file ", path,
               " is not a troupe secret (size ", st.st_size, " bytes; ", kFix, ")");
  Bio in(BIO_new_file(path.c_str(), "r"));
  TROUPE_CHECK(in != nullptr, "cannot open the secret file ", path, ": ", ssl_error());
  Cert cert(PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  BIO_reset(in.get());
  Key key(PEM_read_bio_PrivateKey(in.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  TROUPE_CHECK(cert != nullptr, "the secret file ", path, " holds no PEM certificate (", kFix, ")");
  TROUPE_CHECK(key != nullptr, "the secret file ", path, " holds no unencrypted PEM private key (", kFix,
               ")");
  TROUPE_CHECK(X509_check_private_key(cert.get(), key.get()) == 1, "the secret file ", path,
               ": its private key does not belong to its certificate (", kFix, ")");
  TROUPE_CHECK(X509_cmp_current_time(X509_get0_notAfter(cert.get())) > 0, "the secret file ", path,
               " has expired: make a new one with `troupe secret init FILE`");
  TROUPE_CHECK(X509_cmp_current_time(X509_get0_notBefore(cert.get())) < 0, "the secret file ", path,
               " is not valid yet (is this host's clock right?)");
}

std::string api_token(const std::string& secret_path) {
  std::ifstream in(secret_path, std::ios::binary);
  TROUPE_CHECK(in.good(), "cannot read the secret file ", secret_path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = "troupe api token 1\n" + ss.str();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  TROUPE_CHECK(EVP_Digest(text.data(), text.size(), md, &n, EVP_sha256(), nullptr) == 1,
               "cannot hash the secret: ", ssl_error());
  return hex(md, n);
}

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> b(bytes);
  TROUPE_CHECK(RAND_bytes(b.data(), static_cast<int>(b.size())) == 1, "no random bytes: ", ssl_error());
  return hex(b.data(), b.size());
}

EphemeralSecret::EphemeralSecret() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/troupe-secret-XXXXXX";
  TROUPE_CHECK(::mkdtemp(tmpl.data()) != nullptr,
               "cannot make a private directory for the run's secret: ", std::strerror(errno));
  dir_ = tmpl;
  path_ = dir_ + "/secret.pem";
  write_secret(path_, 30);
}

EphemeralSecret::~EphemeralSecret() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace troupe::actors
