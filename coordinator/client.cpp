#include "coordinator/client.hpp"

#include <zmq.hpp>

#include "coordinator/api.hpp"

namespace troupe::coord {

nlohmann::json api_call(const ClientOptions& o, nlohmann::json request) {
  if (!o.token.empty()) request["token"] = o.token;
  zmq::context_t ctx{1};
  // DEALER, not REQ: a lost reply must not wedge the socket.
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  sock.set(zmq::sockopt::linger, 0);
  try {
    sock.connect(o.endpoint);
    sock.send(zmq::buffer(request.dump()), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return api_error("unreachable", "cannot send to " + o.endpoint + ": " + e.what());
  }
  zmq::pollitem_t items[] = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, o.timeout);
  if (!(items[0].revents & ZMQ_POLLIN))
    return api_error("unreachable", "no reply from " + o.endpoint + " within " +
                                        std::to_string(o.timeout.count()) +
                                        " ms (is the coordinator running?)");
  zmq::message_t reply;
  (void)sock.recv(reply, zmq::recv_flags::none);
  auto j = nlohmann::json::parse(reply.to_string(), nullptr, false);
  if (j.is_discarded()) return api_error("bad_reply", "the reply is not JSON");
  return j;
}

bool watch_events(const std::string& pub_endpoint, const std::function<bool(const nlohmann::json&)>& on_event,
                  std::chrono::milliseconds idle_timeout) {
  zmq::context_t ctx{1};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect(pub_endpoint);
  while (true) {
    zmq::pollitem_t items[] = {{sub.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 1, idle_timeout);
    if (!(items[0].revents & ZMQ_POLLIN)) return false;
    zmq::message_t m;
    (void)sub.recv(m, zmq::recv_flags::none);
    auto j = nlohmann::json::parse(m.to_string(), nullptr, false);
    if (j.is_discarded()) continue;
    if (!on_event(j)) return true;
  }
}

}  // namespace troupe::coord
