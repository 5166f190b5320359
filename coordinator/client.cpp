#include "coordinator/client.hpp"

#include <zmq.hpp>

#include "coordinator/api.hpp"
#include "core/json_read.hpp"

namespace troupe::coord {

nlohmann::json api_call(const ClientOptions& o, nlohmann::json request) {
  if (!o.token.empty()) request["token"] = o.token;
  zmq::context_t ctx{1};
  // DEALER, not REQ: a lost reply must not wedge the socket.
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::maxmsgsize, kMaxReplyBytes);
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
  try {
    return json_read::parse(reply.to_string_view(), "the reply", api_reply_limits());
  } catch (const Error& e) {
    return api_error("bad_reply", e.what());
  }
}

WatchEnd watch_events(const std::string& pub_endpoint, const std::string& token,
                      const std::function<bool(const nlohmann::json&)>& on_event,
                      std::chrono::milliseconds idle_timeout) {
  zmq::context_t ctx{1};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::maxmsgsize, kMaxReplyBytes);
  sub.set(zmq::sockopt::plain_username, "troupe");
  sub.set(zmq::sockopt::plain_password, token);
  sub.set(zmq::sockopt::subscribe, "");
  // The handshake's outcome: a refused token is said, not mistaken for a quiet coordinator.
  const std::string monitor_endpoint = "inproc://troupe-watch-monitor";
  zmq_socket_monitor(sub.handle(), monitor_endpoint.c_str(),
                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
  zmq::socket_t monitor{ctx, zmq::socket_type::pair};
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(monitor_endpoint);
  sub.connect(pub_endpoint);
  while (true) {
    zmq::pollitem_t items[] = {{sub.handle(), 0, ZMQ_POLLIN, 0}, {monitor.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, idle_timeout);
    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t event, address;
      (void)monitor.recv(event, zmq::recv_flags::none);
      if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
      return WatchEnd::refused;
    }
    if (!(items[0].revents & ZMQ_POLLIN)) return WatchEnd::idle;
    zmq::message_t m;
    (void)sub.recv(m, zmq::recv_flags::none);
    nlohmann::json j;
    try {
      j = json_read::parse(m.to_string_view(), "an event", api_reply_limits());
    } catch (const Error&) {
      continue;  // not an event of ours
    }
    if (!on_event(j)) return WatchEnd::stopped;
  }
}

}  // namespace troupe::coord
