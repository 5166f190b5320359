#include "core/corpus_files.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.hpp"

namespace troupe {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TROUPE_CHECK(in.good(), "cannot open ", p.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

void for_each_text_file(const std::string& path,
                        const std::function<void(const std::string& file, std::string_view bytes)>& fn) {
  fs::path root(path);
  std::vector<fs::path> candidates;
  if (fs::is_directory(root)) {
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
      if (it->is_symlink() || !it->is_regular_file()) continue;
      candidates.push_back(it->path());
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
  } else {
    candidates.push_back(root);
  }
  for (const auto& p : candidates) {
    const std::string bytes = read_file(p);
    if (std::memchr(bytes.data(), 0, bytes.size()) != nullptr) continue;
    fn(p.string(), bytes);
  }
}

}  // namespace troupe
