// Bounds and checks for every control-plane message, applied before a handler
// touches its contents. A peer that holds the cluster secret is still not
// trusted with the coordinator's invariants: identifiers must be short plain
// words, free text valid UTF-8 (repaired, not refused, where it only reports),
// counts and sizes capped. Each check returns "" or why the message is refused,
// so no handler ever throws on what a peer sent.
//
// Includes CAF (through protocol.hpp): only actor-hosting code includes it.
#pragma once

#include <string>

#include "actors/protocol.hpp"

namespace troupe::actors {

// Caps (bytes or entries).
constexpr size_t kMaxId = 128;              // job ids, agent ids, launch tokens, error names
constexpr size_t kMaxHost = 255;            // a DNS name
constexpr size_t kMaxDevices = 4096;        // devices one agent offers
constexpr size_t kMaxText = 64 << 10;       // a failure message, a "where" answer (cut, not refused)
constexpr size_t kMaxStoreKey = 1024;       // rendezvous group or key
constexpr size_t kMaxStoreValue = 1 << 20;  // a rendezvous value (gloo addresses are ~100 bytes)
constexpr size_t kMaxCkptFiles = 1 << 16;   // files of one rank's checkpoint shard
constexpr size_t kMaxManifest = 16 << 20;   // a manifest without its file list
constexpr int32_t kMaxRanks = 1 << 20;

// "" when s is 1..max bytes of [A-Za-z0-9._:-], else why not ("<what> ...").
std::string check_word(const std::string& s, size_t max, const char* what);
// "" when s is valid UTF-8 of at most max bytes.
std::string check_text(const std::string& s, size_t max, const char* what);

std::string check(const AgentHello& m);
std::string check(const WorkerHello& m);
std::string check(const WorkerExit& m);
std::string check(const WorkerStopped& m);
std::string check(const StepMetrics& m);
std::string check(WorkerResult& m);  // repairs message and error_name text
std::string check(const KillRequest& m);
std::string check(const StoreKey& k);
std::string check(const CkptShard& m);

}  // namespace troupe::actors
