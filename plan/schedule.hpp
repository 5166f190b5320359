// Pipeline schedules as data, and a checker that proves a table runs.
//
// A Schedule is, per pipeline rank, the ordered list of its compute ops: F, B
// or W of micro-batch `mb` on local chunk `chunk` (virtual stage; model chunk
// k = chunk * pp + rank). Communication is not written in the table; it is
// derived from it (rank_program), the same way for the checker and for the
// executor, so the checker proves exactly what the executor will do:
//   F of model chunk k: receives activations (mb) from chunk k-1, sends its
//                       output to chunk k+1; chunk 0 reads tokens, the last
//                       chunk computes the loss.
//   B of model chunk k: receives the output gradient from chunk k+1 (the last
//                       chunk starts from the loss), sends its input gradient
//                       to chunk k-1. In a schedule that splits the backward
//                       (zb-h1), B is the input gradient only and
//   W of model chunk k: the weight gradients of that micro-batch; no
//                       communication, any time after its B.
// Pairing (Megatron's send_forward_recv_backward / send_backward_recv_forward):
// after compute op i a rank posts ONE batch {send the output of op i, receive
// the input of op i+1}, so two neighbours that each send to the other while
// waiting on the other never block. Ops marked `fused` form one group with the
// next op: the batch before the group receives every input of the group, the
// batch after it sends every output and receives the next group's inputs
// (the interleaved steady state, as Megatron batches it). W ops are not part
// of the pairing: groups are formed from the F/B ops alone, and a W runs after
// the batch that follows the group before it (the batch that sends that B's
// input gradient leaves first, so the rank upstream is not kept waiting).
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

// F forward; B backward (input and weight gradients, or only the input
// gradient where the schedule splits the backward); W weight gradients.
enum class Pass : uint8_t { F, B, W };

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
// "F3", "B3.1" (chunk 1), "W3", "F5.1+" (fused with the next op).
std::string to_string(const Op& op);

enum class ScheduleKind : uint8_t { gpipe, one_f_one_b, interleaved, zb_h1 };
const char* schedule_name(ScheduleKind k);              // "gpipe", "1f1b", "interleaved", "zb-h1"
ScheduleKind schedule_from_name(const std::string& s);  // throws troupe::Error on others

struct Schedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int pp = 1;                          // pipeline ranks
  int v = 1;                           // virtual stages (chunks) per rank
  int m = 1;                           // micro-batches per step
  std::vector<std::vector<Op>> ranks;  // ranks[p] = ops of pipeline rank p, in order
  int n_chunks() const { return pp * v; }
  // B is the input gradient only and every (chunk, mb) has its own W op.
  bool split_backward() const { return kind == ScheduleKind::zb_h1; }
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
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with the
// backward split into B and W, rank p running W of micro-batch k - p after the
// B of micro-batch k. Peak in flight on every rank: min(pp, m), so rank 0 holds
// what it holds in 1F1B. The held-back W's are work for the waits on the
// neighbours, which they fill by overlapping the batch before them
// (CheckOptions::overlap_weights, what the executor does): run after it, the
// step would take as long as 1F1B's. W's run in micro-batch order on every rank (weight gradients
// accumulate in that order, the same as 1F1B's). Any pp >= 1, m >= 1.
Schedule zb_h1(int pp, int m);
// One function picks the schedule; v is ignored by gpipe and 1f1b, and zb_h1
// requires v == 1.
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
  // The part of t_backward that is W in a schedule that splits the backward:
  // there B takes t_backward - t_weight and W t_weight (defaults: F = B = W).
  double t_weight = 1.0;
  // The W's that follow a batch run while it is in flight (they need nothing it
  // carries), so they fill the wait for the neighbour instead of coming after it:
  // what the executor runs (the batch on a thread of its own). Off: the W's wait
  // for the batch, and ZB-H1's step takes as long as 1F1B's.
  bool overlap_weights = true;
  // Durations of one op of local chunk c on pipeline rank p, [p][c], in place of t_forward /
  // t_backward / t_weight (which are a whole rank's and split evenly over its v chunks): the
  // planner's costs, where the embedding and the head make chunks unequal. Empty: uniform.
  // chunk_weight is read only where the backward is split (there B takes backward - weight).
  std::vector<std::vector<double>> chunk_forward, chunk_backward, chunk_weight;
  // What one transfer takes once both sides have posted it (latency + bytes / bandwidth); a
  // batch completes that long after its last match, times the most transfers it has in one
  // direction (sends and receives run at once, each direction one after the other).
  double t_transfer = 0.0;
};

// A micro-batch holds an activation slot from its F until the batch after its B
// has sent the input gradient; where the backward is split, until its W (the
// weight gradients need the saved activations too).
struct CheckResult {
  std::vector<std::vector<int>> peak_in_flight;  // [rank][chunk]: slots that chunk needs
  std::vector<int> peak_per_rank;                // [rank]: the most live micro-batches at once
  double makespan = 0.0;                         // simulated step time
  std::vector<double> busy;                      // [rank] simulated compute time
  std::vector<double> transfer;                  // [rank] simulated time moving data (t_transfer)
  double bubble = 0.0;                           // mean over ranks of idle / makespan (idle: neither
                                                 // computing nor transferring)
  int comm_batches = 0;                          // batches executed (all ranks)
};

// Proves the table consistent and deadlock-free by simulating it; throws
// ScheduleError naming the first problem: an op out of range, a duplicated or
// missing F/B (and W where the backward is split), B before its F, W before its
// B, a W where the backward is not split, a send nobody receives (or a receive
// nobody sends), a wait cycle (crossed order), more live micro-batches than slots.
CheckResult check_schedule(const Schedule& s, const CheckOptions& opt = {});

// check_schedule in two halves: the table's checks and its programs once (a planner prices
// thousands of timings of one table), then a simulation per set of durations.
class Simulator {
 public:
  // Throws ScheduleError for a table that is inconsistent or whose sends do not match.
  explicit Simulator(const Schedule& s, Pairing pairing = Pairing::paired);
  // check_schedule(s, opt) with opt.pairing the constructor's.
  CheckResult run(const CheckOptions& opt) const;
  const Schedule& schedule() const { return s_; }

 private:
  Schedule s_;
  Pairing pairing_;
  std::vector<std::vector<ProgramStep>> progs_;
};

// Activation slots local chunk c of pipeline rank p needs under a checked schedule of pp
// ranks (at least 1); 1 without a pipeline (pp == 1, an empty check).
int activation_slots(const CheckResult& check, int pp, int p, int c);

// Theoretical bubble fractions (equal stages, free communication):
// GPipe/1F1B (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1) (Megatron: the bubble
// shrinks by v because each chunk takes 1/v of the time); zb-h1 with F = B = W
// (p-1)/(3m+p-1): idle (p-1)(F+B-W) per rank over m(F+B+W) + that idle, about
// a third of 1F1B's (p-1)(F+B+W).
double theoretical_bubble(ScheduleKind kind, int pp, int v, int m);

}  // namespace troupe::plan
