// What the dashboard's HTTP transport adds to cpp-httplib (http_server.hpp) so that no
// peer can hold it: the library reads the request line and headers, routes and writes the
// answer; this layer accepts, decides on the accepting thread (so in the order of accept,
// with no thread waiting for another) which connection gets a slot, gives each one a
// thread, and a socket stream with deadlines and a bound on its head.
//
//   ConnectionQueue   a thread per connection (up to a cap; then in order of arrival);
//   ConnectionTable   the slots: a cap, each address's share, and the fair share (a
//                     newcomer whose address holds fewer slots than the busiest takes
//                     that address's oldest connection still waiting for its request);
//                     and the bytes of answers being written, all connections together;
//   DeadlineStream    the socket as the library reads and writes it: the whole head within
//                     its deadline and its byte limit, the whole answer within its own.
//
// The library's own timeouts (set_read_timeout, set_write_timeout) bound each wait for
// one read or write; a peer sending a byte a second never meets them. The deadlines
// here bound the whole head and the whole answer instead.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe::coord::http {

int64_t steady_ms();

// ---------------------------------------------------------------- the threads

// A thread per task, up to `max_threads` (then tasks wait their turn, first come first
// served); idle threads are kept for the next task.
class ConnectionQueue {
 public:
  explicit ConnectionQueue(size_t max_threads) : max_threads_(max_threads) {}
  ~ConnectionQueue() { shutdown(); }
  ConnectionQueue(const ConnectionQueue&) = delete;
  ConnectionQueue& operator=(const ConnectionQueue&) = delete;
  void enqueue(std::function<void()> fn);
  // Runs what is still queued (each task closes its socket), then joins every thread.
  void shutdown();
  // Whether the calling thread is one of a queue's.
  static bool on_queue_thread();

 private:
  void work();

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

// ---------------------------------------------------------------- the slots

struct Admission {
  enum Kind { slot, refuse, drop } kind = drop;  // refuse: answer 503 (message); drop: close unanswered
  std::string message;
  uint64_t id = 0;  // for waiting_done() and release()
};

class ConnectionTable {
 public:
  ConnectionTable(int max_connections, int max_per_address)
      : max_(max_connections), per_address_(max_per_address) {}

  // Whether a connection of address `key` (core/net_address.hpp) on socket `fd` gets a slot,
  // asked by the accepting thread in the order of accept. When every slot is taken, the
  // busiest address's oldest connection still waiting for its request is shut down (its
  // thread sees the peer gone) to make room, if that address holds more than the newcomer's
  // would. A connection answered 503 is held too, until it is closed: a few per address and
  // max_connections in all; past that a connection is dropped unanswered.
  Admission admit(const std::string& key, int fd);
  // The request has arrived whole: the connection is no longer one to give up for a newcomer.
  void waiting_done(uint64_t id);
  void release(uint64_t id);  // before its socket is closed
  // Shuts down every connection's socket and admits nobody from now on.
  void stop_all();

  // Bytes of answers being written, all connections together: false (nothing taken) when
  // `bytes` more would pass `limit`.
  bool reserve(size_t bytes, size_t limit);
  void give_back(size_t bytes);

 private:
  struct Entry {
    std::string key;
    int fd = -1;
    bool answering_503 = false;
    bool waiting = true;  // for its request
  };

  const int max_, per_address_;
  std::mutex mu_;
  uint64_t next_id_ = 1;  // in the order of accept: the oldest entry has the smallest
  bool stopping_ = false;
  std::map<uint64_t, Entry> entries_;
  size_t inflight_ = 0;
};

// ---------------------------------------------------------------- the socket

// One connection as DeadlineStream sees it, and what became of it.
struct Connection {
  int fd = -1;
  std::string peer;           // "127.0.0.1:53422", "[::1]:53422"
  int64_t head_deadline = 0;  // steady ms: the whole head by then
  size_t head_limit = 0;      // bytes of head the library may read
  int64_t answer_ms = 0;      // time for the whole answer from its first byte; set before it is written
  std::atomic<int64_t>* answered = nullptr;  // counted once, at the answer's first byte

  // What happened.
  size_t head_bytes = 0;  // handed to the library
  bool too_large = false, timed_out = false, peer_gone = false, cut_off = false;
  bool wrote = false;
  bool decided = false;  // the transport chose the answer (not one of the library's refusals)
  size_t held = 0;       // bytes of its answer counted in ConnectionTable::reserve
};

class DeadlineStream : public httplib::Stream {
 public:
  explicit DeadlineStream(Connection& c) : c_(c) {}
  bool is_readable() const override;
  bool is_writable() const override;
  // Up to `size` bytes of the head: -1 once the head has its limit (too_large), past its
  // deadline (timed_out), or on a socket error; 0 when the peer has closed.
  ssize_t read(char* ptr, size_t size) override;
  // -1 once the answer is past its deadline (cut_off: the socket will be reset) or the peer
  // is gone.
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return c_.fd; }

 private:
  bool wait(short events, int64_t deadline) const;

  Connection& c_;
  int64_t write_deadline_ = 0;
  char buf_[4096];
  size_t at_ = 0, len_ = 0;
};

// The refusals written before the library has read a request (a 503 at admission, a 431 or
// 408 for a request line that is too long or late): the whole answer, with the headers of
// every answer, through the stream's write deadline.
void write_refusal(Connection& c, int status, const std::string& json_body);

// After the answer: FIN, then what the peer still sends is read and dropped for a moment
// (at most linger_ms and 1 MiB), so that the close is no RST that could make the peer lose
// the answer unread; an answer cut off is set to be reset at close instead. The socket
// stays open for the caller to close.
void wind_down(Connection& c, int linger_ms);

// "127.0.0.1:53422" or "[::1]:53422" of a socket address.
std::string format_address(const sockaddr_storage& ss);

}  // namespace troupe::coord::http
