// The cluster secret: what every coordinator, agent and worker of one cluster
// holds, and what no stranger has. It is one PEM file with a self-signed
// certificate and its private key; every node presents that certificate and
// trusts only it, so the control plane is mutual TLS (CAF's OpenSSL module)
// in which the proof of membership is possession of the key.
//
// No CAF here: the CLI includes it.
#pragma once

#include <string>

namespace troupe::actors {

// Writes a new secret to `path` (mode 0600, created exclusively: an existing
// file is never overwritten). `valid_days` bounds the certificate's lifetime.
// Throws troupe::Error naming the path on failure.
void write_secret(const std::string& path, int valid_days = 3650);

// Checks a secret file before a node starts: a regular file, not readable by
// group or others (like ssh keys), holding one certificate and the private key
// that matches it, valid now. Throws troupe::Error with the path, what is
// wrong and how to fix it.
void check_secret(const std::string& path);

// The client API's token when no --api-token-file is given: a one-way hash of the
// secret file (SHA-256, hex), so that every holder of the secret can use the API
// and the token, which travels in the clear, reveals nothing of the key.
// Throws troupe::Error when the file cannot be read.
std::string api_token(const std::string& secret_path);

// `bytes` random bytes from OpenSSL's CSPRNG, as lowercase hex (launch tokens).
std::string random_hex(size_t bytes);

// A temporary secret for one `troupe run`: created in a fresh private
// directory under $TMPDIR (or /tmp) and removed with it on destruction.
class EphemeralSecret {
 public:
  EphemeralSecret();
  ~EphemeralSecret();
  EphemeralSecret(const EphemeralSecret&) = delete;
  EphemeralSecret& operator=(const EphemeralSecret&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// The environment variable that names the secret file when --secret-file is not given.
constexpr const char* kSecretEnv = "TROUPE_SECRET_FILE";

}  // namespace troupe::actors
