// The dashboard's files (coordinator/web/), compiled into the binary: the machines a cluster
// runs on are often offline, so the page loads nothing from anywhere but its coordinator.
//
//   find_web_asset("/")           -> index.html   ("/index.html" too)
//   find_web_asset("/app.js")     -> app.js
//   find_web_asset("/trace.js")   -> trace.js     (the trace view)
//   find_web_asset("/app.css")    -> app.css
//   find_web_asset("/api/jobs")   -> nullptr      (anything else)
//
// `path` is the request target without its query: "/?token=T" is looked up as "/".
// The bodies are generated from coordinator/web/ at build time (coordinator/web/embed.cmake);
// they live as long as the program.
#pragma once

#include <string_view>

namespace troupe::coord {

struct WebAsset {
  std::string_view path;          // "/index.html"
  std::string_view content_type;  // "text/html; charset=utf-8"
  std::string_view body;
};

const WebAsset* find_web_asset(std::string_view path);

}  // namespace troupe::coord
