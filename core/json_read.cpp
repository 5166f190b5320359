#include "core/json_read.hpp"

#include <cmath>

#include "core/text.hpp"

namespace troupe::json_read {

namespace {

// What a DOM node costs on the heap, measured with nlohmann 3.11 and glibc's malloc: a value
// in an array (16 bytes, doubled by the vector's growth), a member of an object (a map node:
// links, the key's std::string and the value), an empty container, and a string's own bytes
// once they no longer fit in the std::string.
constexpr uint64_t kArraySlot = 32;
constexpr uint64_t kMember = 96;
constexpr uint64_t kArray = 40;
constexpr uint64_t kObject = 64;
constexpr uint64_t kSmallString = 15;
constexpr uint64_t kMallocOverhead = 16;
constexpr uint64_t kBudgetFloor = uint64_t(1) << 20;

uint64_t heap_bytes(const std::string& s) {
  return s.size() > kSmallString ? s.size() + 1 + kMallocOverhead : 0;
}

// A short, printable piece of hostile text for a message.
std::string brief(std::string_view s) {
  std::string out = sanitize_utf8(std::string(s.substr(0, 40)));
  return s.size() > 40 ? out + "..." : out;
}

// nlohmann's SAX interface around a Handler: the depth bound, finite numbers, and the
// parser's own errors as the reader's message.
class Sax {
 public:
  Sax(Handler& h, int max_depth) : h_(h), max_depth_(max_depth) {}

  bool null() { return h_.value(nlohmann::json(nullptr), open_); }
  bool boolean(bool b) { return h_.value(nlohmann::json(b), open_); }
  bool number_integer(int64_t v) { return h_.value(nlohmann::json(v), open_); }
  bool number_unsigned(uint64_t v) { return h_.value(nlohmann::json(v), open_); }
  bool number_float(double v, const std::string& raw) {
    if (!std::isfinite(v)) return stop("the number " + brief(raw) + " is out of range");
    return h_.value(nlohmann::json(v), open_);
  }
  bool string(std::string& s) { return h_.value(nlohmann::json(std::move(s)), open_); }
  bool binary(nlohmann::json::binary_t&) { return stop("binary values are not JSON"); }
  bool start_object(std::size_t) { return open(true); }
  bool key(std::string& k) { return h_.key(std::move(k), open_); }
  bool end_object() { return h_.end(true, --open_); }
  bool start_array(std::size_t) { return open(false); }
  bool end_array() { return h_.end(false, --open_); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    if (auto close = what.find("] "); what.rfind("[json.exception", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    return stop("not valid JSON (byte " + std::to_string(position) + "): " + sanitize_utf8(what));
  }

 private:
  bool open(bool object) {
    if (open_ >= max_depth_) return stop("JSON nested deeper than " + std::to_string(max_depth_) + " levels");
    return h_.begin(object, open_++);
  }
  bool stop(std::string why) {
    h_.fail(std::move(why));
    return false;
  }

  Handler& h_;
  int max_depth_;
  int open_ = 0;  // containers open around the next event
};

}  // namespace

uint64_t dom_budget(uint64_t text_bytes, const Limits& limits) {
  return text_bytes * limits.memory_factor + kBudgetFloor;
}

void read_events(std::string_view text, const std::string& where, const Limits& limits, Handler& handler) {
  require(text.size() <= limits.max_bytes, where, ": is ", text.size(), " bytes of JSON, more than the ",
          limits.max_bytes, " it may have");
  Sax sax(handler, limits.max_depth);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const std::bad_alloc&) {
    throw Error(where + ": out of memory reading its JSON");
  }
  if (!ok) throw Error(where + ": " + (handler.error().empty() ? "not valid JSON" : handler.error()));
}

nlohmann::json parse(std::string_view text, const std::string& where, const Limits& limits) {
  DomBuilder dom(dom_budget(text.size(), limits));
  read_events(text, where, limits, dom);
  return dom.take();
}

nlohmann::json read_file(const std::string& path, const char* what, const Limits& limits, Links links) {
  return parse(read_regular_file(path, limits.max_bytes, what, links), path, limits);
}

// ---------------------------------------------------------------- DomBuilder

bool DomBuilder::charge(uint64_t bytes) {
  charged_ += bytes;
  if (charged_ <= budget_) return true;
  fail("the JSON would take more than " + std::to_string(budget_) +
       " bytes of memory (a document of nothing but tiny values)");
  return false;
}

bool DomBuilder::place(nlohmann::json&& v, bool container) {
  if (stack_.empty()) {
    root_ = std::move(v);
    if (container)
      stack_.push_back(&root_);
    else
      done_ = true;
    return true;
  }
  nlohmann::json& parent = *stack_.back();
  nlohmann::json* child = nullptr;
  if (parent.is_array()) {
    if (!charge(kArraySlot)) return false;
    // Only the innermost open container grows: the pointers to those around it stay valid.
    parent.get_ref<nlohmann::json::array_t&>().push_back(std::move(v));
    child = &parent.get_ref<nlohmann::json::array_t&>().back();
  } else {
    if (!charge(kMember + heap_bytes(pending_key_))) return false;
    auto [it, fresh] =
        parent.get_ref<nlohmann::json::object_t&>().emplace(std::move(pending_key_), std::move(v));
    if (!fresh) {
      fail("the key \"" + brief(it->first) + "\" appears twice in one object");
      return false;
    }
    child = &it->second;
  }
  pending_key_.clear();
  if (container) stack_.push_back(child);
  return true;
}

bool DomBuilder::value(nlohmann::json&& scalar, int) {
  if (scalar.is_string() && !charge(heap_bytes(scalar.get_ref<const std::string&>()))) return false;
  return place(std::move(scalar), false);
}

bool DomBuilder::begin(bool object, int) {
  if (!charge(object ? kObject : kArray)) return false;
  return place(object ? nlohmann::json::object() : nlohmann::json::array(), true);
}

bool DomBuilder::key(std::string&& key, int) {
  pending_key_ = std::move(key);
  return true;
}

bool DomBuilder::end(bool, int) {
  stack_.pop_back();
  if (stack_.empty()) done_ = true;
  return true;
}

nlohmann::json DomBuilder::take() {
  done_ = false;
  stack_.clear();
  return std::move(root_);
}

}  // namespace troupe::json_read
