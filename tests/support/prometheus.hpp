// A strict reader of the Prometheus text exposition format (0.0.4) for tests:
// what a scraper would refuse, it refuses with the line and why.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::test {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromText {
  std::vector<PromSample> samples;
  std::map<std::string, std::string> types;  // family -> counter | gauge | ...

  // The samples of `name` whose labels include all of `match`.
  std::vector<PromSample> find(const std::string& name,
                               const std::map<std::string, std::string>& match = {}) const {
    std::vector<PromSample> out;
    for (const auto& s : samples) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : match) ok = ok && s.labels.count(k) && s.labels.at(k) == v;
      if (ok) out.push_back(s);
    }
    return out;
  }
  // The one sample of `name` matching `match`; throws when there is not exactly one.
  double value(const std::string& name, const std::map<std::string, std::string>& match = {}) const {
    auto f = find(name, match);
    if (f.size() != 1)
      throw std::runtime_error(name + ": " + std::to_string(f.size()) + " samples match, expected 1");
    return f[0].value;
  }
};

inline bool prom_name_ok(const std::string& n, bool label) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

// Throws std::runtime_error("line N: why") on anything malformed: a bad name, label or
// escape, a value that is not a number, a sample before its family's TYPE, a family
// whose samples are split, a TYPE given twice.
inline PromText parse_prometheus(const std::string& text) {
  PromText out;
  std::istringstream in(text);
  std::string line, current;
  std::set<std::string> closed, seen;
  int no = 0;
  auto fail = [&](const std::string& why) {
    throw std::runtime_error("line " + std::to_string(no) + ": " + why + ": " + line);
  };
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream ls(line);
      std::string hash, kind, name, rest;
      ls >> hash >> kind >> name;
      if (kind != "HELP" && kind != "TYPE") continue;  // a plain comment
      if (!prom_name_ok(name, false)) fail("bad metric name");
      if (kind == "TYPE") {
        ls >> rest;
        if (rest != "counter" && rest != "gauge" && rest != "histogram" && rest != "summary" &&
            rest != "untyped")
          fail("bad type");
        if (out.types.count(name)) fail("TYPE given twice");
        out.types[name] = rest;
        if (!current.empty() && current != name) closed.insert(current);
        current = name;
      }
      continue;
    }
    PromSample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!prom_name_ok(s.name, false)) fail("bad metric name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) fail("label without '='");
        std::string key = line.substr(i, eq - i);
        if (!prom_name_ok(key, true)) fail("bad label name");
        if (eq + 1 >= line.size() || line[eq + 1] != '"') fail("label value not quoted");
        std::string v;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] != '\\') {
            v += line[j];
            continue;
          }
          if (++j >= line.size()) fail("escape at the end");
          if (line[j] == 'n')
            v += '\n';
          else if (line[j] == '\\' || line[j] == '"')
            v += line[j];
          else
            fail("bad escape");
        }
        if (j >= line.size()) fail("unterminated label value");
        if (s.labels.count(key)) fail("label given twice");
        s.labels[key] = v;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) fail("labels not closed");
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') fail("no value");
    const std::string value = line.substr(i + 1);
    if (value == "NaN")
      s.value = NAN;
    else if (value == "+Inf")
      s.value = INFINITY;
    else if (value == "-Inf")
      s.value = -INFINITY;
    else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') fail("value is not a number");
    }
    if (!out.types.count(s.name)) fail("sample before its TYPE");
    if (closed.count(s.name) || s.name != current) fail("samples of a family are split");
    std::string series = s.name;
    for (const auto& [k, v] : s.labels) series += "\x1f" + k + "=" + v;
    if (!seen.insert(series).second) fail("the same series twice");
    out.samples.push_back(std::move(s));
  }
  return out;
}

}  // namespace troupe::test
