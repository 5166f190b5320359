#include "coordinator/api.hpp"

#include <cstdint>
#include <limits>

#include "coordinator/spec_request.hpp"
#include "core/error.hpp"
#include "core/spec.hpp"

namespace troupe::coord {

json_read::Limits api_request_limits() {
  json_read::Limits l;
  l.max_bytes = uint64_t(16) << 20;
  l.max_depth = 16;
  return l;
}

json_read::Limits api_reply_limits() {
  json_read::Limits l;
  l.max_bytes = uint64_t(256) << 20;
  l.max_depth = 64;
  return l;
}

nlohmann::json api_error(const std::string& name, const std::string& message) {
  return {{"ok", false}, {"error", name}, {"message", message}};
}

namespace {

// The string field `key`, or nullptr (and *err set) when absent or not a string.
const std::string* string_field(const nlohmann::json& req, const char* key, nlohmann::json* err) {
  auto it = req.find(key);
  if (it == req.end()) {
    *err = api_error("bad_request", std::string("missing field '") + key + "'");
    return nullptr;
  }
  if (!it->is_string()) {
    *err = api_error("bad_request", std::string("field '") + key + "' must be a string");
    return nullptr;
  }
  return it->get_ptr<const std::string*>();
}

// The optional whole-number field `key` in [lo, hi] into *value; false (and *err set) when it
// is there but not such a number.
bool optional_count(const nlohmann::json& req, const char* key, size_t lo, size_t hi, size_t* value,
                    nlohmann::json* err) {
  auto it = req.find(key);
  if (it == req.end()) return true;
  // Signed or unsigned as JSON holds it; a value past int64 reads negative and is refused.
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || uint64_t(it->get<int64_t>()) < lo ||
      uint64_t(it->get<int64_t>()) > hi) {
    *err = api_error("bad_request", std::string("field '") + key + "' must be a whole number from " +
                                        std::to_string(lo) + " to " + std::to_string(hi));
    return false;
  }
  *value = static_cast<size_t>(it->get<int64_t>());
  return true;
}

}  // namespace

nlohmann::json handle_api_request(CoordinatorState& state, const nlohmann::json& req, Actions* out) {
  if (!req.is_object()) return api_error("bad_request", "a request is a JSON object");
  nlohmann::json err;
  const std::string* op = string_field(req, "op", &err);
  if (!op) return err;

  if (*op == "submit") {
    const std::string* spec = string_field(req, "spec", &err);
    if (!spec) return err;
    std::string filename = "<submitted>";
    if (auto f = req.find("filename"); f != req.end() && f->is_string()) filename = f->get<std::string>();
    JobRequest jr;
    try {
      jr = job_request_from_yaml(*spec, filename, state.default_hardware());
    } catch (const SpecError& e) {
      nlohmann::json diags = nlohmann::json::array();
      for (const auto& d : e.diagnostics) diags.push_back(d.str());
      auto r = api_error("invalid_spec", e.what());
      r["diagnostics"] = diags;
      return r;
    }
    if (auto r = req.find("resume"); r != req.end()) {
      if (!r->is_string())
        return api_error("bad_request", "'resume' must be a string (a checkpoint directory)");
      jr.resume_from = r->get<std::string>();
    }
    std::string id;
    try {
      id = state.submit(std::move(jr), out);
    } catch (const Error& e) {
      return api_error("invalid_job", e.what());
    }
    const Job* j = state.job(id);
    return {{"ok", true},
            {"job", id},
            {"state", to_string(j->state)},
            {"reason", j->reason},
            {"run_dir", j->run_dir}};
  }
  if (*op == "status") {
    const std::string* id = string_field(req, "job", &err);
    if (!id) return err;
    const Job* j = state.job(*id);
    if (!j) return api_error("unknown_job", "no job '" + *id + "'");
    ListPage page;
    if (!optional_count(req, "workers_from", 0, std::numeric_limits<int32_t>::max(), &page.from, &err) ||
        !optional_count(req, "workers_limit", 1, ListPage::kMax, &page.limit, &err))
      return err;
    WorkerFields fields;
    if (auto f = req.find("worker_fields"); f != req.end()) {
      std::string why;
      if (!WorkerFields::parse(*f, &fields, &why)) return api_error("bad_request", why);
    }
    return {{"ok", true}, {"job", state.job_json(*j, page, fields)}};
  }
  if (*op == "list") {
    ListPage page;
    if (!optional_count(req, "agents_from", 0, std::numeric_limits<int32_t>::max(), &page.from, &err) ||
        !optional_count(req, "agents_limit", 1, ListPage::kMax, &page.limit, &err))
      return err;
    auto r = state.list_json(page);
    r["ok"] = true;
    return r;
  }
  if (*op == "cancel") {
    const std::string* id = string_field(req, "job", &err);
    if (!id) return err;
    std::string why;
    if (!state.cancel(*id, "cancelled by a client", out, &why))
      return api_error(state.job(*id) ? "already_finished" : "unknown_job", why);
    return {{"ok", true}, {"job", *id}, {"state", "cancelled"}};
  }
  if (*op == "scale") {
    const std::string* id = string_field(req, "job", &err);
    if (!id) return err;
    auto d = req.find("devices");
    if (d == req.end() || !d->is_number_integer())
      return api_error("bad_request", "field 'devices' must be an integer");
    std::string why;
    if (!state.scale(*id, d->get<int>(), out, &why))
      return api_error(state.job(*id) ? "cannot_scale" : "unknown_job", why);
    const Job* j = state.job(*id);
    return {{"ok", true},
            {"job", *id},
            {"devices", d->get<int>()},
            {"after_step", j->drain_step},
            {"from_layout", j->layout.str()}};
  }
  return api_error("unknown_op", "unknown op '" + *op + "' (submit, status, list, cancel, scale, info)");
}

}  // namespace troupe::coord
