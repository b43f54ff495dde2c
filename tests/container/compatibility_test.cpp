// Containers written by earlier builds still open and verify: tests/data/checksums-v1.klein
// was written before the checksums moved to the system xxHash library (tests/data/README.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/container/reader.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path fixture() { return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "checksums-v1.klein"; }

TEST(Compatibility, AContainerWrittenBeforeVerifies) {
  const container::ContainerFile file(fixture());  // header, index and metadata checksums
  ASSERT_EQ(file.index().units.size(), 3u);
  ASSERT_EQ(file.index().tensors.size(), 15u);
  const container::VerifyReport r = container::verify_container(file);
  for (const auto& p : r.problems) ADD_FAILURE() << p.region << " " << p.name << ": " << p.message;
  EXPECT_EQ(r.units_checked, 3u);
  EXPECT_EQ(r.tensors_checked, 15u);
  for (const auto& u : file.index().units) EXPECT_NO_THROW(file.check_unit(u)) << u.name;
}

// The same file with one byte of one tensor changed: the tensor and its unit are named.
TEST(Compatibility, AChangedByteInTheOldContainerIsFound) {
  const fs::path copy = testing::temp_dir("compat") / "changed.klein";
  fs::copy_file(fixture(), copy);
  uint64_t offset = 0;
  std::string name;
  {
    const container::ContainerFile file(copy);
    const container::TensorEntry& t = file.index().tensors[9];
    offset = t.offset + t.size / 2;
    name = t.name;
  }
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(offset));
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(std::streamoff(offset));
    f.write(&c, 1);
  }
  const container::ContainerFile file(copy);
  const container::VerifyReport r = container::verify_container(file);
  ASSERT_FALSE(r.ok());
  bool named = false;
  for (const auto& p : r.problems) named = named || p.name == name;
  EXPECT_TRUE(named) << name;
}

}  // namespace
}  // namespace klein
