#include "core/hostile_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace troupe {

int open_regular_file(const std::string& path, const char* what, uint64_t* size, Links links) {
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (links == Links::refuse ? O_NOFOLLOW : 0));
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP && links == Links::refuse)
      throw IoError(
          path + ": is a symbolic link; a " + what + " is read only as a regular file, not through a link",
          e);
    throw IoError(path + ": cannot open: " + std::strerror(e), e);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    if (dir) require(false, path, ": is a directory, not a ", what);
    require(false, path, ": not a regular file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const char* what, Links links) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size, links);
  if (size > max_bytes) {
    ::close(fd);
    require(false, path, ": is ", size, " bytes; a ", what, " is at most ", max_bytes, " bytes");
  }
  // At most one buffer past the limit: the file may have grown since fstat.
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw IoError(path + ": cannot read: " + std::strerror(e), e);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      ::close(fd);
      require(false, path, ": grew past ", max_bytes, " bytes while being read");
    }
  }
  ::close(fd);
  return text;
}

int json_depth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_above) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace troupe
