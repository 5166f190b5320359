// What the dashboard's HTTP transport (http_server.hpp) refuses in a request the
// library has read, and in an answer a handler gives, as plain functions with no socket
// and no library type. The request line and headers are cpp-httplib's reading; these
// checks are the policy on top: a read-only server (GET and HEAD, no request bodies)
// that sees a path only once it is known not to climb out of its folder.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::coord::http {

constexpr size_t kMaxHeaders = 100;

// A refusal (status 400, 405, 413 ...) and why, for its body; status 0 when none.
struct Refusal {
  int status = 0;
  std::string message;
  explicit operator bool() const { return status != 0; }
};

// The request target as sent, before any decoding ("/a%20b?x=1"; a fragment already cut
// off by the library): a path of visible ASCII with strict percent escapes ('%' and two
// hex digits), a query without %00, and a decoded path with no control byte, in UTF-8,
// that does not climb ("/../", a trailing "/.."). "%2e%2e" and "%2f" are decoded first.
Refusal check_target(std::string_view target);

// The head's headers as read (names as sent, values as the library gives them): names
// are RFC 9110 tokens, values hold no control byte but HT, at most kMaxHeaders; one Host
// at most, and one at least in HTTP/1.1 (RFC 9112 3.2); no body announced (a
// Transfer-Encoding or a Content-Length above 0 is 413, a Content-Length that is not one
// number is 400).
Refusal check_headers(const std::vector<std::pair<std::string, std::string>>& headers, bool http11);

// The host part of a Host header, without its port and an IPv6 literal without its
// brackets, or "" when it is not HOST[:PORT] / [IPv6][:PORT]:
// "127.0.0.1:8080" -> "127.0.0.1", "[::1]:80" -> "::1", "localhost" -> "localhost",
// "::1" (no brackets), "a:b", "[::1]x" -> "".
std::string host_name(std::string_view host_header);

// RFC 9110 token: what a method or a header name is made of.
bool is_token(std::string_view s);
// A field value: no control byte but HT, so no CR or LF can split a header.
bool is_field_value(std::string_view s);
// Every '%' is followed by two hex digits.
bool valid_escapes(std::string_view s);
// "%41" -> 'A'; a '%' without two hex digits after it is kept as it is.
std::string percent_decode(std::string_view s);
std::string lower(std::string s);
std::string_view trim(std::string_view s);  // spaces and tabs at both ends

}  // namespace troupe::coord::http
