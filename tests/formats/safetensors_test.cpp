// The safetensors reader on well-formed and broken files: every broken file must be refused
// with a message that names the file and the problem, never read out of bounds.
#include "formats/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/files.h"
#include "formats/st_files.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::error_of;
using ::testing::HasSubstr;
using testing::StTensor;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir(std::string("safetensors-") +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  fs::path file(const std::string& name) const { return dir_ / name; }
  // The message of opening `path` as one file, which must fail.
  std::string open_error(const fs::path& path) const {
    return error_of([&] { SafetensorsFile f(path); });
  }
  // The message of opening a file with this header and `data_bytes` of data, which must fail
  // and name the file.
  std::string refused(const std::string& header, size_t data_bytes,
                      std::optional<uint64_t> declared_length = {}) const {
    const fs::path path = file("refused.safetensors");
    testing::write_raw_safetensors(path, header, data_bytes, declared_length);
    const std::string message = open_error(path);
    EXPECT_THAT(message, HasSubstr(path.string()));
    return message;
  }
  // A header naming one tensor with the given fields (raw JSON text for each).
  static std::string one_tensor(const std::string& name, const std::string& dtype,
                                const std::string& shape, const std::string& offsets) {
    return R"({")" + name + R"(":{"dtype":)" + dtype + R"(,"shape":)" + shape +
           R"(,"data_offsets":)" + offsets + "}}";
  }

  fs::path dir_;
};

TEST_F(Safetensors, ReadsAWellFormedFile) {
  const auto a = testing::pattern_bytes(2 * 3 * 2, 1);
  const auto b = testing::pattern_bytes(4 * 4, 2);
  testing::write_safetensors(
      file("ok.safetensors"),
      {{"a", "BF16", {2, 3}, a}, {"b", "F32", {4}, b}, {"empty", "F32", {0, 5}, {}}});
  SafetensorsFile f(file("ok.safetensors"));
  ASSERT_EQ(f.entries().size(), 3u);
  const SafetensorsEntry* e = f.find("a");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::BF16);
  EXPECT_EQ(e->shape, (Shape{2, 3}));
  const TensorView v = f.view(*e);
  ASSERT_EQ(v.nbytes, a.size());
  EXPECT_EQ(std::memcmp(v.data, a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(f.view(*f.find("b")).data, b.data(), b.size()), 0);
  EXPECT_EQ(f.find("empty")->end - f.find("empty")->begin, 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST_F(Safetensors, ReadsTheTinyModelFiles) {
  SafetensorsFile f(testing::tiny_model() / "transformer" / "diffusion_pytorch_model.safetensors");
  EXPECT_EQ(f.entries().size(), 49u);
  SafetensorsSet shards(testing::tiny_model() / "text_encoder" / "model.safetensors.index.json");
  EXPECT_EQ(shards.files().size(), 2u);
  EXPECT_EQ(shards.tensors().size(), 310u);
  EXPECT_NE(shards.find("model.layers.27.mlp.down_proj.weight"), nullptr);
}

TEST_F(Safetensors, FileShorterThanTheLengthField) {
  for (size_t size : {0, 1, 7}) {
    testing::write_text(file("short.safetensors"), std::string(size, 'x'));
    EXPECT_THAT(open_error(file("short.safetensors")),
                AllOf(HasSubstr(file("short.safetensors").string()),
                      HasSubstr("file of " + std::to_string(size) + " bytes is too small")));
  }
}

TEST_F(Safetensors, HeaderLengthBeyondTheEndOfTheFile) {
  EXPECT_THAT(refused("{}", 0, 1000),
              HasSubstr("header length 1000 does not fit in a file of 10 bytes"));
  // A length whose sum with 8 overflows 64 bits.
  testing::write_raw_safetensors(file("h.safetensors"), "{}", 0, ~uint64_t(0));
  EXPECT_THAT(open_error(file("h.safetensors")), HasSubstr("does not fit in a file of 10 bytes"));
}

TEST_F(Safetensors, DataOffsetsPastTheEnd) {
  testing::write_raw_safetensors(file("t.safetensors"),
                                 one_tensor("w", R"("F32")", "[16]", "[0,64]"), 40);
  EXPECT_THAT(open_error(file("t.safetensors")),
              AllOf(HasSubstr(file("t.safetensors").string()), HasSubstr("tensor w"),
                    HasSubstr("data_offsets [0, 64) lie outside the data area of 40 bytes")));
}

TEST_F(Safetensors, OffsetsThatRunBackwards) {
  testing::write_raw_safetensors(file("t.safetensors"), one_tensor("w", R"("F32")", "[0]", "[8,4]"),
                                 16);
  EXPECT_THAT(open_error(file("t.safetensors")),
              AllOf(HasSubstr(file("t.safetensors").string()),
                    HasSubstr("tensor w: data_offsets [8, 4) end before they begin")));
}

TEST_F(Safetensors, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_THAT(refused(header, 12), HasSubstr("tensors a and b overlap in the data area"));
}

TEST_F(Safetensors, OverlapHiddenBehindAnEmptyTensor) {
  // "big" spans [0, 32); the empty tensor sorts between it and "inner", which lies inside it.
  const std::string header = R"({"big":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},)"
                             R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("inner":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  testing::write_raw_safetensors(file("o.safetensors"), header, 32);
  EXPECT_THAT(open_error(file("o.safetensors")),
              HasSubstr("tensors big and inner overlap in the data area"));
}

TEST_F(Safetensors, HeaderThatIsNotJson) {
  EXPECT_THAT(refused(R"({"a":{"dtype":"F32",)", 0), HasSubstr("header is not valid JSON"));
  // Bytes that are not UTF-8 at all.
  testing::write_raw_safetensors(file("j.safetensors"), std::string("\xff\xfe\0\x01", 4), 0);
  EXPECT_THAT(open_error(file("j.safetensors")), HasSubstr("header is not valid JSON"));
}

TEST_F(Safetensors, HeaderThatIsNotAnObject) {
  for (const char* header : {"[1, 2]", "42", "\"text\"", "null"}) {
    testing::write_raw_safetensors(file("a.safetensors"), header, 0);
    EXPECT_THAT(open_error(file("a.safetensors")), AllOf(HasSubstr(file("a.safetensors").string()),
                                                         HasSubstr("header is not a JSON object")))
        << header;
  }
}

TEST_F(Safetensors, TensorEntryThatIsNotAnObject) {
  testing::write_raw_safetensors(file("e.safetensors"), R"({"w":[1,2,3]})", 0);
  EXPECT_THAT(open_error(file("e.safetensors")),
              AllOf(HasSubstr("tensor w"), HasSubstr("lacks dtype, shape or data_offsets")));
}

TEST_F(Safetensors, UnsupportedDtype) {
  EXPECT_THAT(refused(one_tensor("blocks.0.w", R"("F8_E4M3FNUZ")", "[4]", "[0,4]"), 4),
              HasSubstr("unsupported dtype F8_E4M3FNUZ in tensor blocks.0.w"));
  testing::write_raw_safetensors(file("d.safetensors"), one_tensor("w", "7", "[4]", "[0,4]"), 4);
  EXPECT_THAT(open_error(file("d.safetensors")), HasSubstr("tensor w: dtype is not a string"));
}

TEST_F(Safetensors, Fp8TensorsAreOneBytePerElement) {
  for (const char* type : {"F8_E4M3", "F8_E5M2"}) {
    testing::write_raw_safetensors(file("f.safetensors"),
                                   one_tensor("w", std::string("\"") + type + "\"", "[2,3]", "[0,6]"), 6);
    SafetensorsFile f(file("f.safetensors"));
    ASSERT_EQ(f.entries().size(), 1u);
    EXPECT_EQ(dtype_name(f.entries()[0].dtype), type);
    EXPECT_EQ(f.view(f.entries()[0]).nbytes, 6u);
  }
  testing::write_raw_safetensors(file("g.safetensors"), one_tensor("w", R"("F8_E5M2")", "[2,3]", "[0,12]"), 12);
  EXPECT_THAT(open_error(file("g.safetensors")), HasSubstr("x F8_E5M2 needs 6 bytes but data_offsets span 12"));
}

TEST_F(Safetensors, ShapeThatDisagreesWithTheOffsetSpan) {
  testing::write_raw_safetensors(file("s.safetensors"),
                                 one_tensor("w", R"("BF16")", "[3,4]", "[0,20]"), 20);
  EXPECT_THAT(
      open_error(file("s.safetensors")),
      AllOf(HasSubstr(file("s.safetensors").string()),
            HasSubstr("tensor w: shape [3, 4] x BF16 needs 24 bytes but data_offsets span 20")));
}

TEST_F(Safetensors, ShapeWithNegativeOrFractionalEntries) {
  for (const char* shape : {"[-2,4]", "[2.5,4]", "[\"2\",4]", "[null]", "4"}) {
    testing::write_raw_safetensors(file("n.safetensors"),
                                   one_tensor("w", R"("F32")", shape, "[0,32]"), 32);
    const std::string msg = open_error(file("n.safetensors"));
    EXPECT_THAT(msg, AllOf(HasSubstr(file("n.safetensors").string()), HasSubstr("tensor w")))
        << shape;
    EXPECT_THAT(msg, ::testing::AnyOf(HasSubstr("shape entries must be non-negative integers"),
                                      HasSubstr("shape is not an array")))
        << shape;
  }
}

TEST_F(Safetensors, ShapeWhoseSizeOverflows) {
  testing::write_raw_safetensors(
      file("big.safetensors"),
      one_tensor("w", R"("F32")", "[1099511627775,1099511627775,1099511627775]", "[0,4]"), 4);
  EXPECT_THAT(open_error(file("big.safetensors")), HasSubstr("tensor w: shape is absurdly large"));
}

TEST_F(Safetensors, OffsetsThatAreNotTwoIntegers) {
  for (const char* offsets : {"[0]", "[0,4,8]", "[-4,4]", "[0.5,4]", "\"0-4\""}) {
    testing::write_raw_safetensors(file("f.safetensors"),
                                   one_tensor("w", R"("F32")", "[1]", offsets), 8);
    EXPECT_THAT(open_error(file("f.safetensors")),
                HasSubstr("tensor w: data_offsets must be two non-negative integers"))
        << offsets;
  }
}

TEST_F(Safetensors, DuplicateTensorName) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THAT(refused(header, 8), HasSubstr("tensor name w appears twice in the header"));
}

TEST_F(Safetensors, RepeatedKeysInsideATensorEntryAreNotNames) {
  // Only top-level keys are tensor names; the reader must not confuse nested keys with them.
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"__metadata__":{"a":"x"}})";
  testing::write_raw_safetensors(file("nested.safetensors"), header, 8);
  SafetensorsFile f(file("nested.safetensors"));
  EXPECT_EQ(f.entries().size(), 2u);
}

TEST_F(Safetensors, MetadataThatIsNotAnObject) {
  testing::write_raw_safetensors(file("m.safetensors"), R"({"__metadata__":[1]})", 0);
  EXPECT_THAT(open_error(file("m.safetensors")), HasSubstr("__metadata__ is not an object"));
}

TEST_F(Safetensors, MissingFile) {
  EXPECT_THAT(open_error(file("absent.safetensors")),
              AllOf(HasSubstr("cannot open"), HasSubstr(file("absent.safetensors").string())));
  EXPECT_THAT(error_of([&] { SafetensorsSet s(file("absent.safetensors")); }),
              HasSubstr(file("absent.safetensors").string()));
}

TEST_F(Safetensors, DeeplyNestedHeader) {
  testing::write_raw_safetensors(file("deep.safetensors"), std::string(200000, '['), 0);
  EXPECT_THAT(open_error(file("deep.safetensors")), HasSubstr("header is not valid JSON"));
  const std::string nested = R"({"w":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  testing::write_raw_safetensors(file("deep.safetensors"), nested, 0);
  EXPECT_THAT(open_error(file("deep.safetensors")),
              HasSubstr("tensor w lacks dtype, shape or data_offsets"));
}

// Any damage to a file gives klein::Error or a valid file, never a crash or a read outside
// the mapping (the sanitizer build checks the latter).
class DamagedFile : public Safetensors {
 protected:
  void SetUp() override {
    Safetensors::SetUp();
    testing::write_safetensors(file("good.safetensors"),
                               {{"a", "BF16", {2, 3}, testing::pattern_bytes(12, 1)},
                                {"b", "F32", {4}, testing::pattern_bytes(16, 2)},
                                {"c", "I64", {}, testing::pattern_bytes(8, 3)}});
    good_ = read_text_file(file("good.safetensors"));
  }
  // Opens `bytes` as a file and reads every tensor it claims to have.
  void open_and_read(const std::string& bytes) {
    testing::write_text(file("damaged.safetensors"), bytes);
    try {
      SafetensorsFile f(file("damaged.safetensors"));
      uint64_t sum = 0;
      for (const auto& e : f.entries()) {
        const TensorView v = f.view(e);
        for (size_t i = 0; i < v.nbytes; ++i)
          sum += std::to_integer<uint8_t>(static_cast<const std::byte*>(v.data)[i]);
      }
      checksum_ += sum;  // keeps the reads from being optimised away
    } catch (const Error&) {
    }
  }
  std::string good_;
  uint64_t checksum_ = 0;
};

TEST_F(DamagedFile, TruncatedAtEveryLength) {
  for (size_t n = 0; n < good_.size(); ++n) {
    SCOPED_TRACE("length " + std::to_string(n));
    open_and_read(good_.substr(0, n));
    EXPECT_FALSE(error_of([&] { SafetensorsFile f(file("damaged.safetensors")); }).empty());
  }
}

TEST_F(DamagedFile, EveryHeaderByteChanged) {
  const size_t header_end = 8 + size_t(uint8_t(good_[0])) + (size_t(uint8_t(good_[1])) << 8);
  for (size_t i = 0; i < header_end; ++i)
    for (char c : {'{', '}', '"', ',', ':', '0', '9', '-', '.', 'e', ' ', '\0', '\xff'}) {
      std::string bytes = good_;
      bytes[i] = c;
      open_and_read(bytes);
    }
}

// --- sharded sets ------------------------------------------------------------------------

class ShardedSet : public Safetensors {
 protected:
  void write_shards() {
    testing::write_safetensors(file("part-1.safetensors"),
                               {{"a", "F32", {2}, testing::pattern_bytes(8, 1)}});
    testing::write_safetensors(file("part-2.safetensors"),
                               {{"b", "F32", {1}, testing::pattern_bytes(4, 2)},
                                {"c", "F32", {1}, testing::pattern_bytes(4, 3)}});
  }
  std::string set_error(const std::string& index_text) {
    testing::write_text(file("model.safetensors.index.json"), index_text);
    return error_of([&] { SafetensorsSet s(file("model.safetensors.index.json")); });
  }
  static constexpr const char* kGoodIndex =
      R"({"metadata":{},"weight_map":{"a":"part-1.safetensors","b":"part-2.safetensors",)"
      R"("c":"part-2.safetensors"}})";
};

TEST_F(ShardedSet, ReadsAllShards) {
  write_shards();
  testing::write_text(file("model.safetensors.index.json"), kGoodIndex);
  SafetensorsSet s(file("model.safetensors.index.json"));
  EXPECT_EQ(s.files().size(), 2u);
  EXPECT_EQ(s.tensors().size(), 3u);
  ASSERT_NE(s.find("c"), nullptr);
  EXPECT_EQ(s.find("c")->file->path().filename(), "part-2.safetensors");
  EXPECT_EQ(s.path(), file("model.safetensors.index.json"));
}

TEST_F(ShardedSet, ShardThatIsMissing) {
  write_shards();
  fs::remove(file("part-2.safetensors"));
  EXPECT_THAT(set_error(kGoodIndex), AllOf(HasSubstr(file("model.safetensors.index.json").string()),
                                           HasSubstr("shard part-2.safetensors is missing"),
                                           HasSubstr(file("part-2.safetensors").string())));
}

TEST_F(ShardedSet, TensorTheShardDoesNotHold) {
  write_shards();
  EXPECT_THAT(set_error(R"({"weight_map":{"a":"part-1.safetensors","b":"part-2.safetensors",)"
                        R"("c":"part-2.safetensors","d":"part-1.safetensors"}})"),
              AllOf(HasSubstr(file("model.safetensors.index.json").string()),
                    HasSubstr("tensor d is listed in shard part-1.safetensors but that file does "
                              "not contain it")));
}

TEST_F(ShardedSet, TensorInAnotherShardThanListed) {
  write_shards();
  EXPECT_THAT(
      set_error(R"({"weight_map":{"a":"part-1.safetensors","b":"part-1.safetensors",)"
                R"("c":"part-2.safetensors"}})"),
      HasSubstr(
          "tensor b is listed in shard part-1.safetensors but that file does not contain it"));
}

TEST_F(ShardedSet, SameTensorInTwoShards) {
  testing::write_safetensors(file("part-1.safetensors"),
                             {{"a", "F32", {1}, testing::pattern_bytes(4, 1)}});
  testing::write_safetensors(file("part-2.safetensors"),
                             {{"a", "F32", {1}, testing::pattern_bytes(4, 2)}});
  EXPECT_THAT(
      set_error(R"({"weight_map":{"a":"part-1.safetensors","b":"part-2.safetensors"}})"),
      ::testing::AnyOf(HasSubstr("tensor a appears in shard part-2.safetensors but the index "
                                 "places it in part-1.safetensors"),
                       HasSubstr("tensor b is listed in shard part-2.safetensors")));
}

TEST_F(ShardedSet, IndexThatIsBroken) {
  write_shards();
  EXPECT_THAT(
      set_error("{not json"),
      AllOf(HasSubstr(file("model.safetensors.index.json").string()), HasSubstr("not valid JSON")));
  EXPECT_THAT(set_error(R"({"metadata":{}})"), HasSubstr("no weight_map object"));
  EXPECT_THAT(set_error(R"({"weight_map":{"a":3}})"),
              HasSubstr("weight_map entry a is not a file name"));
  EXPECT_THAT(set_error(R"({"weight_map":{"a":"../part-1.safetensors"}})"),
              HasSubstr("shard name '../part-1.safetensors' must be a plain file name"));
  EXPECT_THAT(set_error(R"({"weight_map":{"a":".."}})"), HasSubstr("must be a plain file name"));
}

TEST_F(ShardedSet, BrokenShardIsNamed) {
  write_shards();
  testing::write_raw_safetensors(file("part-2.safetensors"), "{", 0);
  EXPECT_THAT(set_error(kGoodIndex),
              AllOf(HasSubstr(file("part-2.safetensors").string()), HasSubstr("not valid JSON")));
}

}  // namespace
}  // namespace klein
