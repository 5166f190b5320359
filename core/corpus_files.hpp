// The text files of a corpus path, as Dataset::from_path and `troupe data` read them.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace troupe {

// Calls fn(file, bytes) for each text file of `path`: the file itself, or every regular
// file under the directory, recursively, in byte order of their paths (directory order
// is file-system dependent; this is not). Symbolic links are skipped (aliases such as
// fortune's *.u8 would duplicate text), and so are files containing a NUL byte (binary
// files, e.g. fortune's .dat indexes). `path` must exist; a file that cannot be read
// throws troupe::Error naming it.
void for_each_text_file(const std::string& path,
                        const std::function<void(const std::string& file, std::string_view bytes)>& fn);

}  // namespace troupe
