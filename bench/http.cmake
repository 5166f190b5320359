# HTTP: /metrics latency under concurrent connections, the dashboard's transport against
# the HTTP server libraries Debian ships. civetweb is looked for by hand, only here: Debian's
# libcivetweb-dev ships a CMake config that fails without the civetweb program installed.
# Built where libcivetweb-dev is installed (apt-get install libcivetweb-dev).
find_path(CIVETWEB_INCLUDE_DIR civetweb.h)
find_library(CIVETWEB_LIBRARY civetweb)
mark_as_advanced(CIVETWEB_INCLUDE_DIR CIVETWEB_LIBRARY)
if(CIVETWEB_INCLUDE_DIR AND CIVETWEB_LIBRARY)
  add_executable(http_latency ${CMAKE_CURRENT_SOURCE_DIR}/http_latency.cpp)
  target_include_directories(http_latency PRIVATE ${CIVETWEB_INCLUDE_DIR})
  target_link_libraries(http_latency PRIVATE troupe_coordinator CppHttplib::cpp-httplib ${CIVETWEB_LIBRARY})
else()
  message(STATUS "bench/http_latency: not built (no civetweb: apt-get install libcivetweb-dev)")
endif()
