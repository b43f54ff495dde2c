// The two 8-bit float formats decoded code by code against the table tools/fp8/fp8_fixture.py
// derives from their definitions (E4M3FN by the OCP specification's formula, E5M2 through
// numpy's binary16): tests/data/fp8/codes.json.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/files.h"

namespace klein {
namespace {

std::vector<uint32_t> expected_bits(const std::string& format) {
  const auto table = nlohmann::json::parse(
      read_text_file(std::string(KLEIN_SOURCE_DIR) + "/tests/data/fp8/codes.json"));
  std::vector<uint32_t> bits;
  for (const auto& s : table.at(format)) bits.push_back(uint32_t(std::stoul(s.get<std::string>(), nullptr, 16)));
  return bits;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

void expect_every_code(DType type, float (*decode)(uint8_t)) {
  const std::vector<uint32_t> want = expected_bits(std::string(dtype_name(type)));
  ASSERT_EQ(want.size(), 256u);
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[size_t(c)] = uint8_t(c);
  std::vector<float> bulk(256);
  to_f32(type, codes.data(), bulk.data(), 256);
  for (int c = 0; c < 256; ++c) {
    float w;
    std::memcpy(&w, &want[size_t(c)], 4);
    const float got = decode(uint8_t(c));
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(got)) << dtype_name(type) << " code " << c;
      EXPECT_TRUE(std::isnan(bulk[size_t(c)])) << dtype_name(type) << " code " << c;
    } else {  // bit for bit: -0 is -0
      EXPECT_EQ(bits_of(got), want[size_t(c)]) << dtype_name(type) << " code " << c << ": " << got << " vs " << w;
      EXPECT_EQ(bits_of(bulk[size_t(c)]), want[size_t(c)]) << dtype_name(type) << " code " << c;
    }
  }
}

TEST(Fp8, E4M3EveryCode) { expect_every_code(DType::F8_E4M3, f8_e4m3_to_f32); }
TEST(Fp8, E5M2EveryCode) { expect_every_code(DType::F8_E5M2, f8_e5m2_to_f32); }

TEST(Fp8, TypesAreOneByteAndNotPlainFloats) {
  for (DType t : {DType::F8_E4M3, DType::F8_E5M2}) {
    EXPECT_EQ(dtype_size(t), 1u);
    EXPECT_TRUE(dtype_is_fp8(t));
    EXPECT_FALSE(dtype_is_float(t));
  }
  EXPECT_EQ(dtype_name(DType::F8_E4M3), "F8_E4M3");
  EXPECT_EQ(dtype_name(DType::F8_E5M2), "F8_E5M2");
}

}  // namespace
}  // namespace klein
