# Writes the dashboard's files into one C++ source as string literals:
#
#   cmake -DWEB_DIR=<coordinator/web> -DOUT=<build>/web_assets.cpp -P embed.cmake
#
# configure_file rewrites OUT only when its text changes, so an unchanged page recompiles nothing.
cmake_minimum_required(VERSION 3.20)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/embed_file.cmake")

embed_file(INDEX_HTML "${WEB_DIR}/index.html")
embed_file(APP_JS "${WEB_DIR}/app.js")
embed_file(TRACE_JS "${WEB_DIR}/trace.js")
embed_file(APP_CSS "${WEB_DIR}/app.css")
configure_file("${WEB_DIR}/web_assets.cpp.in" "${OUT}" @ONLY)
