// The dashboard's embedded files: found by path, byte for byte the files of coordinator/web/,
// and written within the Content-Security-Policy the coordinator serves them under
// (default-src 'self'; style-src 'self'; script-src 'self'): no inline script or style, no
// eval, nothing fetched from another host, no markup built from strings.
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/web_assets.hpp"

using troupe::coord::find_web_asset;
using troupe::coord::WebAsset;

namespace {

std::string source_file(const std::string& name) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/coordinator/web/" + name, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string body(const char* path) {
  const WebAsset* a = find_web_asset(path);
  REQUIRE(a != nullptr);
  return std::string(a->body);
}

}  // namespace

TEST_CASE("the page, its scripts and its style are found by path with their content types", "[web]") {
  const WebAsset* root = find_web_asset("/");
  REQUIRE(root != nullptr);
  CHECK(root == find_web_asset("/index.html"));
  CHECK(root->path == "/index.html");
  CHECK(root->content_type == "text/html; charset=utf-8");
  REQUIRE(find_web_asset("/app.js") != nullptr);
  CHECK(find_web_asset("/app.js")->content_type == "text/javascript; charset=utf-8");
  REQUIRE(find_web_asset("/trace.js") != nullptr);
  CHECK(find_web_asset("/trace.js")->path == "/trace.js");
  CHECK(find_web_asset("/trace.js")->content_type == "text/javascript; charset=utf-8");
  REQUIRE(find_web_asset("/app.css") != nullptr);
  CHECK(find_web_asset("/app.css")->content_type == "text/css; charset=utf-8");
  for (const char* other : {"", "/api/jobs", "/app.js?v=1", "/../app.js", "/favicon.ico", "/index.htm",
                            "app.js", "/APP.JS", "/app.js/", "/trace.js?x", "/trace", "trace.js"})
    CHECK(find_web_asset(other) == nullptr);
}

TEST_CASE("the embedded bodies are the files of coordinator/web byte for byte", "[web]") {
  CHECK(body("/index.html") == source_file("index.html"));
  CHECK(body("/app.js") == source_file("app.js"));
  CHECK(body("/trace.js") == source_file("trace.js"));
  CHECK(body("/app.css") == source_file("app.css"));
}

TEST_CASE("the page stays within the policy it is served under", "[web]") {
  const std::string html = body("/"), app = body("/app.js"), trace = body("/trace.js"),
                    css = body("/app.css");
  // Every script is a file of its own: trace.js, then app.js (whose last line draws the first
  // view, the trace view among them); there is no <style> element, no style="" attribute, no
  // inline event handler, and the browser asks for no favicon.
  const std::regex script("<script[^>]*>");
  std::vector<std::string> scripts;
  for (std::sregex_iterator it(html.begin(), html.end(), script), end; it != end; ++it)
    scripts.push_back(it->str());
  CHECK(scripts ==
        std::vector<std::string>{"<script src=\"/trace.js\" defer>", "<script src=\"/app.js\" defer>"});
  CHECK(html.find("<style") == std::string::npos);
  CHECK_FALSE(std::regex_search(html, std::regex("\\sstyle\\s*=")));
  CHECK_FALSE(std::regex_search(html, std::regex("\\son[a-z]+\\s*=")));
  CHECK(html.find("<link rel=\"icon\" href=\"data:,\">") != std::string::npos);
  // No eval, and data never becomes markup.
  for (const std::string* js : {&app, &trace})
    for (const char* banned : {"eval(", "new Function", "innerHTML", "outerHTML", "insertAdjacentHTML",
                               "document.write", "setAttribute('style'", "import("})
      CHECK(js->find(banned) == std::string::npos);
  // Nothing from another host: the only absolute URL is the SVG namespace.
  const std::regex url("https?://[^'\"\\s)]*");
  for (const std::string* text : {&html, &app, &trace, &css})
    for (std::sregex_iterator it(text->begin(), text->end(), url), end; it != end; ++it)
      CHECK(it->str() == "http://www.w3.org/2000/svg");
  CHECK(css.find("@import") == std::string::npos);
  CHECK(css.find("url(") == std::string::npos);
}
