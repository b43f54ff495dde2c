// The VAE and its latent glue against the golden vectors of klein-tiny (vectors/vae/): every
// intermediate the reference stored, within a scaled difference of 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <map>

#include "core/error.h"
#include "core/npy.h"
#include "models/vae/vae.h"
#include "ops/conv2d.h"
#include "support/testing.h"
#include "support/tiny_model_suite.h"
#include "vae/random_store.h"
#include "weights/model_source.h"
#include "support/isa.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
constexpr double kTolerance = 1e-4;

// Keeps a copy of every intermediate the VAE reports.
struct Recorder {
  std::map<std::string, Tensor> seen;
  vae::Observer observer() {
    return [this](const std::string& name, const Tensor& t) { seen[name] = vae::clone(t); };
  }
};

Tensor load(const fs::path& path) { return read_npy(path).to_tensor(); }

// Compares each named intermediate with <dir>/<prefix><name>.npy and prints the scaled
// difference, so a run shows how close every stage is.
void expect_matches(const Recorder& r, const fs::path& dir, const std::string& prefix,
                    const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto it = r.seen.find(name);
    ASSERT_NE(it, r.seen.end()) << "intermediate " << name << " was not reported";
    const fs::path ref = dir / (prefix + name + ".npy");
    const std::vector<float> values = read_npy(ref).to_f32();
    ASSERT_EQ(int64_t(values.size()), it->second.numel()) << ref;
    std::cout << "  " << prefix << name << ": scaled diff "
              << testing::scaled_diff(it->second.data(), values.data(), it->second.numel()) << "\n";
    EXPECT_TRUE(testing::matches_npy(it->second, ref, kTolerance));
  }
}

class VaeGolden : public testing::TinyModelSuite {
 protected:
  static fs::path vectors() { return testing::tiny_vectors() / "vae"; }

  // packed_in [1, N, 128] as tokens [N, 128].
  static Tensor packed_tokens(const std::string& name) {
    Tensor t = load(vectors() / (name + "_packed_in.npy"));
    t.reshape({t.dim(1), t.dim(2)});
    return t;
  }

  // Decodes the golden case `name` (latent grid rows x cols) and compares the listed
  // intermediates with the official ones.
  void expect_decode(const std::string& name, int64_t rows, int64_t cols,
                     const std::vector<std::string>& stages) {
    vae::Vae model(*store_, cx_);
    Recorder r;
    const Tensor image = model.decode(packed_tokens(name), rows, cols, r.observer());
    EXPECT_EQ(image.shape(), (Shape{3, rows * 16, cols * 16}));
    expect_matches(r, vectors(), name + "_", stages);
  }

  Compute cx_{2};
};

const std::vector<std::string> kDecodeSteps = {"unpacked", "denormalized", "unpatchified"};

TEST_F(VaeGolden, DecodeH64W64EveryIntermediate) {
  expect_decode("decode_h64_w64", 4, 4,
                {"unpacked", "denormalized", "unpatchified", "post_quant_conv", "decoder_conv_in",
                 "decoder_mid_block", "decoder_up_blocks_0", "decoder_up_blocks_1",
                 "decoder_up_blocks_2", "decoder_up_blocks_3", "decoder_conv_out", "image"});
}

TEST_F(VaeGolden, DecodeH64W96) {
  expect_decode("decode_h64_w96", 4, 6, {"unpacked", "denormalized", "unpatchified", "image"});
}

TEST_F(VaeGolden, EncodeRef0EveryIntermediate) {
  vae::Vae model(*store_, cx_);
  Tensor pixels = load(vectors() / "encode_ref0" / "ref0_pixels.npy");
  pixels.reshape({pixels.dim(1), pixels.dim(2), pixels.dim(3)});
  Recorder r;
  const Tensor tokens = model.encode(pixels, r.observer());
  EXPECT_EQ(tokens.shape(), (Shape{20, 128}));
  expect_matches(r, vectors() / "encode_ref0", "ref0_",
                 {"encoder_down_blocks_0", "encoder_down_blocks_1", "encoder_down_blocks_2",
                  "encoder_down_blocks_3", "encoder_mid_block", "encoder_conv_out", "quant_conv",
                  "vae_mean", "patchified", "normalized", "tokens"});
}

// The end-to-end runs hand the decoder the same tensor the pipeline logged as vae_input.
TEST_F(VaeGolden, PipelineVaeInputAndImage) {
  vae::Vae model(*store_, cx_);
  const fs::path dir = testing::tiny_vectors() / "e2e" / "t2i_h96_w128";
  Tensor tokens = load(dir / "final_latents.npy");
  tokens.reshape({tokens.dim(1), tokens.dim(2)});
  const Tensor z = model.tokens_to_latent(tokens, 6, 8);
  EXPECT_TRUE(testing::matches_npy(z, dir / "vae_input.npy", kTolerance));
  const Tensor image = model.decode_latent(z);
  EXPECT_TRUE(testing::matches_npy(image, dir / "image_decoded.npy", kTolerance));
}

// With the arithmetic bf16_convolutions every convolution rounds its inputs and weights to bf16:
// each intermediate moves by a few 1e-3 of its range, accumulating through the decoder. Measured on
// klein-tiny: see the printed scaled differences; bound kBf16Tolerance.
constexpr double kBf16Tolerance = 3e-2;

// AMX tiles, or on AMD's AVX-512 BF16 CPUs the BF16 direct kernel for conv_out (the wide 3x3
// layers there run Winograd in float32; strided convolutions stay float32). Whether the fast
// arithmetic's bf16 convolutions run on this CPU (ops::conv2d_bf16_auto_available).
bool bf16_convolutions_available() { return ops::conv2d_bf16_auto_available(); }

TEST_F(VaeGolden, DecodeWithBf16ConvolutionsEveryIntermediate) {
  KLEIN_REQUIRE_PATH(bf16_convolutions_available(),
                     ops::conv2d_bf16_tiles_available() ? "amx" : "avx512-bf16",
                     "no BF16 convolutions on this CPU (they need AMX or AVX-512 BF16)");
  const Compute::Use tiles(cx_, {.fast_convolutions = true});
  vae::Vae model(*store_, cx_);
  for (const char* name : {"decode_h64_w64", "decode_h64_w96"}) {
    SCOPED_TRACE(name);
    const int64_t w = std::string(name) == "decode_h64_w64" ? 4 : 6;
    Recorder r;
    const Tensor image = model.decode(packed_tokens(name), 4, w, r.observer());
    EXPECT_EQ(image.shape(), (Shape{3, 64, 16 * w}));
    std::vector<std::string> steps = {"image"};
    if (w == 4)
      steps = {"post_quant_conv",     "decoder_conv_in",     "decoder_mid_block",
               "decoder_up_blocks_0", "decoder_up_blocks_1", "decoder_up_blocks_2",
               "decoder_up_blocks_3", "decoder_conv_out",    "image"};
    for (const std::string& step : steps) {
      SCOPED_TRACE(step);
      const fs::path ref = vectors() / (std::string(name) + "_" + step + ".npy");
      const std::vector<float> values = read_npy(ref).to_f32();
      const Tensor& got = r.seen.at(step);
      ASSERT_EQ(int64_t(values.size()), got.numel());
      const double diff = testing::scaled_diff(got.data(), values.data(), got.numel());
      std::cout << "  bf16 " << name << "_" << step << ": scaled diff " << diff << "\n";
      EXPECT_LE(diff, kBf16Tolerance);
    }
  }
}

TEST_F(VaeGolden, EncodeWithBf16Convolutions) {
  KLEIN_REQUIRE_PATH(bf16_convolutions_available(),
                     ops::conv2d_bf16_tiles_available() ? "amx" : "avx512-bf16",
                     "no BF16 convolutions on this CPU (they need AMX or AVX-512 BF16)");
  const Compute::Use tiles(cx_, {.fast_convolutions = true});
  vae::Vae model(*store_, cx_);
  Tensor pixels = load(vectors() / "encode_ref0" / "ref0_pixels.npy");
  pixels.reshape({pixels.dim(1), pixels.dim(2), pixels.dim(3)});
  Recorder r;
  model.encode(pixels, r.observer());
  for (const std::string step :
       {"encoder_down_blocks_3", "encoder_conv_out", "vae_mean", "tokens"}) {
    SCOPED_TRACE(step);
    const fs::path ref = vectors() / "encode_ref0" / ("ref0_" + step + ".npy");
    const std::vector<float> values = read_npy(ref).to_f32();
    const Tensor& got = r.seen.at(step);
    ASSERT_EQ(int64_t(values.size()), got.numel());
    const double diff = testing::scaled_diff(got.data(), values.data(), got.numel());
    std::cout << "  bf16 ref0_" << step << ": scaled diff " << diff << "\n";
    EXPECT_LE(diff, kBf16Tolerance);
  }
}

// A context on a path without fast bf16 products (AVX2, NEON or the portable one), where the
// fast convolutions are Winograd's (ops/conv2d.h).
quant::Isa winograd_isa() {
  for (quant::Isa isa : {quant::Isa::Avx2, quant::Isa::Neon})
    if (quant::isa_available(isa)) return isa;
  return quant::Isa::Scalar;
}

// Winograd's float32 convolutions stay within the exact paths' tolerance of the official
// decoder and encoder at every intermediate.
TEST_F(VaeGolden, WinogradDecodeAndEncodeEveryIntermediate) {
  Compute cx(2, winograd_isa());
  cx.arithmetic.fast_convolutions = true;
  vae::Vae model(*store_, cx);
  Recorder r;
  model.decode(packed_tokens("decode_h64_w64"), 4, 4, r.observer());
  expect_matches(r, vectors(), "decode_h64_w64_",
                 {"post_quant_conv", "decoder_conv_in", "decoder_mid_block", "decoder_up_blocks_0",
                  "decoder_up_blocks_1", "decoder_up_blocks_2", "decoder_up_blocks_3",
                  "decoder_conv_out", "image"});
  Tensor pixels = load(vectors() / "encode_ref0" / "ref0_pixels.npy");
  pixels.reshape({pixels.dim(1), pixels.dim(2), pixels.dim(3)});
  Recorder e;
  model.encode(pixels, e.observer());
  expect_matches(e, vectors() / "encode_ref0", "ref0_",
                 {"encoder_down_blocks_0", "encoder_down_blocks_3", "encoder_mid_block",
                  "encoder_conv_out", "vae_mean", "tokens"});
  // And it is not the exact path.
  vae::Vae exact(*store_, cx_);
  const Tensor a = exact.decode(packed_tokens("decode_h64_w64"), 4, 4);
  EXPECT_NE(0, std::memcmp(a.data(), r.seen.at("image").data(), size_t(a.numel()) * sizeof(float)));
}

// The other switches of the arithmetic do not touch the VAE: with attention and projections
// on tiles but not the convolutions, results are the float32 ones bit for bit.
TEST_F(VaeGolden, Bf16TilesOffIsFloat32) {
  vae::Vae model(*store_, cx_);
  const Tensor tokens = packed_tokens("decode_h64_w64");
  const Tensor a = model.decode(tokens, 4, 4);
  const Compute::Use other(cx_, {.bf16_attention = true, .float_on_tiles = true});
  const Tensor b = model.decode(tokens, 4, 4);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)));
}

TEST_F(VaeGolden, ResultsDoNotDependOnThreadCount) {
  Compute one(1), three(3);
  vae::Vae a(*store_, one), b(*store_, three);
  const Tensor tokens = packed_tokens("decode_h64_w96");
  const Tensor x = a.decode(tokens, 4, 6), y = b.decode(tokens, 4, 6);
  ASSERT_EQ(x.shape(), y.shape());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), size_t(x.numel()) * sizeof(float)));
  Tensor pixels = load(vectors() / "encode_ref0" / "ref0_pixels.npy");
  pixels.reshape({pixels.dim(1), pixels.dim(2), pixels.dim(3)});
  const Tensor p = a.encode(pixels), q = b.encode(pixels);
  EXPECT_EQ(0, std::memcmp(p.data(), q.data(), size_t(p.numel()) * sizeof(float)));
}

// Banded decodes (VaeMemory) against the whole-image decode, bit for bit: band requests
// of 3, 1 and 17 rows and the default (each rounded up to whole bands of the convolution,
// conv2d_band_rows), tensors in scratch files, in memory, and both. klein-tiny's images are
// narrower than one convolution band, so there they run as one band and test the planes and
// the statistics read back from them; VaeRealShapes.BandedDecodeMatchesWholeImage cuts.
std::vector<vae::VaeMemory> banded_variants(const std::string& dir) {
  std::vector<vae::VaeMemory> v(4);
  for (vae::VaeMemory& m : v) m.whole_limit = 0;     // always banded
  v[0].plane_limit = 0;                              // every tensor in a file
  v[0].scratch_dir = dir;
  v[0].band_rows = 3;
  v[1].band_rows = 1;       // every tensor in memory (plane_limit 128 MiB)
  v[2].plane_limit = 4096;  // the small levels in memory, the large ones in files
  v[2].scratch_dir = dir;
  v[2].band_rows = 17;
  return v;  // v[3]: band rows from VaeMemory::band_bytes
}

void expect_identical(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  int64_t first = -1;
  for (int64_t i = 0; i < a.numel() && first < 0; ++i)
    if (std::memcmp(a.data() + i, b.data() + i, sizeof(float)) != 0) first = i;
  EXPECT_EQ(first, -1) << what << ": first difference at " << first << ": "
                       << (first >= 0 ? a.data()[first] : 0) << " vs "
                       << (first >= 0 ? b.data()[first] : 0);
}

void expect_banded_matches_whole(WeightStore& store, Compute& cx, const Tensor& tokens,
                                 int64_t rows, int64_t cols) {
  const fs::path dir = testing::temp_dir("vae-banded");
  Recorder whole;
  const Tensor expected = vae::Vae(store, cx).decode(tokens, rows, cols, whole.observer());
  EXPECT_FALSE(vae::decode_memory(store.config().vae, rows * 16, cols * 16).banded);
  const std::vector<vae::VaeMemory> variants = banded_variants(dir.string());
  for (size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE("variant " + std::to_string(v));
    ASSERT_TRUE(vae::decode_memory(store.config().vae, rows * 16, cols * 16, variants[v]).banded);
    Recorder banded;
    const Tensor image =
        vae::Vae(store, cx, variants[v]).decode(tokens, rows, cols, banded.observer());
    expect_identical(image, expected, "image");
    for (const auto& [name, value] : whole.seen) {
      ASSERT_TRUE(banded.seen.count(name)) << name << " was not reported";
      expect_identical(banded.seen.at(name), value, name);
    }
    expect_identical(banded.seen.at("image"), image, "the returned image");
  }
  // Nothing is left in the scratch directory: files are unlinked when created.
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST_F(VaeGolden, BandedDecodeMatchesWholeImage) {
  expect_banded_matches_whole(*store_, cx_, packed_tokens("decode_h64_w64"), 4, 4);
  expect_banded_matches_whole(*store_, cx_, packed_tokens("decode_h64_w96"), 4, 6);
  if (bf16_convolutions_available()) {
    const Compute::Use tiles(cx_, {.fast_convolutions = true});
    expect_banded_matches_whole(*store_, cx_, packed_tokens("decode_h64_w96"), 4, 6);
  }
  Compute winograd(2, winograd_isa());
  winograd.arithmetic.fast_convolutions = true;
  expect_banded_matches_whole(*store_, winograd, packed_tokens("decode_h64_w96"), 4, 6);
}

TEST_F(VaeGolden, BandedDecodeMatchesTheReference) {
  vae::VaeMemory m;
  m.whole_limit = 0;
  m.band_rows = 7;
  vae::Vae model(*store_, cx_, m);
  Recorder r;
  model.decode(packed_tokens("decode_h64_w64"), 4, 4, r.observer());
  expect_matches(r, vectors(), "decode_h64_w64_",
                 {"decoder_up_blocks_0", "decoder_up_blocks_1", "decoder_up_blocks_2",
                  "decoder_up_blocks_3", "decoder_conv_out", "image"});
}

// The same for the encoder: every intermediate and the tokens, bit for bit.
void expect_banded_encode_matches_whole(WeightStore& store, Compute& cx, const Tensor& pixels) {
  const fs::path dir = testing::temp_dir("vae-banded-encode");
  Recorder whole;
  const Tensor expected = vae::Vae(store, cx).encode(pixels, whole.observer());
  EXPECT_FALSE(vae::encode_memory(store.config().vae, pixels.dim(1), pixels.dim(2)).banded);
  const std::vector<vae::VaeMemory> variants = banded_variants(dir.string());
  for (size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE("encode variant " + std::to_string(v));
    ASSERT_TRUE(
        vae::encode_memory(store.config().vae, pixels.dim(1), pixels.dim(2), variants[v]).banded);
    Recorder banded;
    const Tensor tokens = vae::Vae(store, cx, variants[v]).encode(pixels, banded.observer());
    expect_identical(tokens, expected, "tokens");
    for (const auto& [name, value] : whole.seen) {
      ASSERT_TRUE(banded.seen.count(name)) << name << " was not reported";
      expect_identical(banded.seen.at(name), value, name);
    }
  }
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST_F(VaeGolden, BandedEncodeMatchesWholeImageAndTheReference) {
  Tensor pixels = load(vectors() / "encode_ref0" / "ref0_pixels.npy");
  pixels.reshape({pixels.dim(1), pixels.dim(2), pixels.dim(3)});
  expect_banded_encode_matches_whole(*store_, cx_, pixels);
  vae::VaeMemory m;
  m.whole_limit = 0;
  m.band_rows = 5;
  Recorder r;
  vae::Vae(*store_, cx_, m).encode(pixels, r.observer());
  expect_matches(r, vectors() / "encode_ref0", "ref0_",
                 {"encoder_down_blocks_0", "encoder_down_blocks_1", "encoder_down_blocks_2",
                  "encoder_down_blocks_3", "encoder_mid_block", "tokens"});
}

TEST_F(VaeGolden, BandedDecodeNamesAnUnusableScratchDirectory) {
  vae::VaeMemory m;
  m.whole_limit = 0;
  m.plane_limit = 0;
  m.scratch_dir = "/nonexistent/scratch";
  try {
    vae::Vae(*store_, cx_, m).decode(packed_tokens("decode_h64_w64"), 4, 4);
    FAIL() << "a missing scratch directory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/scratch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TMPDIR"), std::string::npos) << e.what();
  }
}

TEST_F(VaeGolden, RejectsBadSizes) {
  vae::Vae model(*store_, cx_);
  Tensor pixels = Tensor::zeros({3, 64, 72});
  try {
    model.encode(pixels);
    FAIL() << "a 72-pixel-wide image was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.encode(Tensor::zeros({4, 64, 64})), Error);
  EXPECT_THROW(model.decode(Tensor::zeros({15, 128}), 4, 4), Error);
  EXPECT_THROW(model.decode(Tensor::zeros({16, 64}), 4, 4), Error);
}

// The real klein shapes (channels [128, 256, 512, 512], 16 channels per GroupNorm group,
// 512-dimensional attention) with random weights: runs end to end, sizes right, finite.
TEST(VaeRealShapes, DecodeAndEncodeRun) {
  testing::RandomVaeStore store;
  Compute cx(2);
  vae::Vae model(store, cx);
  EXPECT_EQ(model.pixels_per_token(), 16);
  Tensor tokens({2 * 3, 128});
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data()[i] = float(i % 7) / 7.0f - 0.4f;
  const Tensor image = model.decode(tokens, 2, 3);
  ASSERT_EQ(image.shape(), (Shape{3, 32, 48}));
  for (int64_t i = 0; i < image.numel(); ++i) ASSERT_TRUE(std::isfinite(image.data()[i])) << i;
  const Tensor back = model.encode(image);
  ASSERT_EQ(back.shape(), (Shape{6, 128}));
  for (int64_t i = 0; i < back.numel(); ++i) ASSERT_TRUE(std::isfinite(back.data()[i])) << i;
}

// Banded against whole at klein's real channel counts (the GEMM and direct kernels see the
// channel counts of a real decode), 16x1008 pixels so that the full-resolution layers run
// in two of the convolution's bands (12 + 4 rows; klein-tiny's images fit in one), whose
// GEMM tiles of 512 pixels do not start on rows.
TEST(VaeRealShapes, BandedDecodeMatchesWholeImage) {
  testing::RandomVaeStore store;
  Compute cx(2);
  Tensor tokens({1 * 63, 128});
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data()[i] = float(i % 11) / 11.0f - 0.45f;
  ASSERT_EQ(ops::conv2d_band_rows(1008), 12);
  expect_banded_matches_whole(store, cx, tokens, 1, 63);
  Compute winograd(2, winograd_isa());
  winograd.arithmetic.fast_convolutions = true;
  expect_banded_matches_whole(store, winograd, tokens, 1, 63);
}

// The encoder banded against whole at klein's real channel counts: 48x1008 pixels, so that
// conv_in and down_blocks.0 run in bands of 12 rows of the convolution (cut 3 times), its
// downsampler's 24 output rows at 504 pixels in bands of 20 (cut once), and the 512-pixel
// GEMM tiles of the shortcut in down_blocks.1 do not start on rows.
TEST(VaeRealShapes, BandedEncodeMatchesWholeImage) {
  testing::RandomVaeStore store;
  Compute cx(2);
  Tensor pixels({3, 48, 1008});
  for (int64_t i = 0; i < pixels.numel(); ++i) pixels.data()[i] = float(i % 13) / 6.5f - 1.0f;
  ASSERT_EQ(ops::conv2d_band_rows(504), 20);
  expect_banded_encode_matches_whole(store, cx, pixels);
}

// The activation estimate follows the plan: whole-image up to whole_limit, then bounded by
// the planes in memory and the bands, whatever the image size (klein's real shapes).
TEST(VaeRealShapes, BandedVaeMemoryIsBounded) {
  testing::RandomVaeStore store;
  const VaeConfig& c = store.config().vae;
  EXPECT_FALSE(vae::decode_memory(c, 512, 512).banded);
  EXPECT_TRUE(vae::decode_memory(c, 1024, 1024).banded);
  const size_t at_1024 = vae::decode_memory(c, 1024, 1024).activation_bytes;
  const size_t at_2048 = vae::decode_memory(c, 2048, 2048).activation_bytes;
  // (The Winograd weights of a 512-channel layer count 36 MiB of it: bench_vae --peak
  // decode-fast 1024 measured 606 MiB of RSS with the 160 MiB of weights, against 600 exact.)
  EXPECT_LT(at_1024, size_t(700) << 20);
  EXPECT_LT(at_2048, size_t(1100) << 20);  // the mid-block attention at 256x256 latents
  vae::VaeMemory whole;
  whole.whole_limit = SIZE_MAX;
  EXPECT_GT(vae::decode_memory(c, 1024, 1024, whole).activation_bytes, size_t(1400) << 20);
  // Scratch files: at 2048x2048 the most at once is in up_blocks.3.resnets.0, its 256-channel
  // input, 128-channel intermediate and 128-channel output at 4 Mi pixels: 2 KiB a pixel, 8 GiB.
  EXPECT_EQ(vae::decode_memory(c, 2048, 2048).scratch_bytes, uint64_t(8) << 30);
  EXPECT_EQ(vae::decode_memory(c, 512, 512).scratch_bytes, 0u);  // whole, in memory
  vae::VaeMemory in_memory;
  in_memory.plane_limit = SIZE_MAX;
  EXPECT_EQ(vae::decode_memory(c, 2048, 2048, in_memory).scratch_bytes, 0u);
  // The encoder: whole up to 512x512 (two 128-channel tensors at full resolution, 256 MiB),
  // banded from 1024x1024 (1 GiB whole), then two 128-channel files at full resolution (the
  // first level's ResNets: 1 GiB at 1024x1024).
  EXPECT_FALSE(vae::encode_memory(c, 512, 512).banded);
  EXPECT_TRUE(vae::encode_memory(c, 1024, 1024).banded);
  EXPECT_LT(vae::encode_memory(c, 1024, 1024).activation_bytes, size_t(700) << 20);
  EXPECT_EQ(vae::encode_memory(c, 1024, 1024).scratch_bytes, uint64_t(1) << 30);
  EXPECT_EQ(vae::encode_memory(c, 512, 512).scratch_bytes, 0u);
  vae::VaeMemory whole_encode;
  whole_encode.whole_limit = SIZE_MAX;
  EXPECT_GT(vae::encode_memory(c, 1024, 1024, whole_encode).activation_bytes, size_t(1000) << 20);
}

// The bf16 decoder against the float32 one at klein's real channel counts.
TEST(VaeRealShapes, Bf16DecodeCloseToFloat32) {
  KLEIN_REQUIRE_PATH(bf16_convolutions_available(),
                     ops::conv2d_bf16_tiles_available() ? "amx" : "avx512-bf16",
                     "no BF16 convolutions on this CPU (they need AMX or AVX-512 BF16)");
  testing::RandomVaeStore store;
  Compute cx(2);
  vae::Vae model(store, cx);
  Tensor tokens({2 * 3, 128});
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data()[i] = float(i % 7) / 7.0f - 0.4f;
  const Tensor a = model.decode(tokens, 2, 3);
  cx.arithmetic.fast_convolutions = true;
  const Tensor b = model.decode(tokens, 2, 3);
  ASSERT_EQ(a.shape(), b.shape());
  const double diff = testing::scaled_diff(b.data(), a.data(), a.numel());
  std::cout << "  real shapes, bf16 image: scaled diff " << diff << "\n";
  EXPECT_LE(diff, kBf16Tolerance);
  EXPECT_GT(diff, 0.0);
}

// The latent glue on its own: channel 4·c + 2·dy + dx, row-major tokens, exact inverses.
TEST(VaeLatents, PatchifyChannelOrder) {
  Tensor latent({2, 4, 6});
  for (int64_t i = 0; i < latent.numel(); ++i) latent.data()[i] = float(i);
  const Tensor packed = vae::patchify(latent, {2, 2});
  ASSERT_EQ(packed.shape(), (Shape{8, 2, 3}));
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t dy = 0; dy < 2; ++dy)
      for (int64_t dx = 0; dx < 2; ++dx)
        for (int64_t r = 0; r < 2; ++r)
          for (int64_t col = 0; col < 3; ++col)
            ASSERT_EQ(packed.data()[((4 * c + 2 * dy + dx) * 2 + r) * 3 + col],
                      latent.data()[(c * 4 + 2 * r + dy) * 6 + 2 * col + dx]);
  const Tensor back = vae::unpatchify(packed, {2, 2});
  EXPECT_EQ(0, std::memcmp(back.data(), latent.data(), sizeof(float) * size_t(latent.numel())));
}

TEST(VaeLatents, PackIsRowMajorAndInvertible) {
  Tensor latent({3, 2, 5});
  for (int64_t i = 0; i < latent.numel(); ++i) latent.data()[i] = float(i);
  const Tensor tokens = vae::pack_tokens(latent);
  ASSERT_EQ(tokens.shape(), (Shape{10, 3}));
  EXPECT_EQ(tokens.data()[(1 * 5 + 3) * 3 + 2], latent.data()[(2 * 2 + 1) * 5 + 3]);
  const Tensor back = vae::unpack_tokens(tokens, 2, 5);
  EXPECT_EQ(0, std::memcmp(back.data(), latent.data(), sizeof(float) * size_t(latent.numel())));
  EXPECT_THROW(vae::unpack_tokens(tokens, 3, 5), Error);
}

}  // namespace
}  // namespace klein
