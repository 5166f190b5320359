// No troupe node routes control messages, so none accepts a routed one.
//
// CAF 0.17.6's BASP has two kinds of actor message. A direct message's sender is an actor of
// the node at the other end of the connection it came on. A routed message names its source
// node and destination node in its payload: a node forwards it when the destination is
// another node, and delivers it when it is itself, with the sender on the *named* source
// node. Nothing checks that name: a peer holding the cluster secret could state another
// node (an agent, through whose relays its host's ranks speak) and its messages would count
// as that node's. Every troupe node speaks only to the nodes it is connected to (workers to
// their agent's relay, agents to the coordinator), so a routed message is never one of
// troupe's: the connection it comes on is closed.
//
// CAF has no option for this. libcaf_io calls its message dispatch,
// basp::instance::handle(ctx, connection, header, payload), through its procedure linkage
// table, so the definition below, in the executable, takes its place (the dynamic linker
// binds the library's call to the executable's symbol first); it refuses routed messages and
// hands everything else to the library's own definition, found with dlsym(RTLD_NEXT).
// actors::basp_guard_active() says whether it is in place; NodeConfig requires it.
#include <dlfcn.h>

#include <atomic>
#include <caf/io/basp/instance.hpp>
#include <caf/io/basp/message_type.hpp>
#include <cstdio>

#include "actors/system.hpp"

namespace {

using Handle = caf::io::basp::connection_state (*)(caf::io::basp::instance*, caf::execution_unit*,
                                                   caf::io::connection_handle, caf::io::basp::header&,
                                                   std::vector<char>*);

constexpr const char* kHandleSymbol =
    "_ZN3caf2io4basp8instance6handleEPNS_14execution_unitENS0_17connection_handleERNS1_"
    "6headerEPSt6vectorIcSaIcEE";

Handle library_handle() {
  static const Handle h = reinterpret_cast<Handle>(::dlsym(RTLD_NEXT, kHandleSymbol));
  return h;
}

std::atomic<uint64_t> refused{0};
std::atomic<bool> called{false};

}  // namespace

namespace caf::io::basp {

connection_state instance::handle(execution_unit* ctx, connection_handle hdl, header& hdr,
                                  std::vector<char>* payload) {
  called.store(true, std::memory_order_relaxed);
  if (hdr.operation == message_type::routed_message) {
    const auto n = refused.fetch_add(1) + 1;
    if (n <= 20 || n % 1000 == 0)
      std::fprintf(
          stderr,
          "troupe: closed a control connection that sent a routed message (no troupe node routes; %llu "
          "so far)\n",
          static_cast<unsigned long long>(n));
    return close_connection;
  }
  const Handle real = library_handle();
  if (real == nullptr) return close_connection;  // basp_guard_active() is false: NodeConfig refused to start
  return real(this, ctx, hdl, hdr, payload);
}

}  // namespace caf::io::basp

namespace troupe::actors {

bool basp_guard_active() { return library_handle() != nullptr; }

uint64_t basp_guard_refused() { return refused.load(); }

bool basp_guard_called() { return called.load(); }

}  // namespace troupe::actors
