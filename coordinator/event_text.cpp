#include "coordinator/event_text.hpp"

namespace troupe::coord {

std::string event_text(const nlohmann::json& e) {
  const std::string kind = e.value("event", "");
  auto str = [&](const char* key) { return e.value(key, std::string()); };
  auto num = [&](const char* key) { return std::to_string(e.value(key, int64_t{0})); };
  if (kind == "submitted")
    return "submitted job " + str("job") + " (" + str("name") + ", layout " + str("layout") + ")";
  if (kind == "state") {
    const std::string reason = str("reason");
    return "state " + str("state") + (reason.empty() ? "" : ": " + reason);
  }
  if (kind == "waiting") return "waiting: " + str("reason");
  if (kind == "checkpoint") return "checkpoint committed: " + str("dir");
  if (kind == "worker_exit") return "worker " + str("message");
  if (kind == "failure") {
    const std::string where = str("where");
    return "failure " + str("cause") + " in generation " + num("generation") + ": " + str("message") +
           (where.empty() ? "" : " [rank was in: " + where + "]");
  }
  if (kind == "relaunch") {
    const std::string from = str("resume_from");
    return "relaunch generation " + num("generation") + " as " + str("layout") + " (was " +
           str("from_layout") + ") " + (from.empty() ? "from scratch" : "from " + from);
  }
  if (kind == "plan") return "plan for generation " + num("generation") + ": " + str("why");
  if (kind == "resize") return "resize to " + num("devices") + " devices after step " + num("after_step");
  if (kind == "log") return str("message");
  return "";
}

}  // namespace troupe::coord
