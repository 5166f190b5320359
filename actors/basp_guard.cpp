// A control message counts as the node's at the other end of the connection it came on, and
// nothing a peer states can change that.
//
// CAF 0.17.6's BASP has two kinds of actor message. A direct message's sender is an actor of
// the node at the other end of the connection it came on. A routed message names its source
// node and destination node in its payload: a node forwards it when the destination is
// another node, and delivers it when it is itself, with the sender on the *named* source
// node. Nothing checks that name: a peer holding the cluster secret could state another
// node (an agent, through whose relays its host's ranks speak) and its messages would count
// as that node's. Every troupe node speaks only to the nodes it is connected to (workers to
// their agent's relay, agents to the coordinator), so a routed message is never one of
// troupe's: the connection it comes on is closed. So is one that
//   * introduces itself (a client handshake) as a node already connected over another
//     connection: CAF would take it as that node's second connection, and what it sends as
//     that node's (a CAF node never opens one: it closes a redundant connection itself); or on
//     a connection whose number still names another node (a closed connection not yet
//     forgotten: CAF would count what it sends as that node's);
//   * sends a monitor or down message naming a source other than its own node, or a
//     destination other than this one: CAF would forward it, or take a down message as the
//     end of the named node's actor (a rank or an agent seen lost);
//   * sends, as an ordinary message, what CAF takes as a system message: an exit message (one
//     with exit_reason::kill ends any actor, whatever its exit handler), a down message (a
//     rank or an agent seen lost), a link or unlink request (a link to the peer's proxy ends
//     the actor with an exit message when the peer disconnects), a stream message, or one with
//     forwarding stages. troupe sends none of them between nodes: CAF's own monitors use the
//     down messages above, and no troupe actor links, streams or delegates.
//
// CAF has no option for this. libcaf_io calls its message dispatch,
// basp::instance::handle(ctx, connection, header, payload), through its procedure linkage
// table, so the definition below, in the executable, takes its place (the dynamic linker
// binds the library's call to the executable's symbol first); it refuses routed messages and
// hands everything else to the library's own definition, found with dlsym(RTLD_NEXT).
// actors::basp_guard_active() says whether it is in place; NodeConfig requires it.
#include <dlfcn.h>

#include <atomic>
#include <caf/binary_deserializer.hpp>
#include <caf/io/basp/instance.hpp>
#include <caf/io/basp/message_type.hpp>
#include <cstdio>
#include <string>

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

// The message types (CAF 0.17.6's names of a message's element types) that CAF handles as
// system messages, not as the receiver's: exit, down, group down, link and unlink requests
// (an atom and an actor), and stream messages.
bool is_system_message(const std::string& types) {
  static const char* const kExact[] = {"@<>+@exit", "@<>+@down", "@<>+@group_down",
                                       "@<>+@atom+@strong_actor_ptr"};
  for (const char* t : kExact)
    if (types == t) return true;
  return types.find("stream_msg") != std::string::npos;
}

std::atomic<uint64_t> refused{0};
std::atomic<bool> called{false};

caf::io::basp::connection_state refuse(const char* what) {
  const auto n = refused.fetch_add(1) + 1;
  if (n <= 20 || n % 1000 == 0)
    std::fprintf(
        stderr,
        "troupe: closed a control connection that sent %s (a message counts as its connection's node; "
        "%llu so far)\n",
        what, static_cast<unsigned long long>(n));
  return caf::io::basp::close_connection;
}

}  // namespace

namespace caf::io::basp {

connection_state instance::handle(execution_unit* ctx, connection_handle hdl, header& hdr,
                                  std::vector<char>* payload) {
  called.store(true, std::memory_order_relaxed);
  switch (hdr.operation) {
    case message_type::routed_message:
      return refuse("a routed message");
    case message_type::client_handshake:
      if (payload != nullptr) {
        node_id claimed;
        binary_deserializer in{ctx, *payload};
        if (!in(claimed)) {
          // A number still naming a closed connection's node: the broker has not forgotten that
          // connection yet, and would count this one's messages as that node's (guarded_accept
          // moves accepted descriptors so that this does not happen; here it is refused).
          const node_id was = tbl().lookup_direct(hdl);
          if (was && was != claimed) {
            const std::string what =
                "a handshake on a connection still named for another node [node: " + to_string(claimed) +
                "; connection " + std::to_string(hdl.id()) + " was " + to_string(was) + "'s]";
            return refuse(what.c_str());
          }
          auto other = tbl().lookup_direct(claimed);
          if (other && *other != hdl) {
            const std::string what =
                "a handshake as a node connected over another connection [node: " + to_string(claimed) +
                "; connection " + std::to_string(hdl.id()) + ", its route " + std::to_string(other->id()) +
                "]";
            return refuse(what.c_str());
          }
        }
      }
      break;
    case message_type::direct_message:
      if (payload != nullptr) {
        // The payload: forwarding stages (a sequence of actor handles), then the message, an
        // object named by its element types ("@<>+@exit").
        size_t stages = 0;
        uint16_t type_nr = 0;
        std::string types;
        binary_deserializer in{ctx, *payload};
        if (in.begin_sequence(stages) || stages != 0) return refuse("a message with forwarding stages");
        if (in.begin_object(type_nr, types) || type_nr != 0 || is_system_message(types))
          return refuse("an exit, down, link or stream message");
      }
      break;
    case message_type::monitor_message:
    case message_type::down_message:
      if (payload != nullptr) {
        node_id source, dest;
        binary_deserializer in{ctx, *payload};
        const node_id route = tbl().lookup_direct(hdl);
        if (in(source, dest) || source != route || dest != this_node()) {
          // Which nodes it named, and whether the connection was a node's route at all: what
          // tells a forgery from a node's second connection.
          const std::string what =
              "a monitor or down message for another node [the connection: " +
              (route ? to_string(route) : std::string("no node's route")) + "; source: " + to_string(source) +
              "; destination: " + (dest == this_node() ? "this node" : to_string(dest)) + "]";
          return refuse(what.c_str());
        }
      }
      break;
    default:
      break;
  }
  const Handle real = library_handle();
  if (real == nullptr) return close_connection;  // basp_guard_active() is false: NodeConfig refused to start
  return real(this, ctx, hdl, hdr, payload);
}

}  // namespace caf::io::basp

namespace troupe::actors {

// libcaf_io's definition was found, and the process's own binding of the symbol is this file's.
bool basp_guard_active() {
  const auto mine = reinterpret_cast<Handle>(::dlsym(RTLD_DEFAULT, kHandleSymbol));
  return library_handle() != nullptr && mine != nullptr && mine != library_handle();
}

uint64_t basp_guard_refused() { return refused.load(); }

bool basp_guard_called() { return called.load(); }

}  // namespace troupe::actors
