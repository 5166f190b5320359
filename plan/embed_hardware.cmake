# Writes the built-in hardware profiles (configs/hardware/*.yaml) into one C++ source:
#
#   cmake -DHW_DIR=<configs/hardware> -DOUT=<build>/hardware_builtin.cpp -P embed_hardware.cmake
#
# A profile's name is its file name without .yaml. configure_file rewrites OUT only when its
# text changes.
cmake_minimum_required(VERSION 3.20)
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/embed_file.cmake")

file(GLOB _files "${HW_DIR}/*.yaml")
list(SORT _files)
set(ENTRIES "")
foreach(_f ${_files})
  get_filename_component(_name "${_f}" NAME_WE)
  embed_file(_text "${_f}")
  string(APPEND ENTRIES "      {\"${_name}\", std::string_view(${_text}, ${_text_SIZE})},\n")
endforeach()
configure_file("${CMAKE_CURRENT_LIST_DIR}/hardware_builtin.cpp.in" "${OUT}" @ONLY)
