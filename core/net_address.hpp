// The unit a per-address limit counts in (the control port's pending handshakes, the
// dashboard's connections): one IPv4 address, or one IPv6 /64, since a single host is
// commonly given a whole /64 and could otherwise take a slot per address.
#pragma once

#include <string>

namespace troupe {

// "10.0.0.7" -> "10.0.0.7"; "::ffff:10.0.0.7" -> "10.0.0.7"; "2001:db8:1:2:a:b:c:d" ->
// "2001:db8:1:2::/64"; "[::1]" as "::1"; text that is no address is returned as it is.
std::string address_key(const std::string& address);

}  // namespace troupe
