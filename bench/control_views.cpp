// What the coordinator's JSON views cost its actor thread at sizes no machine here can run
// as processes: a CoordinatorState with N placed, registered ranks (tests/support/sized_job.hpp:
// agents of 8 devices, layout (N/16)x2x8, each rank with a "where" answer), and the API's `status` and `list`
// and the dashboard's /metrics built from them, as the actor and the HTTP thread build
// them (/metrics through the dashboard's HTTP server). Prints, per size, the median time and
// the size of each answer: "all" is a page of every worker (up to 4,096) with every field,
// "brief" the same page with the fields /metrics asks for.
//
//   build/bench/control_views [--ranks 256,1024,4096,16384] [--repeat 15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/api.hpp"
#include "coordinator/dashboard_server.hpp"
#include "coordinator/state.hpp"
#include "core/json_read.hpp"
#include "tests/support/http_get.hpp"
#include "tests/support/sized_job.hpp"

using namespace troupe::coord;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median wall time of f in ms over `repeat` calls.
double time_ms(int repeat, const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 1024, 4096, 16384};
  int repeat = 15;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');)
        sizes.push_back(std::max(16, std::atoi(t.c_str()) / 16 * 16));
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: control_views [--ranks 256,1024,4096,16384] [--repeat 15]\n");
      return 2;
    }
  }
  const std::string root = (std::filesystem::temp_directory_path() / "troupe-control-views").string();
  std::printf("%8s | %10s %8s | %10s %8s %8s | %9s %8s | %8s %8s | %11s %8s\n", "ranks", "status ms", "KiB",
              "all ms", "KiB", "(ranks)", "brief ms", "KiB", "list ms", "KiB", "/metrics ms", "KiB");
  for (int n : sizes) {
    CoordinatorState st(root, troupe::actors::kProtocolVersion);
    const std::string job = troupe::test::sized_job(st, n);
    std::string status_text, list_text, metrics_text;
    const double status_ms = time_ms(repeat, [&] {
      Actions a;
      status_text = handle_api_request(st, {{"op", "status"}, {"job", job}}, &a).dump();
    });
    // The same answer listing every worker (up to a page's maximum): what status cost for
    // every request before answers were paged.
    std::string full_text;
    const double full_ms = time_ms(repeat, [&] {
      Actions a;
      full_text = handle_api_request(st,
                                     {{"op", "status"},
                                      {"job", job},
                                      {"workers_limit", std::min<size_t>(size_t(n), ListPage::kMax)}},
                                     &a)
                      .dump();
    });
    // The page /metrics asks for: every worker, only the fields a scrape reads.
    std::string brief_text;
    const double brief_ms = time_ms(repeat, [&] {
      Actions a;
      brief_text =
          handle_api_request(st,
                             {{"op", "status"},
                              {"job", job},
                              {"workers_limit", std::min<size_t>(size_t(n), ListPage::kMax)},
                              {"worker_fields", {"rank", "host", "device", "pid", "heartbeat_age_s"}}},
                             &a)
              .dump();
    });
    const double list_ms = time_ms(repeat, [&] {
      Actions a;
      list_text = handle_api_request(st, {{"op", "list"}}, &a).dump();
    });
    // /metrics as served: the dashboard's HTTP server, asking the state through the API as
    // the actor answers it (the request parsed under the API's limits, the reply as text).
    DashboardServer dash(DashboardOptions{"127.0.0.1:0", ""}, [&](const std::string& text) {
      Actions a;
      return handle_api_request(st, troupe::json_read::parse(text, "the request", api_request_limits()), &a)
          .dump();
    });
    const double metrics_ms = time_ms(repeat, [&] {
      auto reply = troupe::test::http_get(dash.address(), "/metrics");
      if (reply.status != 200) std::abort();
      metrics_text = reply.body;
    });
    dash.stop();
    std::printf("%8d | %10.2f %8.1f | %10.2f %8.1f %8zu | %9.2f %8.1f | %8.2f %8.1f | %11.2f %8.1f\n", n,
                status_ms, status_text.size() / 1024.0, full_ms, full_text.size() / 1024.0,
                std::min<size_t>(size_t(n), ListPage::kMax), brief_ms, brief_text.size() / 1024.0, list_ms,
                list_text.size() / 1024.0, metrics_ms, metrics_text.size() / 1024.0);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(root);
  return 0;
}
