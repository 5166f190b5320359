// The transport's guard around cpp-httplib (http_guard.hpp): the threads, the slots and
// the socket stream with its deadlines.
#include "coordinator/http_guard.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace troupe::coord::http {

namespace {

constexpr size_t kMaxDrainBytes = 1 << 20;
// Each 503 holds its connection (and a thread) until the peer has read it: a few per address.
constexpr int kMaxRefusalsPerAddress = 4;

thread_local bool t_on_queue = false;

}  // namespace

int64_t steady_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- ConnectionQueue

void ConnectionQueue::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.emplace_back(std::move(fn));
  // Each idle thread takes one task; a task no idle thread is left for gets a new thread, or
  // past the cap waits for the next thread that is done.
  if (tasks_.size() > idle_ && threads_.size() < max_threads_) threads_.emplace_back([this] { work(); });
  cv_.notify_one();
}

void ConnectionQueue::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    t_on_queue = true;
    try {
      task();
    } catch (...) {
      // The task closes its own socket; nothing here may end the thread early.
    }
    t_on_queue = false;
    lock.lock();
  }
}

void ConnectionQueue::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

bool ConnectionQueue::on_queue_thread() { return t_on_queue; }

// ---------------------------------------------------------------- ConnectionTable

Admission ConnectionTable::admit(const std::string& key, int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  Admission a;
  if (stopping_) return a;

  int slots = 0, mine = 0, mine_503 = 0, answering = 0;
  std::map<std::string, int> held;  // address -> slots (a few dozen entries at most)
  for (const auto& [id, e] : entries_) {
    if (e.answering_503) {
      ++answering;
      mine_503 += e.key == key;
      continue;
    }
    ++slots;
    mine += e.key == key;
    ++held[e.key];
  }
  const bool no_more_503 = mine_503 >= kMaxRefusalsPerAddress || answering >= max_;
  auto add = [&](Admission::Kind kind, std::string message) {
    a.kind = kind;
    a.message = std::move(message);
    if (kind == Admission::drop) return a;
    a.id = next_id_++;
    entries_[a.id] = Entry{key, fd, kind == Admission::refuse, true};
    return a;
  };
  if (mine >= per_address_)
    return no_more_503 ? add(Admission::drop, "")
                       : add(Admission::refuse, "too many connections from " + key + " (at most " +
                                                    std::to_string(per_address_) + "); try again");
  if (slots < max_) return add(Admission::slot, "");
  // Every slot is taken: the address holding the most gives one up, if it holds more than the
  // newcomer would. Its oldest connection still waiting for a whole request goes.
  auto busiest = std::max_element(held.begin(), held.end(),
                                  [](const auto& x, const auto& y) { return x.second < y.second; });
  if (busiest != held.end() && busiest->second > mine + 1) {
    // entries_ is ordered by id, the order of accept: the first found is the oldest.
    auto oldest = std::find_if(entries_.begin(), entries_.end(), [&](const auto& entry) {
      const Entry& e = entry.second;
      return !e.answering_503 && e.waiting && e.key == busiest->first;
    });
    if (oldest != entries_.end()) {
      // Its thread sees the peer gone and closes it; the slot is free from now on.
      ::shutdown(oldest->second.fd, SHUT_RDWR);
      entries_.erase(oldest);
      return add(Admission::slot, "");
    }
  }
  return no_more_503 ? add(Admission::drop, "") : add(Admission::refuse, "too many connections; try again");
}

void ConnectionTable::waiting_done(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.waiting = false;
}

void ConnectionTable::release(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(id);
}

void ConnectionTable::stop_all() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  for (const auto& [id, e] : entries_) ::shutdown(e.fd, SHUT_RDWR);
}

bool ConnectionTable::reserve(size_t bytes, size_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > limit - std::min(inflight_, limit)) return false;
  inflight_ += bytes;
  return true;
}

void ConnectionTable::give_back(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  inflight_ -= std::min(bytes, inflight_);
}

// ---------------------------------------------------------------- DeadlineStream

bool DeadlineStream::wait(short events, int64_t deadline) const {
  for (;;) {
    const int64_t left = deadline - steady_ms();
    if (left <= 0) return false;
    pollfd p{c_.fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60000)));
    if (n > 0) return true;  // ready, or an error / hang-up the next call reports
    if (n < 0 && errno != EINTR) return false;
  }
}

bool DeadlineStream::is_readable() const { return at_ < len_ || wait(POLLIN, c_.head_deadline); }

bool DeadlineStream::is_writable() const {
  return !c_.cut_off && !c_.peer_gone &&
         wait(POLLOUT,
              write_deadline_ != 0 ? write_deadline_ : steady_ms() + std::max<int64_t>(c_.answer_ms, 1));
}

ssize_t DeadlineStream::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  if (c_.head_bytes >= c_.head_limit) {
    c_.too_large = true;
    return -1;
  }
  size = std::min(size, c_.head_limit - c_.head_bytes);
  while (at_ == len_) {
    if (c_.peer_gone) return 0;
    if (!wait(POLLIN, c_.head_deadline)) {
      c_.timed_out = true;
      return -1;
    }
    const ssize_t n = ::recv(c_.fd, buf_, sizeof buf_, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) {
      c_.peer_gone = true;  // closed, reset, or shut down to make room for a newcomer
      return n == 0 ? 0 : -1;
    }
    at_ = 0;
    len_ = static_cast<size_t>(n);
  }
  const size_t k = std::min(size, len_ - at_);
  std::memcpy(ptr, buf_ + at_, k);
  at_ += k;
  c_.head_bytes += k;
  return static_cast<ssize_t>(k);
}

ssize_t DeadlineStream::write(const char* ptr, size_t size) {
  if (c_.cut_off || c_.peer_gone) return -1;
  if (write_deadline_ == 0) write_deadline_ = steady_ms() + std::max<int64_t>(c_.answer_ms, 1);
  for (;;) {
    const ssize_t n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      if (n > 0 && !c_.wrote) {
        c_.wrote = true;
        if (c_.answered != nullptr) c_.answered->fetch_add(1);
      }
      return n;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      c_.peer_gone = true;  // EPIPE, ECONNRESET
      return -1;
    }
    if (!wait(POLLOUT, write_deadline_)) {
      c_.cut_off = true;  // a peer that does not take its answer in time
      return -1;
    }
  }
}

namespace {

// The address of `fd`'s peer (getpeername) or of its own end (getsockname), as the library
// wants it: "127.0.0.1" or "::1" (no brackets), and the port; "" and -1 when unknown.
void ip_and_port(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ip.clear();
  port = -1;
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return;
  const std::string a = format_address(ss);
  const size_t colon = a.rfind(':');
  ip = a.substr(0, colon);
  if (ip.size() > 2 && ip.front() == '[') ip = ip.substr(1, ip.size() - 2);
  port = std::atoi(a.c_str() + colon + 1);
}

}  // namespace

void DeadlineStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip_and_port(c_.fd, true, ip, port);
}

void DeadlineStream::get_local_ip_and_port(std::string& ip, int& port) const {
  ip_and_port(c_.fd, false, ip, port);
}

// ---------------------------------------------------------------- refusals and the close

void write_refusal(Connection& c, int status, const std::string& json_body) {
  const char* reason = status == 503   ? "Service Unavailable"
                       : status == 431 ? "Request Header Fields Too Large"
                       : status == 408 ? "Request Timeout"
                                       : "";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  out +=
      "Content-Type: application/json; charset=utf-8\r\nContent-Length: " + std::to_string(json_body.size()) +
      "\r\nConnection: close\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
      "Referrer-Policy: no-referrer\r\n\r\n" +
      json_body;
  DeadlineStream s(c);
  for (size_t at = 0; at < out.size();) {
    const ssize_t n = s.write(out.data() + at, out.size() - at);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

void wind_down(Connection& c, int linger_ms) {
  if (c.cut_off) {
    // An RST, so that the kernel drops the answer's unsent bytes too, rather than keeping
    // them for a peer that has shown it will not take them.
    const linger reset{1, 0};
    ::setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  } else if (!c.peer_gone && ::shutdown(c.fd, SHUT_WR) == 0) {
    const int64_t until = steady_ms() + linger_ms;
    size_t drained = 0;
    char buf[16384];
    for (int64_t left; drained <= kMaxDrainBytes && (left = until - steady_ms()) > 0;) {
      pollfd p{c.fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      if (n > 0) drained += static_cast<size_t>(n);
    }
  }
}

std::string format_address(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
}

}  // namespace troupe::coord::http
