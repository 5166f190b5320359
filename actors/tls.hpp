// The middleman's TLS: every node authenticates with the cluster secret (one PEM file holding
// its certificate, its key and the only authority it trusts; actors/secret.hpp), and this
// process answers the OpenSSL calls libcaf_openssl (0.17.6) makes for each connection
// (actors/tls.cpp):
//
// * CAF builds a new SSL_CTX for every connection and loads the certificate, the key and
//   the trust store into it from the files: about 2 ms of CPU and 25 KiB per connection on
//   either side, paid again at every launch and by every stranger's handshake. The files
//   are parsed once per process instead (again when a file's bytes change) and each
//   connection's context shares the parsed objects. A context that is given more
//   authorities gets a trust store of its own first; one changed through
//   SSL_CTX_get_cert_store() would change the shared one (CAF never does).
// * Each TLS connection releases its read and write buffers (about 34 KiB) when it has
//   nothing buffered (SSL_MODE_RELEASE_BUFFERS): a control connection is idle between
//   small records almost all the time.
// * Each I/O call starts from an empty OpenSSL error queue (one multiplexer thread serves
//   every connection; a stale error made a healthy connection look failed).
// * CAF blocks SIGPIPE around each of those calls and unblocks it after, three system calls
//   per call; the thread that makes them keeps SIGPIPE blocked instead, and every signal-mask
//   call of its code still sees the mask it set (TROUPE_SIGPIPE_HOLD=0: off).
#pragma once

#include <string>

namespace caf {
class actor_system_config;
}

namespace troupe::actors {

// Loads CAF's OpenSSL manager into `cfg` and makes `secret_file` this node's certificate,
// key and trusted authority.
void use_cluster_secret(caf::actor_system_config& cfg, const std::string& secret_file);

// Whether a thread that blocks SIGPIPE around its TLS calls keeps it blocked between them
// (on unless TROUPE_SIGPIPE_HOLD=0); off, every signal-mask call goes to libc as made.
void hold_sigpipe(bool on);

}  // namespace troupe::actors
