// The GGUF file gguf-py wrote (tests/data/gguf/types.gguf, tools/gguf/make_fixtures.py):
// our reader must see its metadata as written and decode every tensor to exactly the float32
// values gguf-py decodes it to (types-ref.safetensors), bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "formats/gguf.h"
#include "formats/safetensors.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const char* name) { return fs::path(KLEIN_SOURCE_DIR) / "tests/data/gguf" / name; }

TEST(GgufFixture, MetadataOfEveryValueType) {
  const gguf::File f(fixture("types.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "klein-test");
  auto type_of = [&](const char* key) { return f.value(key)->type; };
  EXPECT_EQ(type_of("test.u8"), gguf::ValueType::U8);
  EXPECT_EQ(f.get_integer("test.u8"), 200);
  EXPECT_EQ(f.get_integer("test.i8"), -100);
  EXPECT_EQ(f.get_integer("test.u16"), 60000);
  EXPECT_EQ(f.get_integer("test.i16"), -30000);
  EXPECT_EQ(f.get_integer("test.u32"), 4000000000);
  EXPECT_EQ(f.get_integer("test.i32"), -2000000000);
  EXPECT_EQ(f.value("test.f32")->real, 0.25);
  EXPECT_EQ(type_of("test.bool"), gguf::ValueType::Bool);
  EXPECT_EQ(f.get_integer("test.bool"), 1);
  EXPECT_EQ(f.get_string("test.string"), "klein \u2713");
  EXPECT_EQ(type_of("test.u64"), gguf::ValueType::U64);
  EXPECT_EQ(f.get_integer("test.u64"), int64_t(1) << 40);
  EXPECT_EQ(f.get_integer("test.i64"), -(int64_t(1) << 40));
  EXPECT_EQ(f.value("test.f64")->real, -2.5);
  EXPECT_THAT(*f.get_strings("test.strings"), ::testing::ElementsAre("a", "", "\u00fc"));
  EXPECT_THAT(*f.get_integers("test.ints"), ::testing::ElementsAre(1, -2, 3));
  const gguf::Value* nested = f.value("test.nested");
  ASSERT_EQ(nested->arrays.size(), 2u);
  EXPECT_THAT(nested->arrays[0].integers, ::testing::ElementsAre(1, 2));
  EXPECT_THAT(nested->arrays[1].integers, ::testing::ElementsAre(3));
}

TEST(GgufFixture, EveryTypeDecodesBitForBitAsGgufPy) {
  const gguf::File f(fixture("types.gguf"));
  const SafetensorsFile ref(fixture("types-ref.safetensors"));
  std::set<std::string> types;
  for (const gguf::TensorInfo& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    const SafetensorsEntry* e = ref.find(t.name);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->dtype, DType::F32);
    EXPECT_EQ(t.shape, e->shape);  // ne reversed is the numpy shape
    std::vector<float> got(size_t(t.rows() * t.row_elems()));
    f.decode_rows(t, 0, t.rows(), got.data());
    ASSERT_EQ(got.size() * 4, e->end - e->begin);
    const std::byte* want = ref.mapping().data() + e->begin;
    size_t differ = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], want + 4 * i, 4) != 0 && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << "first at element " << first;
    types.insert(gguf::type_name(t.type));
  }
  // The fixture covers every type the reader decodes.
  EXPECT_THAT(types, ::testing::ElementsAre("BF16", "F16", "F32", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K",
                                            "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"));
}

TEST(GgufFixture, DecodesRowRanges) {
  // A slice of rows is the same as those rows of the whole tensor (convert reads in slices).
  const gguf::File f(fixture("types.gguf"));
  for (const char* name : {"q4_k", "q6_k", "q5_1"}) {
    const gguf::TensorInfo& t = *f.find(name);
    std::vector<float> all(size_t(t.rows() * t.row_elems())), part(size_t(t.row_elems()) * 2);
    f.decode_rows(t, 0, t.rows(), all.data());
    f.decode_rows(t, 1, 2, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), all.data() + t.row_elems(), part.size() * 4)) << name;
  }
}

}  // namespace
}  // namespace klein
