#include "coordinator/api_server.hpp"

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "coordinator/api.hpp"
#include "core/error.hpp"
#include "core/json_read.hpp"
#include "core/text.hpp"

namespace troupe::coord {

struct ApiServer::Sockets {
  zmq::context_t ctx{1};
  // Bound before the PUB socket: ZeroMQ refuses a PLAIN handshake while nobody answers ZAP.
  zmq::socket_t zap{ctx, zmq::socket_type::rep};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
};

namespace {

// "tcp://host:port" -> (host, port); other transports -> ("", "").
std::pair<std::string, std::string> split_tcp(const std::string& ep) {
  const std::string scheme = "tcp://";
  if (ep.compare(0, scheme.size(), scheme) != 0) return {"", ""};
  auto rest = ep.substr(scheme.size());
  auto colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, ""};
  return {rest.substr(0, colon), rest.substr(colon + 1)};
}

std::string bindable(const std::string& ep) {
  auto [host, port] = split_tcp(ep);
  if (!host.empty() && port == "0") return "tcp://" + host + ":*";
  return ep;
}

}  // namespace

bool is_loopback_endpoint(const std::string& ep) {
  if (ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0) return true;
  auto [host, port] = split_tcp(ep);
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "[::1]" || host == "::1";
}

ApiServer::ApiServer(ApiOptions options, Handler handler)
    : opt_(std::move(options)), handler_(std::move(handler)) {
  TROUPE_CHECK(!opt_.token.empty(), "the API needs a token that every request and subscriber must carry");
  if (opt_.pub_endpoint.empty()) {
    auto [host, port] = split_tcp(opt_.endpoint);
    TROUPE_CHECK(!host.empty() && !port.empty(), "cannot derive the PUB endpoint from ", opt_.endpoint,
                 "; give it explicitly");
    if (port == "0" || port == "*") {
      opt_.pub_endpoint = "tcp://" + host + ":*";
    } else {
      opt_.pub_endpoint = "tcp://" + host + ":" + std::to_string(std::stoi(port) + 1);
    }
  }
  auto s = std::make_unique<Sockets>();
  s->router.set(zmq::sockopt::maxmsgsize, opt_.max_message_bytes);
  s->router.set(zmq::sockopt::linger, 0);
  s->pub.set(zmq::sockopt::maxmsgsize, opt_.max_subscriber_message_bytes);
  s->pub.set(zmq::sockopt::linger, 0);
  s->pub.set(zmq::sockopt::plain_server, 1);
  s->pub.set(zmq::sockopt::zap_domain, "troupe-events");
  s->zap.set(zmq::sockopt::linger, 0);
  s->zap.set(zmq::sockopt::maxmsgsize, int64_t(64) << 10);
  try {
    s->zap.bind("inproc://zeromq.zap.01");
    s->router.bind(bindable(opt_.endpoint));
    s->pub.bind(bindable(opt_.pub_endpoint));
  } catch (const zmq::error_t& e) {
    TROUPE_CHECK(false, "cannot bind the API (", opt_.endpoint, ", ", opt_.pub_endpoint, "): ", e.what());
  }
  endpoint_ = s->router.get(zmq::sockopt::last_endpoint);
  pub_endpoint_ = s->pub.get(zmq::sockopt::last_endpoint);
  sockets_ = s.release();
  thread_ = std::thread([this] { loop(); });
}

ApiServer::~ApiServer() {
  stop();
  delete sockets_;
}

void ApiServer::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ApiServer::publish(std::string event_json) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event_json));
}

std::string ApiServer::answer(const std::string& payload) {
  // Checked before parsing: nothing of an ill-formed request is echoed back.
  if (auto bad = invalid_utf8_at(payload); bad != std::string::npos)
    return json_text(
        api_error("bad_request", "the request is not valid UTF-8 (byte " + std::to_string(bad) + ")"));
  nlohmann::json req;
  try {
    req = json_read::parse(payload, "the request", api_request_limits());
  } catch (const Error& e) {
    return json_text(api_error("bad_json", e.what()));
  }
  if (!req.is_object()) return json_text(api_error("bad_request", "a request is a JSON object"));
  if (!opt_.token.empty()) {
    auto t = req.find("token");
    if (t == req.end() || !t->is_string() ||
        !constant_time_equal(t->get_ref<const std::string&>(), opt_.token))
      return json_text(
          api_error("unauthorized",
                    "this API requires a valid \"token\" field (troupe clients: --secret-file with "
                    "the cluster secret, or --api-token-file; others: `troupe secret api-token FILE`)"));
  }
  auto op = req.find("op");
  if (op == req.end() || !op->is_string())
    return json_text(api_error("bad_request", "missing string field 'op'"));
  if (*op == "info")
    return json_text(nlohmann::json{{"ok", true}, {"api", endpoint_}, {"pub", pub_endpoint_}});
  return handler_(payload);
}

// One ZAP request (RFC 27): version, request id, domain, address, identity, mechanism, then
// the mechanism's credentials (PLAIN: user name, password). Answered 200 for the token, 400
// for anything else; the reply goes out whatever throws, so no handshake waits for ever.
void ApiServer::answer_zap() {
  auto& zap = sockets_->zap;
  std::vector<zmq::message_t> frames;
  while (true) {
    zmq::message_t m;
    if (!zap.recv(m, zmq::recv_flags::dontwait)) break;
    const bool more = m.more();
    frames.push_back(std::move(m));
    if (!more || frames.size() > 16) break;
  }
  const std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
  const bool ok = frames.size() == 8 && frames[0].to_string_view() == "1.0" &&
                  frames[5].to_string_view() == "PLAIN" &&
                  constant_time_equal(frames[7].to_string(), opt_.token);
  (ok ? admitted_ : refused_).fetch_add(1);
  try {
    zap.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    zap.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    zap.send(ok ? zmq::str_buffer("200") : zmq::str_buffer("400"), zmq::send_flags::sndmore);
    zap.send(ok ? zmq::str_buffer("OK") : zmq::str_buffer("the events need the API token"),
             zmq::send_flags::sndmore);
    zap.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    zap.send(zmq::str_buffer(""), zmq::send_flags::none);
  } catch (const zmq::error_t&) {
  }
}

void ApiServer::loop() {
  auto& router = sockets_->router;
  auto& pub = sockets_->pub;
  while (!stop_.load()) {
    zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                               {sockets_->zap.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, std::chrono::milliseconds(10));
    if (items[1].revents & ZMQ_POLLIN) answer_zap();
    if (items[0].revents & ZMQ_POLLIN) {
      // Envelope: identity, then an empty delimiter for REQ clients (none for
      // DEALER); the last frame is the request.
      std::vector<zmq::message_t> frames;
      while (true) {
        zmq::message_t m;
        if (!router.recv(m, zmq::recv_flags::dontwait)) break;
        bool more = m.more();
        frames.push_back(std::move(m));
        if (!more) break;
      }
      if (frames.size() >= 2) {
        ++requests_;
        std::string reply;
        try {
          reply = answer(frames.back().to_string());
        } catch (const std::exception& e) {
          // A request that trips anything below still gets an answer; the thread serves on.
          reply = json_text(api_error("internal", e.what()));
        }
        try {
          for (size_t i = 0; i + 1 < frames.size(); ++i)
            router.send(zmq::buffer(frames[i].data(), frames[i].size()),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          router.send(zmq::buffer(reply), zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
          // The client went away: its reply is dropped.
        }
      }
    }
    std::deque<std::string> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out.swap(events_);
    }
    for (auto& e : out) pub.send(zmq::buffer(e), zmq::send_flags::dontwait);
  }
}

}  // namespace troupe::coord
