// Pipeline schedules as data, and a checker that proves a table runs.
//
// A Schedule is, per pipeline rank, the ordered list of its compute ops: F or B
// of micro-batch `mb` on local chunk `chunk` (virtual stage; model chunk
// k = chunk * pp + rank). Communication is not written in the table; it is
// derived from it (rank_program), the same way for the checker and for the
// executor, so the checker proves exactly what the executor will do:
//   F of model chunk k: receives activations (mb) from chunk k-1, sends its
//                       output to chunk k+1; chunk 0 reads tokens, the last
//                       chunk computes the loss.
//   B of model chunk k: receives the output gradient from chunk k+1 (the last
//                       chunk starts from the loss), sends its input gradient
//                       to chunk k-1.
// Pairing (Megatron's send_forward_recv_backward / send_backward_recv_forward):
// after compute op i a rank posts ONE batch {send the output of op i, receive
// the input of op i+1}, so two neighbours that each send to the other while
// waiting on the other never block. Ops marked `fused` form one group with the
// next op: the batch before the group receives every input of the group, the
// batch after it sends every output and receives the next group's inputs
// (the interleaved steady state, as Megatron batches it).
//
// Micro-batches per optimizer step: m = global_batch / (data x micro_batch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace troupe::plan {

// A table that cannot run; what() says which rank, op and message.
class ScheduleError : public Error {
 public:
  using Error::Error;
};

enum class Pass : uint8_t { F, B };

struct Op {
  Pass pass = Pass::F;
  int mb = 0;     // micro-batch in [0, m)
  int chunk = 0;  // local chunk (virtual stage) in [0, v)
  // Shares its communication with the next op: both inputs arrive in the batch
  // before, both outputs leave in the batch after (see rank_program).
  bool fused = false;
  bool operator==(const Op& o) const {
    return pass == o.pass && mb == o.mb && chunk == o.chunk && fused == o.fused;
  }
};
// "F3", "B3.1" (chunk 1), "F5.1+" (fused with the next op).
std::string to_string(const Op& op);

enum class ScheduleKind : uint8_t { gpipe, one_f_one_b, interleaved };
const char* schedule_name(ScheduleKind k);              // "gpipe", "1f1b", "interleaved"
ScheduleKind schedule_from_name(const std::string& s);  // throws troupe::Error on others

struct Schedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int pp = 1;                          // pipeline ranks
  int v = 1;                           // virtual stages (chunks) per rank
  int m = 1;                           // micro-batches per step
  std::vector<std::vector<Op>> ranks;  // ranks[p] = ops of pipeline rank p, in order
  int n_chunks() const { return pp * v; }
};

// m = global_batch / (data * micro_batch); throws troupe::Error unless it divides.
int micro_batches(int64_t global_batch, int data, int micro_batch);

// GPipe: every forward, then every backward, both in micro-batch order. Peak in
// flight: m.
Schedule gpipe(int pp, int m);
// 1F1B (PipeDream-flush, Megatron's default): warm-up forwards, steady 1F1B,
// cool-down backwards. Peak in flight on rank p: min(pp - p, m).
Schedule one_f_one_b(int pp, int m);
// Interleaved 1F1B (Megatron's virtual pipeline) with v chunks per rank.
// Requires pp >= 2, v >= 2 and m % pp == 0 (micro-batches run in groups of pp
// per chunk, as in Megatron); anything else throws troupe::Error naming the fix.
Schedule interleaved_1f1b(int pp, int v, int m);
// One function picks the schedule; v is ignored unless kind == interleaved.
Schedule make_schedule(ScheduleKind kind, int pp, int v, int m);

// ---- derived communication ------------------------------------------------

enum class Carry : uint8_t { activation, gradient };

// One half of a point-to-point transfer derived from the table.
struct Transfer {
  bool send = false;
  Carry carry = Carry::activation;
  int peer = 0;  // pipeline rank
  int mb = 0;
  int dest = 0;  // model chunk that receives it
  uint32_t tag = 0;
};
// Unique per (carry, micro-batch, receiving model chunk) within a step.
uint32_t transfer_tag(Carry carry, int mb, int dest_chunk, int n_chunks);

struct ProgramStep {
  bool compute = false;
  Op op;                        // when compute
  std::vector<Transfer> batch;  // when !compute: posted together, then waited for
};

enum class Pairing : uint8_t {
  paired,    // what the executor runs: after group g, {send out(g), recv in(g+1)}
  unpaired,  // naive: recv in(i); compute; send out(i), each blocking on its own
};
std::vector<ProgramStep> rank_program(const Schedule& s, int rank, Pairing pairing = Pairing::paired);

// ---- checker ----------------------------------------------------------------

struct CheckOptions {
  Pairing pairing = Pairing::paired;
  // Rendezvous: a send completes only once the peer has posted the matching
  // receive (NCCL, large gloo messages): the strict model. Eager: sends complete
  // at once (buffered), receives wait for the send.
  bool rendezvous = true;
  // Activation slots per chunk (0: unlimited); more live micro-batches is an error.
  int max_slots = 0;
  // Simulated durations of one micro-batch through a whole rank (v chunks share it).
  double t_forward = 1.0, t_backward = 2.0;
};

struct CheckResult {
  std::vector<std::vector<int>> peak_in_flight;  // [rank][chunk]: slots that chunk needs
  std::vector<int> peak_per_rank;                // [rank]: the most live micro-batches at once
  double makespan = 0.0;                         // simulated step time
  std::vector<double> busy;                      // [rank] simulated compute time
  double bubble = 0.0;                           // mean over ranks of idle / makespan
  int comm_batches = 0;                          // batches executed (all ranks)
};

// Proves the table consistent and deadlock-free by simulating it; throws
// ScheduleError naming the first problem: an op out of range, a duplicated or
// missing F/B, B before its F, a send nobody receives (or a receive nobody
// sends), a wait cycle (crossed order), more live micro-batches than slots.
CheckResult check_schedule(const Schedule& s, const CheckOptions& opt = {});

// Activation slots local chunk c of pipeline rank p needs under a checked schedule of pp
// ranks (at least 1); 1 without a pipeline (pp == 1, an empty check).
int activation_slots(const CheckResult& check, int pp, int p, int c);

// Theoretical bubble fractions (equal stages, free communication):
// GPipe/1F1B (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1) (Megatron: the bubble
// shrinks by v because each chunk takes 1/v of the time).
double theoretical_bubble(ScheduleKind kind, int pp, int v, int m);

}  // namespace troupe::plan
