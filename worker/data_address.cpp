#include "worker/data_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <vector>

#include "actors/system.hpp"
#include "core/error.hpp"

namespace troupe::worker {

namespace {

std::string ipv4_text(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {0};
  return inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf) ? buf : "";
}

// (interface name, IPv4 address) of every interface that has one, in getifaddrs order.
std::vector<std::pair<std::string, std::string>> ipv4_interfaces() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> guard(list, freeifaddrs);
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
      out.emplace_back(i->ifa_name, ipv4_text(*reinterpret_cast<const sockaddr_in*>(i->ifa_addr)));
  return out;
}

}  // namespace

std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  // The port only has to be non-zero for connect(); no datagram is ever sent.
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "";
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  std::string out;
  // A UDP connect() only looks the route up and binds the source address to it.
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 && local.sin_addr.s_addr != 0)
    out = ipv4_text(local);
  ::close(fd);
  return out;
}

std::string interface_address(const std::string& name_or_address) {
  const auto interfaces = ipv4_interfaces();
  in_addr parsed{};
  const bool is_address = inet_pton(AF_INET, name_or_address.c_str(), &parsed) == 1;
  for (const auto& [name, address] : interfaces)
    if (is_address ? address == name_or_address : name == name_or_address) return address;
  std::string have;
  std::set<std::string> seen;
  for (const auto& [name, address] : interfaces)
    if (seen.insert(name + address).second) have += (have.empty() ? "" : ", ") + name + " " + address;
  require(false, "--data-interface ", name_or_address, ": ",
          is_address ? "no interface of this host has that address"
                     : "no interface of that name with an IPv4 address",
          " (this host has: ", have.empty() ? "none" : have, ")");
  return "";
}

std::string data_plane_address(const std::string& coordinator_host, const std::string& data_interface) {
  if (!data_interface.empty()) return interface_address(data_interface);
  std::string a = route_source_address(coordinator_host);
  return a.empty() ? actors::host_name() : a;
}

}  // namespace troupe::worker
