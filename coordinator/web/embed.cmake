# Writes the dashboard's files into one C++ source as string literals:
#
#   cmake -DWEB_DIR=<coordinator/web> -DOUT=<build>/web_assets.cpp -P embed.cmake
#
# Every byte becomes a "\xNN" escape, so any content (quotes, backslashes, non-ASCII text) is
# carried exactly; 64 bytes a line keeps the generated file readable by compilers and people.
# configure_file rewrites OUT only when its text changes, so an unchanged page recompiles nothing.
cmake_minimum_required(VERSION 3.20)

function(embed_file var file)
  file(READ "${file}" hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR n "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "\\\\x\\1" escaped "${hex}")
  string(REPEAT "." 256 line)  # 64 escaped bytes
  string(REGEX REPLACE "(${line})" "\\1\"\n    \"" escaped "${escaped}")
  set(${var} "\"${escaped}\"" PARENT_SCOPE)
  set(${var}_SIZE ${n} PARENT_SCOPE)
endfunction()

embed_file(INDEX_HTML "${WEB_DIR}/index.html")
embed_file(APP_JS "${WEB_DIR}/app.js")
embed_file(TRACE_JS "${WEB_DIR}/trace.js")
embed_file(APP_CSS "${WEB_DIR}/app.css")
configure_file("${WEB_DIR}/web_assets.cpp.in" "${OUT}" @ONLY)
