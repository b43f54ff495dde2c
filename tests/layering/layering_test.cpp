// The layering of docs/ARCHITECTURE.md, checked on the sources: every #include "..." of the
// engine's files, from a file of one layer, names a header of the same layer or of one below
// it. An upward include fails the test, naming the file, the line and both layers. The one
// upward include the code still has is listed below, and the test fails as well when it is
// gone (so that the list stays what is true).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace klein {
namespace {

namespace fs = std::filesystem;

// Bottom up, as the table of docs/ARCHITECTURE.md lists them: each layer may include only its
// own headers and those of the layers before it. A file belongs to the layer of the longest
// prefix that matches its path (relative to the repository root).
struct Layer {
  const char* name;  // as the table's first column names it
  std::vector<std::string> prefixes;
};
const std::vector<Layer>& layers() {
  static const std::vector<Layer> all = {
      {"core", {"src/core/"}},
      {"formats", {"formats/"}},
      {"quant", {"quant/"}},
      {"ops", {"src/ops/"}},
      {"tokenizer", {"src/tokenizer/"}},
      {"weights", {"src/weights/"}},
      {"Z-Image checkpoint", {"src/models/zimage/checkpoint/"}},
      {"models", {"src/models/"}},
      {"pipeline", {"src/pipeline/"}},
      {"families", {"src/families/"}},
      {"convert", {"convert/"}},
      {"hub", {"src/hub/"}},
      {"front ends", {"cli/", "src/api/", "src/server/"}},
  };
  return all;
}

// The upward includes the code has today, each to be taken out by moving what it names down
// (not by adding to this list): the linear layer reads the weight store's Weight view.
const std::set<std::string> kKnownUpward = {};

int layer_of(const std::string& path) {
  int best = -1;
  size_t best_length = 0;
  for (size_t i = 0; i < layers().size(); ++i)
    for (const std::string& p : layers()[i].prefixes)
      if (path.starts_with(p) && p.size() > best_length) {
        best = int(i);
        best_length = p.size();
      }
  return best;
}

// An include as the build resolves it: from the repository root, else from src/.
std::string resolve(const fs::path& root, const std::string& include) {
  if (fs::exists(root / include)) return include;
  if (fs::exists(root / "src" / include)) return "src/" + include;
  return "";
}

TEST(Layering, NoFileIncludesALayerAboveItsOwn) {
  const fs::path root = KLEIN_SOURCE_DIR;
  const std::regex include_line(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::vector<std::string> upward;
  std::set<std::string> known_seen;
  size_t files = 0, includes = 0;
  for (const char* top : {"src", "formats", "quant", "convert", "cli"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp")) continue;
      const std::string path = fs::relative(entry.path(), root).generic_string();
      const int from = layer_of(path);
      ASSERT_GE(from, 0) << path << " is in no layer of this test's table";
      ++files;
      std::ifstream in(entry.path());
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        std::smatch m;
        if (line.find("#") == std::string::npos || !std::regex_search(line, m, include_line))
          continue;
        const std::string target = resolve(root, m[1]);
        if (target.empty()) continue;  // generated headers (core/version.h), system headers
        ++includes;
        const int to = layer_of(target);
        if (to <= from) continue;
        const std::string pair = path + " -> " + m[1].str();
        if (kKnownUpward.contains(pair)) {
          known_seen.insert(pair);
          continue;
        }
        upward.push_back(path + ":" + std::to_string(number) + ": " + layers()[from].name +
                         " includes " + m[1].str() + ", a header of " + layers()[to].name);
      }
    }
  }
  EXPECT_GT(files, 300u);
  EXPECT_GT(includes, 800u);
  std::string list;
  for (const auto& u : upward) list += "\n  " + u;
  EXPECT_TRUE(upward.empty()) << upward.size() << " upward includes:" << list;
  for (const auto& k : kKnownUpward)
    EXPECT_TRUE(known_seen.contains(k)) << k << " is gone: take it off kKnownUpward";
}

// The test's table is the document's: the same layers in the same order.
TEST(Layering, TheTableIsArchitectureMdsOrder) {
  std::ifstream in(fs::path(KLEIN_SOURCE_DIR) / "docs" / "ARCHITECTURE.md");
  ASSERT_TRUE(in) << "docs/ARCHITECTURE.md";
  std::vector<std::string> documented;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.starts_with("| layer |"))
      in_table = true;
    else if (in_table && !line.starts_with("|"))
      break;
    else if (in_table && !line.starts_with("| ---")) {
      const size_t end = line.find(" |", 2);
      documented.push_back(line.substr(2, end - 2));
    }
  }
  std::vector<std::string> tested;
  for (const Layer& l : layers()) tested.push_back(l.name);
  EXPECT_EQ(documented, tested);
}

}  // namespace
}  // namespace klein
