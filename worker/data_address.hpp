// The address a worker's data plane (gloo TCP) listens on and tells its peers.
//
// By default it is this host's end of the route toward the coordinator: the
// address the coordinator (and so, on a flat network, every other host) reaches
// this host by. 127.0.0.1 when the coordinator is on loopback; 10.77.0.2 for a
// host whose eth0 is 10.77.0.2/24 and a coordinator at 10.77.0.1. host_name()
// can resolve to another interface (or to 127.0.1.1 from /etc/hosts), so it is
// only the last resort. `troupe agent --data-interface` picks it explicitly.
#pragma once

#include <string>

namespace troupe::worker {

// The local source address of the IPv4 route toward `host` (a name or an
// address): a UDP socket connect() and getsockname(), which sends no packet.
// "" when the host does not resolve or has no route.
std::string route_source_address(const std::string& host);

// The IPv4 address of `name_or_address`: an interface name ("eth0": its first
// IPv4 address) or an IPv4 address that one of this host's interfaces holds.
// Throws troupe::Error naming the interfaces there are when neither matches.
std::string interface_address(const std::string& name_or_address);

// The data-plane address: interface_address(data_interface) when one is given,
// else route_source_address(coordinator_host), else host_name().
std::string data_plane_address(const std::string& coordinator_host, const std::string& data_interface);

}  // namespace troupe::worker
