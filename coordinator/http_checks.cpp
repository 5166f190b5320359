// The transport's checks on a request the library has read (http_checks.hpp). Strict
// where RFC 9112 allows a choice: what a lenient reader would guess at is refused.
#include "coordinator/http_checks.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "coordinator/http_server.hpp"
#include "core/text.hpp"

namespace troupe::coord {

namespace http {

namespace {

bool is_tchar(unsigned char c) { return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Refusal refuse(int status, std::string message) { return Refusal{status, std::move(message)}; }

bool all_digits(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c != 0 && is_tchar(c); });
}

bool is_field_value(std::string_view s) {
  return std::none_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c < 0x20 && c != '\t') || c == 0x7f;
  });
}

bool valid_escapes(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '%') {
      if (i + 2 >= s.size() || hex_value(s[i + 1]) < 0 || hex_value(s[i + 2]) < 0) return false;
      i += 2;
    }
  return true;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const int hi = s[i] == '%' && i + 2 < s.size() ? hex_value(s[i + 1]) : -1;
    const int lo = hi >= 0 ? hex_value(s[i + 2]) : -1;
    if (lo >= 0) {
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Refusal check_target(std::string_view target) {
  if (target.empty() || target[0] != '/') return refuse(400, "the request target must be a path ('/...')");
  for (char ch : target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f || c == '#')
      return refuse(400, "the request target holds a control, space, '#' or non-ASCII byte");
  }
  const size_t q = target.find('?');
  const std::string_view raw_path = target.substr(0, q);
  const std::string_view query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  if (!valid_escapes(query) || query.find("%00") != std::string_view::npos)
    return refuse(400, "the query holds a bad percent escape");
  if (!valid_escapes(raw_path)) return refuse(400, "the path holds a bad percent escape");
  const std::string path = percent_decode(raw_path);
  for (char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return refuse(400, "the decoded path holds a control byte (%00 or the like)");
  }
  if (!valid_utf8(path)) return refuse(400, "the decoded path is not UTF-8");
  const bool ends_dotdot = path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0;
  if (path.find("/../") != std::string::npos || ends_dotdot || path == "/..")
    return refuse(400, "the path climbs out of its folder ('/../')");
  return {};
}

Refusal check_headers(const std::vector<std::pair<std::string, std::string>>& headers, bool http11) {
  if (headers.size() > kMaxHeaders)
    return refuse(400, "more than " + std::to_string(kMaxHeaders) + " headers");
  int hosts = 0;
  std::string length;
  for (const auto& [name, value] : headers) {
    if (!is_token(name)) return refuse(400, "a header line is not 'name: value' with a token name");
    if (!is_field_value(value)) return refuse(400, "a header value holds a control byte");
    const std::string n = lower(name);
    hosts += n == "host";
    if (n == "transfer-encoding") return refuse(413, "this server takes no request bodies");
    if (n != "content-length") continue;
    const auto v = trim(value);
    if (v.empty() || v.size() > 18 || !all_digits(v) || (!length.empty() && length != v))
      return refuse(400, "a bad Content-Length");
    length = std::string(v);
  }
  if (!length.empty() && std::stoll(length) > 0) return refuse(413, "this server takes no request bodies");
  if (hosts > 1) return refuse(400, "more than one Host header");
  if (hosts == 0 && http11) return refuse(400, "an HTTP/1.1 request needs a Host header");
  return {};
}

std::string host_name(std::string_view h) {
  std::string_view host = h, rest;
  if (!h.empty() && h[0] == '[') {
    const size_t close = h.find(']');
    if (close == std::string_view::npos || close < 2) return "";
    host = h.substr(1, close - 1);
    rest = h.substr(close + 1);
  } else {
    const size_t colon = h.find(':');
    host = h.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : h.substr(colon);
  }
  // What follows the host is nothing or ":PORT", the port digits only (RFC 3986 allows it empty).
  const bool port_ok = rest.empty() || (rest[0] == ':' && all_digits(rest.substr(1)));
  return port_ok ? std::string(host) : "";
}

}  // namespace http

bool is_loopback_host(const std::string& host) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (http::lower(h) == "localhost") return true;
  in_addr a4{};
  if (::inet_pton(AF_INET, h.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, h.c_str(), &a6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;  // ::ffff:127.x.y.z
}

}  // namespace troupe::coord
