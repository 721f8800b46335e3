// tests/temp_dir.hpp: a fresh directory under the system's temporary directory,
// removed with everything in it when the object goes out of scope, so that a
// test never leaves files behind in the temporary directory or the source tree.
//
//   clm_test::TempDir dir("replay");   // /tmp/clm-test-replay-XXXXXX
//   dir.write("trace.jsonl", text);
//   run_tool("--workload mooncake:" + dir.file("trace.jsonl"));
#pragma once

#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace clm_test {

class TempDir {
 public:
  // mkdtemp: a unique name made and created in one step, so that two test
  // processes running at once never share a directory.
  explicit TempDir(const std::string& name = "tmp") {
    std::string pattern = (std::filesystem::temp_directory_path() / ("clm-test-" + name + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // The path of `name` inside the directory (the file need not exist).
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `content` to `name` inside the directory; throws when it cannot.
  void write(const std::string& name, const std::string& content) const {
    std::ofstream out(path_ / name, std::ios::binary);
    out << content;
    if (!out.good()) throw std::runtime_error("cannot write " + file(name));
  }

 private:
  std::filesystem::path path_;
};

}  // namespace clm_test
