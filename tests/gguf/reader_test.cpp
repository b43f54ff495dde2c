// The GGUF reader on well-formed and broken files. The broken ones are built here byte by
// byte (the well-formed files made by gguf-py are in fixtures_test.cpp): every one must be
// refused with a message naming the file and the key or tensor, never read out of bounds.
#include "formats/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "support/gguf_bytes.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::error_of;
using ::testing::HasSubstr;

// Writes GGUF bytes: the header fields as given, so that each test can break one.
struct Builder : testing::GgufBytes {
  fs::path write(const std::string& name) const {
    const fs::path p = testing::temp_dir("gguf-reader") / name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return p;
  }
};

std::string open_error(const fs::path& p) {
  return error_of([&] { gguf::File f(p); });
}

TEST(GgufReader, ReadsMetadataAndTensors) {
  Builder b;
  b.header(2, 4);
  b.str("general.architecture");
  b.u32(8);
  b.str("flux");
  b.str("count");
  b.u32(5);  // i32
  b.u32(uint32_t(-7));
  b.str("names");
  b.u32(9);
  b.u32(8);
  b.u64(2);
  b.str("a");
  b.str("bc");
  b.str("ids");
  b.u32(9);
  b.u32(4);  // u32 items
  b.u64(3);
  for (uint32_t v : {1u, 2u, 3u}) b.u32(v);
  b.tensor("w", {4, 2}, 0, 0);      // F32, our shape [2, 4]
  b.tensor("h", {2, 1, 3}, 1, 32);  // F16, our shape [3, 1, 2]
  b.pad();
  const size_t data = b.bytes.size();
  const float w[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  b.bytes.append(reinterpret_cast<const char*>(w), sizeof w);
  b.pad();
  const uint16_t h[6] = {0x3c00, 0x4000, 0xbc00, 0, 0x3800, 0x4200};  // 1 2 -1 0 0.5 3
  b.bytes.append(reinterpret_cast<const char*>(h), sizeof h);
  const gguf::File f(b.write("good.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.data_start(), data);
  EXPECT_EQ(f.get_string("general.architecture"), "flux");
  EXPECT_EQ(f.get_integer("count"), -7);
  ASSERT_NE(f.get_strings("names"), nullptr);
  EXPECT_THAT(*f.get_strings("names"), ::testing::ElementsAre("a", "bc"));
  EXPECT_THAT(*f.get_integers("ids"), ::testing::ElementsAre(1, 2, 3));
  EXPECT_THAT(error_of([&] { (void)f.get_string("count"); }), HasSubstr("count is a i32"));
  const gguf::TensorInfo* t = f.find("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (Shape{2, 4}));
  EXPECT_EQ(t->rows(), 2);
  float row[4];
  f.decode_rows(*t, 1, 1, row);
  EXPECT_EQ(row[0], 4.0f);
  EXPECT_EQ(row[3], 7.0f);
  const gguf::TensorInfo* t2 = f.find("h");
  EXPECT_EQ(t2->shape, (Shape{3, 1, 2}));
  float hv[6];
  f.decode_rows(*t2, 0, 3, hv);
  EXPECT_EQ(hv[0], 1.0f);
  EXPECT_EQ(hv[2], -1.0f);
  EXPECT_EQ(hv[5], 3.0f);
}

TEST(GgufReader, RefusesWhatIsNotGguf) {
  Builder b;
  b.bytes = "GGML and then some";
  EXPECT_THAT(open_error(b.write("magic.gguf")),
              AllOf(HasSubstr("magic.gguf"), HasSubstr("not a GGUF file")));
  Builder v1;
  v1.header(0, 0, 1);
  EXPECT_THAT(open_error(v1.write("v1.gguf")), HasSubstr("version 1"));
  Builder be;
  be.header(0, 0, 0x03000000);
  EXPECT_THAT(open_error(be.write("be.gguf")), HasSubstr("big-endian"));
  Builder tiny;
  tiny.bytes = "GG";
  EXPECT_THAT(open_error(tiny.write("tiny.gguf")), HasSubstr("too small"));
}

TEST(GgufReader, RefusesTruncatedHeaders) {
  Builder b;
  b.header(1, 1);
  b.str("general.architecture");
  b.u32(8);
  b.str("flux");
  b.tensor("w", {32}, 0, 0);
  b.pad();
  b.bytes.append(128, '\0');
  // Every cut inside the header is an error that names the file; none reads past the end.
  for (size_t cut = 4; cut < 120; cut += 3) {
    Builder c;
    c.bytes = b.bytes.substr(0, cut);
    const std::string e = open_error(c.write("cut.gguf"));
    EXPECT_THAT(e, HasSubstr("cut.gguf")) << "cut at " << cut;
  }
  Builder data_cut;
  data_cut.bytes = b.bytes.substr(0, b.bytes.size() - 1);
  EXPECT_THAT(open_error(data_cut.write("data.gguf")),
              AllOf(HasSubstr("tensor w"), HasSubstr("past the end")));
}

TEST(GgufReader, RefusesHugeCountsBeforeAllocating) {
  Builder b;
  b.header(1ull << 60, 0);
  EXPECT_THAT(open_error(b.write("tensors.gguf")), HasSubstr("tensor count"));
  Builder k;
  k.header(0, 1ull << 40);
  EXPECT_THAT(open_error(k.write("kv.gguf")), HasSubstr("metadata count"));
  Builder s;
  s.header(0, 1);
  s.u64(1ull << 62);  // key length
  s.bytes.append(16, 'k');
  EXPECT_THAT(open_error(s.write("key.gguf")), HasSubstr("metadata key 0"));
  Builder a;
  a.header(0, 1);
  a.str("tokenizer.ggml.tokens");
  a.u32(9);
  a.u32(8);
  a.u64(1ull << 61);
  EXPECT_THAT(open_error(a.write("array.gguf")),
              AllOf(HasSubstr("tokenizer.ggml.tokens"), HasSubstr("array length")));
  Builder d;
  d.header(1, 0);
  d.tensor("big", {1ull << 39, 1ull << 39}, 0, 0);
  EXPECT_THAT(open_error(d.write("dims.gguf")),
              AllOf(HasSubstr("tensor big"), HasSubstr("absurdly large")));
}

TEST(GgufReader, RefusesBadTensorInfos) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data,
                const char* name) {
    Builder b;
    b.header(1, 0);
    b.tensor("blk.0.w", ne, type, offset);
    b.pad();
    b.bytes.append(data, '\0');
    return open_error(b.write(name));
  };
  EXPECT_THAT(one({32}, 99, 0, 128, "type.gguf"),
              AllOf(HasSubstr("blk.0.w"), HasSubstr("unknown GGML type 99")));
  EXPECT_THAT(one({32}, 0, 8, 256, "misaligned.gguf"),
              AllOf(HasSubstr("blk.0.w"), HasSubstr("not a multiple of the alignment 32")));
  EXPECT_THAT(one({48}, 8, 0, 256, "block.gguf"),
              AllOf(HasSubstr("blk.0.w"), HasSubstr("Q8_0 block of 32")));
  EXPECT_THAT(one({32}, 0, 1ull << 40, 256, "offset.gguf"),
              AllOf(HasSubstr("blk.0.w"), HasSubstr("past the end")));
  EXPECT_THAT(one({32}, 0, 0xffffffffffffffe0ull, 256, "wrap.gguf"), HasSubstr("blk.0.w"));
  EXPECT_THAT(one({1, 1, 1, 1, 1}, 0, 0, 256, "dims.gguf"), HasSubstr("5 dimensions"));

  Builder twice;
  twice.header(2, 0);
  twice.tensor("a", {8}, 0, 0);
  twice.tensor("b", {8}, 0, 0);
  twice.pad();
  twice.bytes.append(64, '\0');
  EXPECT_THAT(open_error(twice.write("overlap.gguf")), HasSubstr("overlap"));
  Builder same;
  same.header(2, 0);
  same.tensor("a", {8}, 0, 0);
  same.tensor("a", {8}, 0, 32);
  same.pad();
  same.bytes.append(64, '\0');
  EXPECT_THAT(open_error(same.write("twice.gguf")), HasSubstr("tensor a appears twice"));
}

TEST(GgufReader, RefusesBadMetadata) {
  Builder t;
  t.header(0, 1);
  t.str("x");
  t.u32(13);
  EXPECT_THAT(open_error(t.write("vtype.gguf")),
              AllOf(HasSubstr("metadata x"), HasSubstr("unknown value type 13")));
  Builder al;
  al.header(0, 1);
  al.str("general.alignment");
  al.u32(4);
  al.u32(24);
  EXPECT_THAT(open_error(al.write("align.gguf")), HasSubstr("not a power of two"));
  Builder al0;
  al0.header(0, 1);
  al0.str("general.alignment");
  al0.u32(4);
  al0.u32(0);
  EXPECT_THAT(open_error(al0.write("align0.gguf")), HasSubstr("general.alignment 0"));
  Builder ty;
  ty.header(0, 1);
  ty.str("general.alignment");
  ty.u32(10);
  ty.u64(32);
  EXPECT_THAT(open_error(ty.write("align64.gguf")), HasSubstr("expected u32"));
  Builder twice;
  twice.header(0, 2);
  for (int i = 0; i < 2; ++i) {
    twice.str("k");
    twice.u32(0);
    twice.bytes += '\1';
  }
  EXPECT_THAT(open_error(twice.write("key.gguf")), HasSubstr("k appears twice"));
  Builder deep;
  deep.header(0, 1);
  deep.str("deep");
  deep.u32(9);
  for (int i = 0; i < 20; ++i) {
    deep.u32(9);
    deep.u64(1);
  }
  deep.bytes.append(64, '\0');
  EXPECT_THAT(open_error(deep.write("deep.gguf")), HasSubstr("nested deeper"));
  Builder b;
  b.header(0, 1);
  b.str("flag");
  b.u32(7);
  b.bytes += '\2';
  EXPECT_THAT(open_error(b.write("bool.gguf")), HasSubstr("a bool holds 2"));
}

TEST(GgufReader, AlignmentFromMetadata) {
  Builder b;
  b.header(1, 1);
  b.str("general.alignment");
  b.u32(4);
  b.u32(64);
  b.tensor("w", {16}, 0, 0);
  b.pad(64);
  const size_t data = b.bytes.size();
  b.bytes.append(64, '\0');
  const gguf::File f(b.write("align64.gguf"));
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_start(), data);
}

TEST(GgufReader, UndecodableTypesSayWhich) {
  Builder b;
  b.header(1, 0);
  b.tensor("iq", {256}, 16, 0);  // IQ2_XXS: 66 bytes a block
  b.pad();
  b.bytes.append(66, '\0');
  const gguf::File f(b.write("iq.gguf"));
  float out[256];
  EXPECT_THAT(error_of([&] { f.decode_rows(*f.find("iq"), 0, 1, out); }),
              AllOf(HasSubstr("tensor iq"), HasSubstr("IQ2_XXS cannot be read")));
}

// A tensor with a zero-length dimension has rows of no elements: decoding one reads and writes
// nothing, whatever the pointers (the parser fuzzer found a memcpy from such a row into the
// null data of an empty vector; the sanitizer stage of the tests catches a regression).
TEST(GgufReader, EmptyRowsDecodeToNothing) {
  for (uint32_t type : {0u, 1u, 30u, 8u}) {  // F32, F16, BF16, Q8_0
    Builder b;
    b.header(1, 0);
    b.tensor("e", {0, 3}, type, 0);
    b.pad();
    const gguf::File f(b.write("empty-rows.gguf"));
    const gguf::TensorInfo* t = f.find("e");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->rows(), 3);
    EXPECT_EQ(t->row_elems(), 0);
    std::vector<float> none;
    f.decode_rows(*t, 0, 3, none.data());
    EXPECT_TRUE(none.empty());
  }
}

}  // namespace
}  // namespace klein
