// The request parser (http_parse.hpp). Strict where RFC 9112 allows a choice:
// what a lenient parser would guess at is refused, so that the server never reads
// a request differently from a proxy in front of it.
#include "coordinator/http_parse.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "core/text.hpp"

namespace troupe::coord {
using namespace http;

namespace {

bool is_tchar(unsigned char c) { return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

ParsedHead refuse(int status, std::string message) {
  ParsedHead p;
  p.status = status;
  p.message = std::move(message);
  return p;
}

// The request target "/a%20b/c?x=1": checked byte by byte, split at '?', the path
// decoded and checked again, since "%2e%2e" and "%2f" only show after decoding.
ParsedHead parse_target(std::string_view target) {
  ParsedHead p;
  if (target.empty() || target[0] != '/') return refuse(400, "the request target must be a path ('/...')");
  for (char ch : target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f || c == '#')
      return refuse(400, "the request target holds a control, space, '#' or non-ASCII byte");
  }
  const size_t q = target.find('?');
  const std::string_view raw_path = target.substr(0, q);
  const std::string_view query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  std::string scratch;
  if (!percent_decode(query, true, true, &scratch) || query.find("%00") != std::string_view::npos)
    return refuse(400, "the query holds a bad percent escape");
  auto& path = p.request.path;
  if (!percent_decode(raw_path, false, true, &path))
    return refuse(400, "the path holds a bad percent escape");
  for (char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return refuse(400, "the decoded path holds a control byte (%00 or the like)");
  }
  if (!valid_utf8(path)) return refuse(400, "the decoded path is not UTF-8");
  const bool ends_dotdot = path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0;
  if (path.find("/../") != std::string::npos || ends_dotdot)
    return refuse(400, "the path climbs out of its folder ('/../')");
  p.request.query = std::string(query);
  return p;
}

// A header block line "Name: value" (the line end removed) into p->request.headers.
bool parse_header_line(std::string_view line, ParsedHead* p) {
  if (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
    *p = refuse(400, "obsolete header line folding is not accepted");
    return false;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
    *p = refuse(400, "a header line is not 'name: value' with a token name");
    return false;
  }
  const auto value = trim(line.substr(colon + 1));
  if (!is_field_value(value)) {
    *p = refuse(400, "a header value holds a control byte");
    return false;
  }
  if (p->request.headers.size() == kMaxHeaders) {
    *p = refuse(400, "more than " + std::to_string(kMaxHeaders) + " headers");
    return false;
  }
  p->request.headers.emplace_back(lower(std::string(line.substr(0, colon))), std::string(value));
  return true;
}

// The server takes no bodies: a request that announces one is refused (413), and
// one whose length cannot be read is malformed (400): either way the bytes after
// the head are never read as a request.
ParsedHead check_no_body(ParsedHead p) {
  std::string length;
  for (const auto& [name, value] : p.request.headers) {
    if (name == "transfer-encoding") return refuse(413, "this server takes no request bodies");
    if (name != "content-length") continue;
    const bool digits = !value.empty() && value.size() <= 18 &&
                        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || (!length.empty() && length != value)) return refuse(400, "a bad Content-Length");
    length = value;
  }
  if (!length.empty() && std::stoll(length) > 0) return refuse(413, "this server takes no request bodies");
  return p;
}

}  // namespace

namespace http {

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c != 0 && is_tchar(c); });
}
bool is_field_value(std::string_view s) {
  return std::none_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c < 0x20 && c != '\t') || c == 0x7f;
  });
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

bool percent_decode(std::string_view s, bool plus_is_space, bool strict, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      const int hi = i + 2 < s.size() ? hex_value(s[i + 1]) : -1;
      const int lo = i + 2 < s.size() ? hex_value(s[i + 2]) : -1;
      if (hi >= 0 && lo >= 0) {
        out->push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
      if (strict) return false;
    }
    out->push_back(plus_is_space && s[i] == '+' ? ' ' : s[i]);
  }
  return true;
}

size_t head_end(const std::string& in, size_t* scan) {
  for (;;) {
    const size_t nl = in.find('\n', *scan);
    if (nl == std::string::npos) {
      *scan = in.size();
      return 0;
    }
    *scan = nl + 1;
    // The line this LF ends is blank when it starts the input or follows another LF,
    // with or without a CR between: "\n", "\r\n", "...\n\n", "...\n\r\n".
    const size_t start = nl > 0 && in[nl - 1] == '\r' ? nl - 1 : nl;
    if (start == 0 || in[start - 1] == '\n') return nl + 1;
  }
}

ParsedHead parse_head(std::string_view head) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  for (size_t nl; (nl = head.find('\n', start)) != std::string_view::npos; start = nl + 1) {
    auto line = head.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
  }
  lines.pop_back();  // the blank line
  if (lines.empty()) return refuse(400, "an empty request line");

  const std::string_view rl = lines[0];
  const size_t sp1 = rl.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || rl.find(' ', sp2 + 1) != std::string_view::npos)
    return refuse(400, "the request line is not 'METHOD /path HTTP/1.x'");
  const auto method = rl.substr(0, sp1);
  const auto version = rl.substr(sp2 + 1);
  const bool http1 =
      version.size() == 8 && version.substr(0, 7) == "HTTP/1." && version[7] >= '0' && version[7] <= '9';
  if (!is_token(method) || !http1) return refuse(400, "the request line is not 'METHOD /path HTTP/1.x'");

  ParsedHead p = parse_target(rl.substr(sp1 + 1, sp2 - sp1 - 1));
  if (p.status != 0) return p;
  p.request.method = std::string(method);
  for (size_t i = 1; i < lines.size(); ++i)
    if (!parse_header_line(lines[i], &p)) return p;
  if (method != "GET" && method != "HEAD") return refuse(405, "this server answers GET and HEAD only");
  p = check_no_body(std::move(p));
  if (p.status != 0) return p;
  const auto hosts = std::count_if(p.request.headers.begin(), p.request.headers.end(),
                                   [](const auto& h) { return h.first == "host"; });
  if (hosts > 1) return refuse(400, "more than one Host header");
  if (hosts == 0 && version[7] >= '1') return refuse(400, "an HTTP/1.1 request needs a Host header");
  return p;
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
  const bool port_ok =
      rest.empty() || (rest[0] == ':' && std::all_of(rest.begin() + 1, rest.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; }));
  return port_ok ? std::string(host) : "";
}

}  // namespace http

std::string HttpRequest::query_param(const std::string& key) const {
  std::string k, v;
  for (size_t start = 0; start <= query.size();) {
    size_t amp = query.find('&', start);
    if (amp == std::string::npos) amp = query.size();
    const std::string_view pair(query.data() + start, amp - start);
    const size_t eq = pair.find('=');
    percent_decode(pair.substr(0, eq), true, false, &k);
    if (k == key) {
      if (eq != std::string_view::npos) percent_decode(pair.substr(eq + 1), true, false, &v);
      return eq == std::string_view::npos ? "" : v;
    }
    start = amp + 1;
  }
  return "";
}

std::string HttpRequest::header(const std::string& name) const {
  const std::string n = lower(name);
  for (const auto& [k, v] : headers)
    if (k == n) return v;
  return "";
}

}  // namespace troupe::coord
