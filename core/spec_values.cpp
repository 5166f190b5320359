// The typed getters of a Section: each reads one value, checks its type and range, and on a bad
// value says what was expected, what was found and how to write it.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "core/spec_internal.hpp"

namespace troupe::spec_detail {

namespace {

bool is_bool_word(const std::string& s) {
  static const std::set<std::string> w = {"true", "True", "TRUE", "false", "False", "FALSE",
                                          "yes",  "Yes",  "YES",  "no",    "No",    "NO",
                                          "on",   "On",   "ON",   "off",   "Off",   "OFF"};
  return w.count(s) > 0;
}

// A plain decimal integer: optional sign, digits, nothing else.
enum class IntParse { ok, not_integer, looks_fractional, overflow };
IntParse parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return IntParse::not_integer;
  size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
  if (i == s.size()) return IntParse::not_integer;
  bool digits_only = true;
  for (size_t j = i; j < s.size(); ++j) digits_only &= (s[j] >= '0' && s[j] <= '9');
  if (!digits_only) {
    double d;
    const char* b = s.data() + (s[0] == '+' ? 1 : 0);
    auto r = std::from_chars(b, s.data() + s.size(), d);
    if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return IntParse::looks_fractional;
    return IntParse::not_integer;
  }
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  auto r = std::from_chars(b, s.data() + s.size(), out);
  if (r.ec == std::errc::result_out_of_range) return IntParse::overflow;
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return IntParse::not_integer;
  return IntParse::ok;
}

bool parse_real(std::string s, double& out) {
  if (s.empty()) return false;
  if (s[0] == '+') s.erase(0, 1);
  if (s.size() >= 2 && s[0] == '.' && s[1] >= '0' && s[1] <= '9') s.insert(0, "0");
  if (s.size() >= 3 && s[0] == '-' && s[1] == '.') s.insert(1, "0");
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::string range_text(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return "valid values: " + std::to_string(lo) + " or more";
  return "valid range: " + std::to_string(lo) + " to " + std::to_string(hi);
}
std::string interval_text(double lo, bool lo_incl, double hi, bool hi_incl) {
  std::string h = std::isinf(hi) ? "inf" : fmt_real(hi);
  return std::string(lo_incl ? "[" : "(") + fmt_real(lo) + ", " + h +
         (hi_incl && !std::isinf(hi) ? "]" : ")");
}
std::string whole_hint(const std::string& s) {
  double d = 0;
  if (parse_real(s, d) && std::isfinite(d) && std::fabs(d) < 9e15) {
    std::ostringstream os;
    os << static_cast<int64_t>(std::llround(d));
    return os.str();
  }
  return "100";
}

}  // namespace

void Section::integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi, bool required,
                      const std::string& range_hint) {
  const YAML::Node* v = value(key, required, "an integer");
  if (!v) return;
  if (!expect_plain_scalar(key, *v, "an integer")) return;
  int64_t x = 0;
  switch (parse_int(v->Scalar(), x)) {
    case IntParse::ok:
      break;
    case IntParse::looks_fractional:
      return reject(key, "'" + child(path_, key) + "' must be a whole number, got " + shown(v->Scalar()),
                    "write it without a fraction or exponent, e.g. " + whole_hint(v->Scalar()));
    case IntParse::overflow:
      return reject(key, "'" + child(path_, key) + "' is out of range: " + shown(v->Scalar()),
                    range_text(lo, hi));
    case IntParse::not_integer:
      return reject(key, "'" + child(path_, key) + "' must be an integer, got " + describe(*v),
                    range_text(lo, hi));
  }
  if (x < lo || x > hi)
    return reject(key, "'" + child(path_, key) + "' is out of range: " + std::to_string(x),
                  range_hint.empty() ? range_text(lo, hi) : range_hint);
  out = x;
}

void Section::seed(const std::string& key, uint64_t& out) {
  const YAML::Node* v = value(key, false, "an integer");
  if (!v || !expect_plain_scalar(key, *v, "an integer")) return;
  const std::string& s = v->Scalar();
  bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  uint64_t x = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), x);
  if (!digits || r.ec != std::errc() || r.ptr != s.data() + s.size())
    return reject(key, "'" + child(path_, key) + "' must be an integer in [0, 2^64), got " + describe(*v),
                  "any whole number from 0 to 18446744073709551615, e.g. 0 or 1234");
  out = x;
}

void Section::real(const std::string& key, double& out, double lo, bool lo_incl, double hi, bool hi_incl,
                   const std::string& hint) {
  const YAML::Node* v = value(key, false, "a number");
  if (!v || !expect_plain_scalar(key, *v, "a number")) return;
  double x = 0;
  if (!parse_real(v->Scalar(), x))
    return reject(key, "'" + child(path_, key) + "' must be a number, got " + describe(*v),
                  hint.empty() ? interval_text(lo, lo_incl, hi, hi_incl) : hint);
  bool in = std::isfinite(x) && (lo_incl ? x >= lo : x > lo) && (hi_incl ? x <= hi : x < hi);
  if (!in)
    return reject(key,
                  "'" + child(path_, key) + "' is out of range: " + shown(v->Scalar()) + " is not in " +
                      interval_text(lo, lo_incl, hi, hi_incl),
                  hint.empty() ? "give a value in " + interval_text(lo, lo_incl, hi, hi_incl) : hint);
  out = x;
}

void Section::real_pair(const std::string& key, double& a, double& b, double lo, double hi,
                        const std::array<const char*, 2>& names, const std::string& hint) {
  const YAML::Node* v = value(key, false, "a list of two numbers");
  if (!v) return;
  const std::string what = "'" + child(path_, key) + "'";
  if (!v->IsSequence() || v->size() != 2)
    return reject(key,
                  what + " must be a list of two numbers, got " +
                      (v->IsSequence() ? "a list of " + std::to_string(v->size()) : describe(*v)),
                  hint);
  double x[2] = {0, 0};
  bool good = true;
  for (size_t i = 0; i < 2; ++i) {
    const YAML::Node e = (*v)[i];
    const Loc at = loc_of(e.Mark());
    if (!e.IsScalar() || is_quoted(e) || !parse_real(e.Scalar(), x[i])) {
      ctx_.error(at, what + " must be two numbers, but its " + names[i] + " is " + describe(e), hint);
      good = false;
    } else if (!std::isfinite(x[i]) || x[i] < lo || x[i] >= hi) {
      ctx_.error(at,
                 what + " is out of range: " + names[i] + " " + shown(e.Scalar()) + " is not in " +
                     interval_text(lo, true, hi, false),
                 hint);
      good = false;
    }
  }
  if (!good) return ctx_.mark_bad(child(path_, key));
  a = x[0];
  b = x[1];
}

void Section::boolean(const std::string& key, bool& out) {
  const YAML::Node* v = value(key, false, "true or false");
  if (!v || !expect_plain_scalar(key, *v, "true or false")) return;
  const std::string& s = v->Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return void(out = true);
  if (s == "false" || s == "False" || s == "FALSE") return void(out = false);
  reject(key, "'" + child(path_, key) + "' must be true or false, got " + describe(*v),
         is_bool_word(s) ? "YAML 1.2 reads only true/false as booleans; write true or false"
                         : "write true or false");
}

void Section::string(const std::string& key, std::string& out, bool required, bool allow_empty) {
  const YAML::Node* v = value(key, required, "a string");
  if (!v) return;
  if (!v->IsScalar())
    return reject(key, "'" + child(path_, key) + "' must be a string, got " + describe(*v),
                  "write a single value on the key's line, quoted if it contains ':' or '#'");
  if (!allow_empty && v->Scalar().empty())
    return reject(key, "'" + child(path_, key) + "' must not be empty", "give a value or delete the key");
  out = v->Scalar();
}

bool Section::enum_index(const std::string& key, const char* what, const std::vector<std::string>& valid,
                         bool is_schedule, bool required, size_t& index) {
  const YAML::Node* v = value(key, required, "one of " + join(valid));
  if (!v) return false;
  if (!v->IsScalar()) {
    reject(key, "'" + child(path_, key) + "' must be one of " + join(valid) + ", got " + describe(*v),
           "write one of: " + join(valid));
    return false;
  }
  const std::string& s = v->Scalar();
  for (size_t i = 0; i < valid.size(); ++i)
    if (s == valid[i]) {
      index = i;
      return true;
    }
  std::string hint = "valid values: " + join(valid);
  std::string lower = s;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& name : valid) {
    size_t d = edit_distance(lower, name);
    if (d <= std::max<size_t>(1, name.size() / 3)) {
      hint = "did you mean '" + name + "'? valid values: " + join(valid);
      break;
    }
  }
  if (is_schedule && (lower == "one_f_one_b" || lower == "1f-1b" || lower == "pipedream"))
    hint = "did you mean '1f1b'? valid values: " + join(valid);
  reject(key, "unknown " + std::string(what) + " '" + shown(s) + "' for '" + child(path_, key) + "'", hint);
  return false;
}

void Section::choice(const std::string& key, std::string& out, const std::vector<std::string>& valid) {
  const YAML::Node* v = value(key, false, "one of " + join(valid));
  if (!v) return;
  if (v->IsScalar() && std::find(valid.begin(), valid.end(), v->Scalar()) != valid.end())
    return void(out = v->Scalar());
  reject(key, "unsupported value " + describe(*v) + " for '" + child(path_, key) + "'",
         "valid values: " + join(valid));
}

void Section::duration(const std::string& key, std::chrono::milliseconds& out, bool allow_zero) {
  const YAML::Node* v = value(key, false, "a duration");
  if (!v) return;
  std::optional<std::chrono::milliseconds> d;
  if (v->IsScalar()) d = parse_duration(v->Scalar());
  if (!d)
    return reject(key, "'" + child(path_, key) + "' must be a duration, got " + describe(*v),
                  "write a number with a unit: 500ms, 30s, 2m, 1h (a plain number is seconds)");
  if (!allow_zero && d->count() == 0)
    return reject(key, "'" + child(path_, key) + "' must be longer than 0", "e.g. 1s");
  out = *d;
}

void Section::size(const std::string& key, uint64_t& out) {
  const YAML::Node* v = value(key, false, "a size");
  if (!v) return;
  std::optional<uint64_t> s;
  if (v->IsScalar()) s = parse_size(v->Scalar());
  if (!s)
    return reject(key, "'" + child(path_, key) + "' must be a size in bytes, got " + describe(*v),
                  "write bytes or a number with a unit: 4096, 512MiB, 16GiB, 1.5GB");
  out = *s;
}

void Section::degree(const std::string& key, int& out, int64_t hi) {
  const YAML::Node* v = value(key, false, "a positive integer or auto");
  if (!v) return;
  if (v->IsScalar() && v->Scalar() == "auto") return void(out = 0);
  int64_t x = 0;
  if (!v->IsScalar() || is_quoted(*v) || parse_int(v->Scalar(), x) != IntParse::ok || x < 1 || x > hi)
    return reject(key, "'" + child(path_, key) + "' must be a positive integer or auto, got " + describe(*v),
                  "e.g. " + key + ": 2, or " + key + ": auto to let the planner choose");
  out = static_cast<int>(x);
}

void Section::hardware_name(const std::string& key, std::string& out) {
  const YAML::Node* v = value(key, false, "a hardware profile name");
  if (!v) return;
  if (v->IsScalar() && v->Scalar().empty()) return void(out.clear());  // "": the device's default
  const bool ok = v->IsScalar() && !v->Scalar().empty() && v->Scalar().size() <= 64 && v->Scalar() != "." &&
                  v->Scalar() != ".." && std::all_of(v->Scalar().begin(), v->Scalar().end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                           c == '.' || c == '_' || c == '-';
                  });
  if (!ok)
    return reject(
        key, "'" + child(path_, key) + "' must be a hardware profile name, got " + describe(*v),
        "a name of configs/hardware/ (a100-80gb, h100-sxm, h200-sxm, cpu) or of a calibrated profile, "
        "never a path; see docs/planner.md");
  out = v->Scalar();
}

bool Section::scalar_is(const std::string& key, const char* text) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.value.IsScalar() && !is_quoted(it->second.value) &&
         it->second.value.Scalar() == text;
}

bool Section::expect_plain_scalar(const std::string& key, const YAML::Node& v, const std::string& what) {
  if (v.IsScalar() && !is_quoted(v)) return true;
  std::string hint = "write " + what + " on the key's line";
  if (v.IsScalar()) hint = "remove the quotes: a quoted value is a string";
  if (v.IsNull()) hint = "give a value, or delete the key to use the default";
  reject(key, "'" + child(path_, key) + "' must be " + what + ", got " + describe(v), hint);
  return false;
}

void Section::reject(const std::string& key, std::string message, std::string hint) {
  ctx_.error(ctx_.loc(child(path_, key)), std::move(message), std::move(hint));
  ctx_.mark_bad(child(path_, key));
}

}  // namespace troupe::spec_detail
