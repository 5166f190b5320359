// The request side of the dashboard's HTTP (http_server.hpp) as plain functions,
// with no socket: where a head ends, what it asks or why it is refused, and the
// byte classes that both the parser and the response writer check.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "coordinator/http_server.hpp"

namespace troupe::coord::http {

constexpr size_t kMaxHeaders = 100;

// What a request head asks for, or why it is refused.
struct ParsedHead {
  int status = 0;       // 0: valid, for the handler; otherwise the refusal (400, 405, 413)
  std::string message;  // why, for the refusal's body
  HttpRequest request;  // method, path, query, headers; peer is left to the caller
};

// The length of the head in `in` up to and with the blank line that ends it, or 0
// while there is none yet. Lines end in LF or CRLF. *scan (0 at first) is how far `in`
// has been searched: each call looks at the new bytes only (a blank line is told by the
// bytes before its LF), so a peer sending a byte at a time costs linear work, not
// quadratic in the length of a line.
size_t head_end(const std::string& in, size_t* scan);

// "GET /a%20b?x=1 HTTP/1.1\r\nHost: h\r\n\r\n" (the blank line included) ->
// {0, "", {GET, "/a b", "x=1", {{"host", "h"}}}}; a refusal never has a request
// that anyone should act on. RFC 9112 3.2: an HTTP/1.1 request without a Host, and
// any request with two, is a 400; HTTP/1.0 may leave it out.
ParsedHead parse_head(std::string_view head);

// The host part of a Host header, without its port and an IPv6 literal without its
// brackets, or "" when it is not HOST[:PORT] / [IPv6][:PORT]:
// "127.0.0.1:8080" -> "127.0.0.1", "[::1]:80" -> "::1", "localhost" -> "localhost",
// "::1" (no brackets), "a:b", "[::1]x" -> "".
std::string host_name(std::string_view host_header);

// Percent-decodes s ("%41" -> 'A'; '+' -> ' ' when plus_is_space). strict: a '%'
// without two hex digits after it fails; otherwise it is kept as it is.
bool percent_decode(std::string_view s, bool plus_is_space, bool strict, std::string* out);

// RFC 9110 token: what a method or a header name is made of.
bool is_token(std::string_view s);
// A field value: no control byte but HT, so no CR or LF can split a header.
bool is_field_value(std::string_view s);
std::string lower(std::string s);
std::string_view trim(std::string_view s);  // spaces and tabs at both ends

}  // namespace troupe::coord::http
