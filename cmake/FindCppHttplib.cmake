# FindCppHttplib: cpp-httplib as Debian builds it (libcpp-httplib-dev): httplib.h holds
# the declarations only, the definitions are in libcpp-httplib.so, and it ships a
# pkg-config file but no CMake config. The library was compiled with OpenSSL, zlib and
# Brotli support, which changes the layout of its classes: every user must see the same
# CPPHTTPLIB_*_SUPPORT definitions, so the imported target carries them.
# Defines CppHttplib_FOUND, CppHttplib_VERSION and the imported target CppHttplib::cpp-httplib.
find_path(CppHttplib_INCLUDE_DIR httplib.h)
find_library(CppHttplib_LIBRARY cpp-httplib)
if(CppHttplib_INCLUDE_DIR AND EXISTS "${CppHttplib_INCLUDE_DIR}/httplib.h")
  file(STRINGS "${CppHttplib_INCLUDE_DIR}/httplib.h" _v REGEX "#define CPPHTTPLIB_VERSION ")
  if(_v MATCHES "\"([0-9.]+)\"")
    set(CppHttplib_VERSION "${CMAKE_MATCH_1}")
  endif()
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CppHttplib REQUIRED_VARS CppHttplib_LIBRARY CppHttplib_INCLUDE_DIR
                                  VERSION_VAR CppHttplib_VERSION)
if(CppHttplib_FOUND AND NOT TARGET CppHttplib::cpp-httplib)
  find_package(Threads REQUIRED)
  find_package(OpenSSL REQUIRED)
  find_package(ZLIB REQUIRED)
  add_library(CppHttplib::cpp-httplib UNKNOWN IMPORTED)
  set_target_properties(
    CppHttplib::cpp-httplib
    PROPERTIES IMPORTED_LOCATION "${CppHttplib_LIBRARY}"
               INTERFACE_INCLUDE_DIRECTORIES "${CppHttplib_INCLUDE_DIR}"
               INTERFACE_COMPILE_DEFINITIONS
               "CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT"
               INTERFACE_LINK_LIBRARIES "OpenSSL::SSL;ZLIB::ZLIB;Threads::Threads")
endif()
mark_as_advanced(CppHttplib_INCLUDE_DIR CppHttplib_LIBRARY)
