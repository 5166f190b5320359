// Reading files that may be hostile (a tokenizer, token data, a trace someone handed over):
// regular files only, opened without blocking on a FIFO, bounded in size; and a cheap guard
// on JSON nesting before a parser sees the text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe {

// Opens `path` read-only (O_NONBLOCK: a FIFO opens at once instead of waiting for a writer)
// and refuses anything but a regular file: "<path>: is a directory, not a <what>" or
// "<path>: not a regular file" (troupe::Error). Returns the descriptor, which the caller
// closes, and its size in *size. A failed open is a troupe::IoError with its errno
// ("<path>: cannot open: No such file or directory", ENOENT).
//
// Links::refuse: a symbolic link as the last component is refused too (O_NOFOLLOW, IoError
// ELOOP "<path>: is a symbolic link; ...") — for a file served to others, or read from a
// directory other users might write into (a checkpoint's shards and manifest).
enum class Links { follow, refuse };
int open_regular_file(const std::string& path, const char* what, uint64_t* size, Links links = Links::follow);

// The whole of the regular file `path` when it holds at most max_bytes: "<path>: is N bytes;
// a <what> is at most M bytes", also when it grows past that while being read.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, const char* what,
                              Links links = Links::follow);

// The deepest nesting of JSON objects and arrays in `text`, outside strings; stops counting
// once it passes `stop_above` (the caller refuses it anyway).
int json_depth(std::string_view text, int stop_above = 1 << 30);

}  // namespace troupe
