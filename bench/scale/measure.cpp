#include "bench/scale/measure.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <zmq.hpp>

#include "bench/scale/sim.hpp"
#include "core/json_read.hpp"

namespace troupe::scale {

Child::Child(const std::vector<std::string>& argv, const std::string& log, bool pipes, int nice) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipes && (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)) return;
  std::vector<std::string> a = argv;
  std::vector<char*> args;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // nothing outlives the driver
    if (getppid() != parent) _exit(127);
    if (nice != 0) (void)setpriority(PRIO_PROCESS, 0, nice);  // before exec: every thread inherits it
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (pipes) {
      dup2(in[0], 0);
      dup2(out[1], 1);
    } else if (fd >= 0) {
      dup2(fd, 1);
    }
    if (fd >= 0) dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  if (pipes) {
    ::close(in[0]);
    ::close(out[1]);
    in_ = in[1];
    out_ = out[0];
  }
}

Child::~Child() {
  if (in_ >= 0) ::close(in_);
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) ::close(out_);
}

void Child::send_line(const std::string& line) {
  if (in_ < 0) return;
  const std::string l = line + "\n";
  size_t done = 0;
  while (done < l.size()) {
    const ssize_t n = ::write(in_, l.data() + done, l.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void Child::close_stdin() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

int Child::wait(int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!reaped_) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped_ = true;
      code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (std::chrono::steady_clock::now() > end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return code_;
}

double cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = s.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(s.substr(paren + 2));
  std::string field;
  double ticks = 0;
  // Fields 3.. after the name; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double self_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

namespace {
int64_t status_kib(int pid, const char* key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size()));
  return 0;
}
}  // namespace

int64_t rss_kib(int pid) { return status_kib(pid, "VmRSS:"); }
int64_t peak_rss_kib(int pid) { return status_kib(pid, "VmHWM:"); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

HttpResult http_get(const std::string& host_port, const std::string& path) {
  HttpResult r;
  const auto colon = host_port.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &a.sin_addr);
  const int64_t t0 = now_ns();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    r.error = "cannot connect to " + host_port;
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host_port + "\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  r.ms = (now_ns() - t0) / 1e6;
  const auto head_end = got.find("\r\n\r\n");
  if (got.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) {
    r.error = "no HTTP answer";
    return r;
  }
  r.status = std::stoi(got.substr(9, 3));
  r.bytes = got.size() - head_end - 4;
  r.ok = r.status == 200;
  return r;
}

double realtime_ms_at(int64_t mono_ns) {
  timespec rt{}, mt{};
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mt);
  const double offset_ms = (rt.tv_sec - mt.tv_sec) * 1000.0 + (rt.tv_nsec - mt.tv_nsec) / 1e6;
  return mono_ns / 1e6 + offset_ms;
}

EventFeed::EventFeed(std::string endpoint, std::string token,
                     std::function<void(const nlohmann::json&, int64_t)> on_event) {
  thread_ = std::thread([this, endpoint, token, on_event] {
    zmq::context_t ctx{1};
    zmq::socket_t sub{ctx, zmq::socket_type::sub};
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvhwm, 0);  // never drop: the driver keeps up or falls behind, not loses
    sub.set(zmq::sockopt::plain_username, "troupe");
    sub.set(zmq::sockopt::plain_password, token);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(endpoint);
    json_read::Limits limits;
    limits.max_bytes = uint64_t(256) << 20;
    limits.max_depth = 64;
    while (!stop_) {
      zmq::pollitem_t items[] = {{sub.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(100));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      zmq::message_t m;
      (void)sub.recv(m, zmq::recv_flags::none);
      const int64_t t = now_ns();
      try {
        on_event(json_read::parse(m.to_string_view(), "an event", limits), t);
      } catch (const std::exception&) {
      }
    }
  });
}

EventFeed::~EventFeed() {
  stop_ = true;
  thread_.join();
}

}  // namespace troupe::scale
