#include "core/net_address.hpp"

#include <arpa/inet.h>

namespace troupe {

std::string address_key(const std::string& address) {
  std::string a = address;
  if (a.size() > 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
  in6_addr a6{};
  if (::inet_pton(AF_INET6, a.c_str(), &a6) != 1) return address;
  if (IN6_IS_ADDR_V4MAPPED(&a6)) {
    char v4[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &a6.s6_addr[12], v4, sizeof v4);
    return v4;
  }
  for (int i = 8; i < 16; ++i) a6.s6_addr[i] = 0;
  char buf[INET6_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET6, &a6, buf, sizeof buf);
  return std::string(buf) + "/64";
}

}  // namespace troupe
