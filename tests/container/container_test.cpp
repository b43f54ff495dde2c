// The container: conversion of the tiny model at every storage type, exactness against the
// safetensors, integrity errors (each region named), the policy, and the CLI commands.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "convert/convert.h"
#include "convert/inspect.h"
#include "convert/policy.h"
#include "convert/storage.h"
#include "core/error.h"
#include "core/files.h"
#include "formats/container/format.h"
#include "formats/container/reader.h"
#include "quant/matmul.h"
#include "support/testing.h"
#include "support/tiny_container.h"
#include "weights/container_store.h"
#include "weights/model_source.h"

namespace klein {
namespace {

using testing::error_of;

namespace fs = std::filesystem;
using convert::ConvertOptions;

// --- helpers -----------------------------------------------------------------------------

std::string read_bytes(const fs::path& p) { return read_text_file(p); }

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

#define EXPECT_ERROR_HAS(expr, text)                                        \
  do {                                                                      \
    const std::string msg_ = error_of([&] { expr; });                       \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error was: " << msg_; \
  } while (0)

fs::path convert_tiny(const fs::path& dir, const std::string& type, const std::string& policy = "",
                      uint64_t alignment = container::kMinAlignment) {
  ConvertOptions o;
  o.source.model = testing::tiny_model();
  o.output = dir / ("tiny-" + type + ".klein");
  o.target = convert::parse_storage_type(type, "test");
  o.policy_text = policy;
  o.policy_origin = policy.empty() ? "" : "test-policy";
  o.alignment = alignment;
  convert::convert_model(o);
  return o.output;
}

// The header and index of a container file, decoded, for tests that rewrite them.
struct Parsed {
  std::string bytes;
  container::Header header;
  container::Index index;
};

Parsed parse(const fs::path& p) {
  Parsed r;
  r.bytes = read_bytes(p);
  const auto span = std::as_bytes(std::span(r.bytes.data(), r.bytes.size()));
  r.header = container::decode_header(span, r.bytes.size(), p.string());
  r.index = container::decode_index(
      r.header, span.subspan(r.header.index_offset, r.header.index_size), p.string());
  return r;
}

// Writes `r` back with a re-encoded index and header (checksums recomputed).
void rewrite(const fs::path& p, Parsed r) {
  const auto index = container::encode_index(r.index);
  ASSERT_EQ(index.size(), r.header.index_size);
  std::memcpy(r.bytes.data() + r.header.index_offset, index.data(), index.size());
  r.header.index_xxh3 = container::xxh3(index.data(), index.size());
  const auto head = container::encode_header(r.header);
  std::memcpy(r.bytes.data(), head.data(), head.size());
  write_bytes(p, r.bytes);
}

void flip_bit(const fs::path& p, uint64_t offset, int bit = 0) {
  std::string b = read_bytes(p);
  b[offset] = char(b[offset] ^ (1 << bit));
  write_bytes(p, b);
}

class Containers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(testing::temp_dir("containers"));
    source_ = open_model(testing::tiny_model()).release();
  }
  static void TearDownTestSuite() {
    delete source_;
    source_ = nullptr;
  }
  // The tiny model converted to `type`, once per test run (read only: copy_of to damage it).
  static fs::path file(const std::string& type) { return testing::shared_tiny_container(type); }
  static const std::vector<std::string>& all_types() {
    static const std::vector<std::string> types = {"f32", "bf16", "f16", "q8", "q4"};
    return types;
  }
  // A private copy of a converted container to damage.
  static fs::path copy_of(const std::string& type, const std::string& name) {
    const fs::path p = *dir_ / (name + ".klein");
    fs::copy_file(file(type), p, fs::copy_options::overwrite_existing);
    return p;
  }
  static fs::path* dir_;
  static WeightStore* source_;
};
fs::path* Containers::dir_ = nullptr;
WeightStore* Containers::source_ = nullptr;

// --- conversion and exactness ------------------------------------------------------------

TEST_F(Containers, OpenModelRecognisesTheContainerAndKeepsTheConfig) {
  for (const auto& type : all_types()) {
    auto store = open_model(file(type));
    const StoreOrigin origin = store->origin();
    ASSERT_NE(origin.container_metadata, nullptr) << type;
    EXPECT_EQ(origin.files, std::vector<fs::path>{file(type)}) << type;
    EXPECT_EQ(to_json(store->config()), to_json(source_->config())) << type;
    EXPECT_EQ(store->identity().rfind("klein-container:", 0), 0u);
  }
}

TEST_F(Containers, UnitsAreInFileOrderAndUnusedPartsAreDropped) {
  auto store = open_model(file("bf16"));
  const auto units = store->units();
  const auto& c = store->config();
  std::vector<std::string> expected;
  for (int64_t l = 0; l < c.text_encoder.layers_needed(); ++l)
    expected.push_back(text_layer_unit(l));
  for (int64_t i = 0; i < c.transformer.num_double_blocks; ++i)
    expected.push_back(double_block_unit(i));
  for (int64_t i = 0; i < c.transformer.num_single_blocks; ++i)
    expected.push_back(single_block_unit(i));
  for (const char* u : {"transformer.shared", "text_encoder.embed", "vae.encoder", "vae.decoder",
                        "vae.latent_stats"})
    expected.push_back(u);
  EXPECT_EQ(units, expected);
  EXPECT_FALSE(store->has_unit("text_encoder.layer.27"));
  EXPECT_FALSE(store->has_unit("text_encoder.norm"));

  const StoreOrigin origin = store->origin();
  ASSERT_NE(origin.container_metadata, nullptr);
  const auto& meta = *origin.container_metadata;
  std::set<std::string> dropped;
  for (const auto& d : meta["conversion"]["dropped"])
    dropped.insert(d["tensor"].get<std::string>());
  EXPECT_TRUE(dropped.count("text_encoder.model.norm.weight"));
  EXPECT_TRUE(dropped.count("text_encoder.model.layers.27.self_attn.q_proj.weight"));
  EXPECT_TRUE(dropped.count("vae.bn.num_batches_tracked"));
  EXPECT_EQ(dropped.size(), 11u + 1 + 1);  // layer 27's tensors, the final norm, the counter
}

TEST_F(Containers, UnitsAreAlignedAndContiguous) {
  const container::ContainerFile f(file("bf16"));
  for (const auto& u : f.index().units) {
    EXPECT_EQ(u.offset % container::kMinAlignment, 0u) << u.name;
    const auto ts = f.tensors_of(u);
    EXPECT_EQ(ts.front().offset, u.offset);
    EXPECT_EQ(ts.back().offset + ts.back().size, u.offset + u.size);
    for (const auto& t : ts) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  }
}

TEST_F(Containers, Bf16ContainerIsBitIdenticalToTheSafetensors) {
  auto store = open_model(file("bf16"));
  size_t compared = 0;
  for (const auto& unit : store->units()) {
    UnitRef a = store->acquire(unit);
    UnitRef b = source_->acquire(unit);
    ASSERT_EQ(a->weights().size(), b->weights().size()) << unit;
    for (const Weight& w : b->weights()) {
      const Weight* c = a->find(w.name.substr(a->prefix().size()));
      ASSERT_NE(c, nullptr) << w.name;
      EXPECT_EQ(c->dtype, DType::BF16) << w.name;
      EXPECT_EQ(c->shape, w.shape) << w.name;
      ASSERT_EQ(c->nbytes, w.nbytes) << w.name;
      EXPECT_EQ(std::memcmp(c->data, w.data, w.nbytes), 0) << w.name;
      ++compared;
    }
  }
  // Every tensor the source store offers except the dropped layer 27 and final norm.
  size_t source_tensors = 0;
  for (const auto& unit : source_->units())
    if (unit != "text_encoder.layer.27" && unit != "text_encoder.norm")
      source_tensors += source_->acquire(unit)->weights().size();
  EXPECT_EQ(compared, source_tensors);
}

TEST_F(Containers, F32AndF16HoldExactlyTheConvertedValues) {
  for (const char* type : {"f32", "f16"}) {
    auto store = open_model(file(type));
    for (const auto& unit : store->units()) {
      UnitRef a = store->acquire(unit);
      UnitRef b = source_->acquire(unit);
      for (const Weight& w : b->weights()) {
        const Weight& c = a->get(w.name.substr(a->prefix().size()));
        const DType want = std::string(type) == "f32" ? DType::F32 : DType::F16;
        ASSERT_EQ(c.dtype, want) << w.name;  // the float floors keep the target type
        const std::vector<float> src = weight_to_floats(w);
        const std::vector<float> got = weight_to_floats(c);
        ASSERT_EQ(src.size(), got.size());
        for (size_t i = 0; i < src.size(); ++i) {
          const float expect = want == DType::F32 ? src[i] : f16_to_f32(f32_to_f16(src[i]));
          ASSERT_EQ(got[i], expect) << w.name << "[" << i << "]";
          // F16 keeps 11 significant bits: relative error <= 2^-11 in the normal range.
          if (want == DType::F16 && std::fabs(src[i]) > 6.2e-5f) {
            ASSERT_LE(std::fabs(got[i] - src[i]), std::ldexp(std::fabs(src[i]), -11));
          }
        }
      }
    }
  }
}

// Q8 / Q4: the policy's types, float tensors copied exactly, quantized ones within the
// error bounds of the block formats (quant/blocks.h), per 32-value block b of a row:
//   Q8  |w - w'| <= max_b|w| / 254 * (1 + 2^-9)        (int8 rounding; the f16 scale is
//                                                       rounded up, so nothing is clipped)
//   Q4  the quantizer minimises the block's squared error and may clip the extremes, so the
//       bound is on the block's RMS error, and loosely on single values, in steps
//       s_b = (max_b w - min_b w) / 15: RMS <= 0.4 s_b, |w - w'| <= 1.5 s_b.
TEST_F(Containers, QuantizedContainersFollowThePolicyWithinErrorBounds) {
  const convert::PrecisionPolicy policy;
  for (const char* type : {"q8", "q4"}) {
    const DType target = convert::parse_storage_type(type, "test");
    auto store = open_model(file(type));
    std::map<DType, size_t> count;
    std::map<DType, double> worst;  // largest error as a fraction of the bound
    double worst_rms = 0;           // Q4: largest block RMS error in steps
    for (const auto& unit : store->units()) {
      UnitRef a = store->acquire(unit);
      UnitRef b = source_->acquire(unit);
      for (const Weight& w : b->weights()) {
        const Weight& c = a->get(w.name.substr(a->prefix().size()));
        DType want = policy.choose(w.name, w.shape, target).type;
        if (!convert::can_store(want, w.shape)) want = DType::BF16;
        ASSERT_EQ(c.dtype, want) << w.name;
        ++count[c.dtype];
        if (c.dtype == DType::BF16) {
          ASSERT_EQ(c.nbytes, w.nbytes);
          EXPECT_EQ(std::memcmp(c.data, w.data, w.nbytes), 0) << w.name;
          continue;
        }
        EXPECT_EQ(c.layout, uint8_t(quant::preferred_layout(c.dtype))) << w.name;
        quant::Matrix m;
        m.type = c.dtype;
        m.layout = quant::Layout(c.layout);
        m.rows = c.rows();
        m.cols = c.cols();
        m.data = c.data;
        m.nbytes = c.nbytes;
        std::vector<float> got(size_t(c.numel()));
        quant::unpack_rows(m, 0, m.rows, got.data());
        const std::vector<float> src = weight_to_floats(w);
        for (size_t b0 = 0; b0 < src.size(); b0 += 32) {
          float lo = src[b0], hi = src[b0], amax = 0;
          for (size_t i = b0; i < b0 + 32; ++i) {
            lo = std::min(lo, src[i]);
            hi = std::max(hi, src[i]);
            amax = std::max(amax, std::fabs(src[i]));
          }
          const double step = (hi - lo) / 15.0;
          const double bound =
              c.dtype == DType::Q8 ? amax / 254.0 * (1 + std::ldexp(1.0, -9)) : 1.5 * step;
          double sq = 0;
          for (size_t i = b0; i < b0 + 32; ++i) {
            const double err = std::fabs(double(got[i]) - src[i]);
            sq += err * err;
            worst[c.dtype] = std::max(worst[c.dtype], bound > 0 ? err / bound : err);
            ASSERT_LE(err, bound + 1e-30) << w.name << "[" << i << "]";
          }
          if (c.dtype == DType::Q4) {
            const double rms = std::sqrt(sq / 32);
            worst_rms = std::max(worst_rms, step > 0 ? rms / step : rms);
            ASSERT_LE(rms, 0.4 * step + 1e-30) << w.name << " block at " << b0;
          }
        }
      }
    }
    std::printf(
        "%s container: %zu Q8, %zu Q4, %zu BF16 tensors; worst error / bound: Q8 %.3f, "
        "Q4 %.3f; Q4 block RMS error up to %.3f steps\n",
        type, count[DType::Q8], count[DType::Q4], count[DType::BF16], worst[DType::Q8],
        worst[DType::Q4], worst_rms);
    EXPECT_GT(count[target], 0u) << type;
    EXPECT_GT(count[DType::BF16], 0u) << type;
  }
}

TEST_F(Containers, TokenizerFilesComeFromTheContainer) {
  ModelPaths p;
  p.model = file("bf16");
  const TokenizerBytes t = read_tokenizer_files(p);
  const fs::path dir = testing::tiny_model() / "tokenizer";
  ASSERT_TRUE(t.vocab_json && t.merges_txt && t.tokenizer_config_json);
  EXPECT_EQ(*t.vocab_json, read_text_file(dir / "vocab.json"));
  EXPECT_EQ(*t.merges_txt, read_text_file(dir / "merges.txt"));
  EXPECT_EQ(*t.tokenizer_config_json, read_text_file(dir / "tokenizer_config.json"));
  EXPECT_FALSE(t.tokenizer_json);
  EXPECT_EQ(tokenizer_source(p).kind, TokenizerSource::Kind::Container);
}

TEST_F(Containers, ConversionRecordNamesSourcesAndProgram) {
  const container::ContainerFile f(file("bf16"));
  const auto& r = f.metadata()["conversion"];
  std::set<std::string> files;
  for (const auto& s : r["sources"]) {
    files.insert(s["file"].get<std::string>());
    EXPECT_EQ(s["xxh3"].get<std::string>().size(), 16u);
  }
  EXPECT_TRUE(files.count("transformer/diffusion_pytorch_model.safetensors"));
  EXPECT_TRUE(files.count("text_encoder/model-00002-of-00002.safetensors"));
  EXPECT_TRUE(files.count("vae/config.json"));
  EXPECT_TRUE(files.count("tokenizer/vocab.json"));
  for (const auto& s : r["sources"])
    if (s["file"] == "vae/diffusion_pytorch_model.safetensors") {
      EXPECT_EQ(s["bytes"], 2933950);
    }
  EXPECT_EQ(r["target_type"], "bf16");
  EXPECT_FALSE(r["version"].get<std::string>().empty());
  EXPECT_FALSE(r["policy"].get<std::string>().empty());
}

TEST_F(Containers, PrefetchThenAcquireAndRepeatedAcquireShareTheUnit) {
  ContainerStore store(file("bf16"));
  store.prefetch("transformer.double.1");
  UnitRef a = store.acquire("transformer.double.1");
  UnitRef b = store.acquire("transformer.double.1");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->get("attn.to_q.weight").shape, (Shape{256, 256}));
  EXPECT_ERROR_HAS(store.acquire("transformer.double.9"), "no weight unit transformer.double.9");
}

// A container is a valid source: converting the BF16 container to F16 gives the same unit
// bytes as converting the safetensors to F16, and carries over the tokenizer and drop record.
TEST_F(Containers, ReconvertFromAContainer) {
  ConvertOptions o;
  o.source.model = file("bf16");
  o.output = testing::temp_dir("reconvert") / "again-f16.klein";
  o.target = DType::F16;
  convert::convert_model(o);
  const container::ContainerFile a(o.output), b(file("f16"));
  ASSERT_EQ(a.index().units.size(), b.index().units.size());
  for (size_t i = 0; i < a.index().units.size(); ++i) {
    EXPECT_EQ(a.index().units[i].name, b.index().units[i].name);
    EXPECT_EQ(a.index().units[i].xxh3, b.index().units[i].xxh3) << a.index().units[i].name;
  }
  EXPECT_EQ(a.metadata()["tokenizer"], b.metadata()["tokenizer"]);
  EXPECT_EQ(a.metadata()["conversion"]["dropped"].size(),
            b.metadata()["conversion"]["dropped"].size());
  EXPECT_EQ(a.metadata()["conversion"]["sources"][0]["file"], "tiny-bf16.klein");
}

// Single files instead of the directory: the same units, byte for byte.
TEST_F(Containers, SingleFileSourcesGiveTheSameUnits) {
  const fs::path m = testing::tiny_model();
  ConvertOptions o;
  o.source.diffusion_model = m / "transformer" / "diffusion_pytorch_model.safetensors";
  o.source.text_encoder = m / "text_encoder" / "model.safetensors.index.json";
  o.source.vae = m / "vae" / "diffusion_pytorch_model.safetensors";
  o.source.tokenizer = m / "tokenizer";
  o.source.variant = "4b";  // single files do not say distilled / base / K/V
  o.output = testing::temp_dir("single") / "single-bf16.klein";
  o.target = DType::BF16;
  convert::convert_model(o);
  const container::ContainerFile a(o.output), b(file("bf16"));
  ASSERT_EQ(a.index().units.size(), b.index().units.size());
  for (size_t i = 0; i < a.index().units.size(); ++i)
    EXPECT_EQ(a.index().units[i].xxh3, b.index().units[i].xxh3) << a.index().units[i].name;
  std::set<std::string> files;
  for (const auto& s : a.metadata()["conversion"]["sources"]) files.insert(s["file"]);
  EXPECT_TRUE(files.count("diffusion_pytorch_model.safetensors"));
  EXPECT_TRUE(files.count("tokenizer/vocab.json"));
}

TEST_F(Containers, TwoMegabyteAlignment) {
  const fs::path p = convert_tiny(testing::temp_dir("align"), "bf16", "", uint64_t(2) << 20);
  const container::ContainerFile f(p);
  EXPECT_EQ(f.header().alignment, uint64_t(2) << 20);
  for (const auto& u : f.index().units) EXPECT_EQ(u.offset % (uint64_t(2) << 20), 0u);
  auto store = open_model(p);
  EXPECT_EQ(store->acquire("vae.decoder")->weights().size(),
            source_->acquire("vae.decoder")->weights().size());
  fs::remove(p);
}

// --- integrity ---------------------------------------------------------------------------

TEST_F(Containers, VerifyPassesOnEveryConvertedFile) {
  for (const auto& type : all_types()) {
    const auto v = convert::verify_model_container(file(type));
    EXPECT_TRUE(v.ok()) << type;
    EXPECT_GT(v.data.units_checked, 30u);
  }
}

TEST_F(Containers, FlippedBitInTheHeader) {
  const fs::path p = copy_of("bf16", "bad-header");
  flip_bit(p, 72, 3);  // index_offset
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "corrupt header: header checksum mismatch");
  EXPECT_ERROR_HAS(open_model(p), "corrupt header");
}

TEST_F(Containers, FlippedBitInTheIndex) {
  const fs::path p = copy_of("bf16", "bad-index");
  const Parsed r = parse(p);
  flip_bit(p, r.header.index_offset + r.header.index_size / 2, 5);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "corrupt index: checksum mismatch");
}

TEST_F(Containers, FlippedBitInTheMetadata) {
  const fs::path p = copy_of("bf16", "bad-metadata");
  const Parsed r = parse(p);
  flip_bit(p, r.header.metadata_offset + r.header.metadata_size / 3, 1);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "corrupt metadata: checksum mismatch");
}

// A tensor inside unit transformer.double.1 of the container at p (its third).
container::TensorEntry middle_tensor_of_double_1(const fs::path& p) {
  const Parsed r = parse(p);
  for (const auto& u : r.index.units)
    if (u.name == "transformer.double.1") return r.index.tensors[u.first_tensor + 2];
  ADD_FAILURE() << "no unit transformer.double.1 in " << p;
  return {};
}

// Paged, a unit is checked again every time it comes back from the file: bytes rewritten
// under a running store after the first use are refused at the next page-in.
TEST_F(Containers, PagedUnitIsCheckedAgainAtEveryPageIn) {
  const fs::path p = copy_of("bf16", "rewritten-unit");
  const container::TensorEntry t = middle_tensor_of_double_1(p);
  ContainerStore store(p, {.residency = Residency::Paged});
  EXPECT_NO_THROW(store.acquire("transformer.double.1"));  // checked, used, dropped
  flip_bit(p, t.offset + t.size / 2, 6);
  EXPECT_ERROR_HAS(store.acquire("transformer.double.1"),
                   "unit transformer.double.1 is corrupt: checksum mismatch");
}

// The same when the next page-in is read ahead: the check runs on the store's checking thread
// while the unit before would compute, and its error reaches the acquire. Once the bytes are
// restored, the next page-in passes.
// Waits until the store's checking thread has run n checks (an acquire right after a prefetch
// could otherwise take the queued check itself).
void wait_for_background_checks(const ContainerStore& store, int64_t n) {
  for (int i = 0; i < 10000 && store.checks().background < n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(store.checks().background, n);
}

TEST_F(Containers, ReadAheadPageInIsCheckedOnTheCheckingThread) {
  const fs::path p = copy_of("bf16", "rewritten-read-ahead");
  const container::TensorEntry t = middle_tensor_of_double_1(p);
  ContainerStore store(p, {.residency = Residency::Paged});
  store.prefetch("transformer.double.1");
  wait_for_background_checks(store, 1);
  EXPECT_NO_THROW(store.acquire("transformer.double.1"));  // the first check, read ahead
  EXPECT_EQ(store.checks().background, 1);
  flip_bit(p, t.offset + t.size / 2, 6);
  store.prefetch("transformer.double.1");
  wait_for_background_checks(store, 2);
  EXPECT_ERROR_HAS(store.acquire("transformer.double.1"),
                   "unit transformer.double.1 is corrupt: checksum mismatch");
  EXPECT_EQ(store.checks().on_acquire, 0);
  // Thrown once; the next acquire checks again by itself.
  EXPECT_ERROR_HAS(store.acquire("transformer.double.1"), "transformer.double.1 is corrupt");
  EXPECT_EQ(store.checks().on_acquire, 1);
  EXPECT_GT(store.residency_stats().acquire_seconds, 0.0);  // that check, on the caller's time
  flip_bit(p, t.offset + t.size / 2, 6);
  store.prefetch("transformer.double.1");
  wait_for_background_checks(store, 3);
  UnitRef u = store.acquire("transformer.double.1");
  EXPECT_EQ(u->get("attn.to_q.weight").shape, (Shape{256, 256}));
  // Held: a prefetch queues nothing; released and read ahead again: checked again.
  store.prefetch("transformer.double.1");
  EXPECT_EQ(store.checks().background, 3);
  u.reset();
  store.prefetch("transformer.double.1");
  EXPECT_NO_THROW(store.acquire("transformer.double.1"));
  EXPECT_EQ(store.checks().background + store.checks().on_acquire, 5);
}

// Resident, a unit is checked once and stays in.
TEST_F(Containers, ResidentUnitIsCheckedOnce) {
  ContainerStore store(file("bf16"), {.residency = Residency::Resident});
  for (int i = 0; i < 3; ++i) {
    store.prefetch("transformer.double.0");
    EXPECT_NO_THROW(store.acquire("transformer.double.0"));
  }
  EXPECT_EQ(store.checks().background + store.checks().on_acquire, 1);
}

TEST_F(Containers, FlippedBitInAUnitIsRefusedWhenPagedInAndNamedByVerify) {
  const fs::path p = copy_of("bf16", "bad-unit");
  const container::TensorEntry t = middle_tensor_of_double_1(p);
  flip_bit(p, t.offset + t.size / 2, 6);

  // Opening reads no tensor data; the unit is refused when acquired, the others still work.
  auto store = open_model(p);
  EXPECT_ERROR_HAS(store->acquire("transformer.double.1"),
                   "unit transformer.double.1 is corrupt: checksum mismatch");
  EXPECT_ERROR_HAS(store->acquire("transformer.double.1"), "transformer.double.1 is corrupt");
  EXPECT_NO_THROW(store->acquire("transformer.double.0"));
  // The same through a prefetch's background check.
  ContainerStore again(p);
  again.prefetch("transformer.double.1");
  EXPECT_ERROR_HAS(again.acquire("transformer.double.1"), "transformer.double.1 is corrupt");

  const auto v = convert::verify_model_container(p);
  ASSERT_EQ(v.data.problems.size(), 2u);
  EXPECT_EQ(v.data.problems[0].region, "unit");
  EXPECT_EQ(v.data.problems[0].name, "transformer.double.1");
  EXPECT_EQ(v.data.problems[1].region, "tensor");
  EXPECT_EQ(v.data.problems[1].name, t.name);
}

TEST_F(Containers, NonZeroPaddingIsReported) {
  const fs::path p = copy_of("bf16", "bad-padding");
  const Parsed r = parse(p);
  const auto& u = r.index.units[0];
  flip_bit(p, u.offset + u.size + 10, 0);  // after the unit, before the next one
  const auto v = convert::verify_model_container(p);
  ASSERT_EQ(v.data.problems.size(), 1u);
  EXPECT_EQ(v.data.problems[0].region, "padding");
}

TEST_F(Containers, Truncated) {
  const fs::path p = copy_of("bf16", "truncated");
  fs::resize_file(p, fs::file_size(p) - 100);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "truncated: the header says");
  fs::resize_file(p, 60);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "truncated");
}

TEST_F(Containers, WrongMagic) {
  const fs::path p = copy_of("bf16", "magic");
  flip_bit(p, 1, 2);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "not a klein container");
  // Without the magic the file is not taken for a container at all.
  EXPECT_FALSE(container::is_container(p));
  EXPECT_ERROR_HAS(open_model(p), "is not a model directory");
}

TEST_F(Containers, NewerFormatVersion) {
  const fs::path p = copy_of("bf16", "newer");
  Parsed r = parse(p);
  r.header.major = container::kMajorVersion + 1;
  rewrite(p, r);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "container format version 2.0 is newer");
  // A newer minor version of the same major version is read.
  r = parse(copy_of("bf16", "newer-minor"));
  r.header.major = container::kMajorVersion;
  r.header.minor = container::kMinorVersion + 3;
  rewrite(*dir_ / "newer-minor.klein", r);
  EXPECT_NO_THROW(container::ContainerFile{*dir_ / "newer-minor.klein"});
}

TEST_F(Containers, UnknownRequiredFlag) {
  const fs::path p = copy_of("bf16", "flags");
  Parsed r = parse(p);
  r.header.flags = 1u << 4;
  rewrite(p, r);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "features this program does not know");
  r.header.flags = uint64_t(1) << 40;  // optional: ignored
  rewrite(p, r);
  EXPECT_NO_THROW(container::ContainerFile{p});
}

TEST_F(Containers, IndexPointingOutsideTheFile) {
  const fs::path p = copy_of("bf16", "outside");
  Parsed r = parse(p);
  r.index.tensors[3].offset = r.header.file_size + 4096;
  rewrite(p, r);
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "spans bytes");
  EXPECT_ERROR_HAS(container::ContainerFile{p}, "outside its unit");

  r = parse(copy_of("bf16", "outside2"));
  r.index.units[1].size = r.header.file_size;
  rewrite(*dir_ / "outside2.klein", r);
  EXPECT_ERROR_HAS(container::ContainerFile{*dir_ / "outside2.klein"}, "outside the data section");
}

TEST_F(Containers, WrongTensorSizeOrShapeIsAModelError) {
  const fs::path p = copy_of("bf16", "shape");
  Parsed r = parse(p);
  for (auto& t : r.index.tensors)
    if (t.name == "transformer.proj_out.weight") t.shape = {t.shape[1], t.shape[0]};
  rewrite(p, r);
  EXPECT_NO_THROW(container::ContainerFile{p});  // consistent bytes...
  EXPECT_ERROR_HAS(ContainerStore{p}, "transformer.proj_out.weight has shape");  // ...wrong model
  const auto v = convert::verify_model_container(p);
  ASSERT_EQ(v.model.size(), 1u);
}

// Random damage to the header and index must give klein::Error or a valid parse, never a
// crash or an unbounded allocation (the fuzz target does the same at scale).
TEST_F(Containers, RandomDamageToHeaderAndIndexIsAlwaysAnError) {
  const Parsed good = parse(file("bf16"));
  const std::string header = good.bytes.substr(0, container::kHeaderSize);
  const std::string index = good.bytes.substr(good.header.index_offset, good.header.index_size);
  std::mt19937 rng(7);
  int parsed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string h = header, x = index;
    const int flips = 1 + int(rng() % 8);
    for (int k = 0; k < flips; ++k) {
      if (rng() % 2)
        h[rng() % (container::kHeaderSize - 8)] = char(rng());
      else
        x[rng() % x.size()] = char(rng());
    }
    // Re-seal the header checksum so that the parser sees the damage, not only the checksum.
    const uint64_t sum = container::xxh3(h.data(), container::kHeaderSize - 8);
    std::memcpy(h.data() + container::kHeaderSize - 8, &sum, 8);
    try {
      const auto hd = container::decode_header(std::as_bytes(std::span(h.data(), h.size())),
                                               good.bytes.size(), "fuzz");
      (void)container::decode_index(hd, std::as_bytes(std::span(x.data(), x.size())), "fuzz");
      ++parsed;
    } catch (const Error&) {
    }
  }
  EXPECT_LT(parsed, 20000);
}

// --- convert errors leave nothing ---------------------------------------------------------

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

TEST(Convert, CancelledConversionLeavesNoFile) {
  const fs::path dir = testing::temp_dir("cancel");
  std::atomic<bool> cancel{false};
  ConvertOptions o;
  o.source.model = testing::tiny_model();
  o.output = dir / "out.klein";
  o.target = DType::BF16;
  o.cancel = &cancel;
  fs::path temp;
  o.on_temp_file = [&](const fs::path& p) { temp = p; };
  o.progress = [&](const convert::ConvertProgress& p) {
    EXPECT_TRUE(fs::exists(temp));
    if (p.unit == 3) cancel = true;
  };
  EXPECT_ERROR_HAS(convert::convert_model(o), "interrupted");
  EXPECT_FALSE(temp.empty());
  EXPECT_TRUE(files_in(dir).empty());
}

TEST(Convert, BadPolicyAndBadSourceLeaveNoFile) {
  const fs::path dir = testing::temp_dir("bad");
  ConvertOptions o;
  o.source.model = testing::tiny_model();
  o.output = dir / "out.klein";
  o.target = DType::BF16;
  o.policy_text = "vae.* q5\n";
  o.policy_origin = "p.txt";
  EXPECT_ERROR_HAS(convert::convert_model(o), "p.txt:1: unknown storage type \"q5\"");
  o.policy_text = "";
  o.source.model = dir / "nothing";
  EXPECT_ERROR_HAS(convert::convert_model(o), "does not exist");
  EXPECT_TRUE(files_in(dir).empty());
}

TEST(Convert, CliConvertVerifyInspect) {
  const fs::path dir = testing::temp_dir("cli");
  const fs::path out = dir / "tiny.klein";
  std::string log;
  ASSERT_TRUE(testing::convert_tiny(out, "-t f16", &log));
  EXPECT_NE(log.find("transformer.double.1"), std::string::npos) << log;
  EXPECT_NE(log.find("MB/s"), std::string::npos) << log;
  EXPECT_EQ(testing::run_klein("verify -q " + out.string(), &log), 0) << log;
  EXPECT_NE(log.find(": ok"), std::string::npos) << log;
  // Into a pipe the progress is whole lines (a line per tenth of the units and the last), not
  // a terminal's line rewritten with carriage returns.
  EXPECT_EQ(testing::run_klein("verify " + out.string(), &log), 0) << log;
  EXPECT_EQ(log.find('\r'), std::string::npos) << log;
  const size_t units = container::ContainerFile(out).index().units.size();
  const std::string last = "checking unit " + std::to_string(units) + "/" + std::to_string(units);
  EXPECT_NE(log.find(last + "\n"), std::string::npos) << log;
  EXPECT_LE(std::count(log.begin(), log.end(), '\n'), 13) << log;

  const Parsed r = parse(out);
  const auto& t = r.index.tensors[r.index.units[5].first_tensor];
  EXPECT_EQ(testing::run_klein("inspect " + out.string(), &log), 0) << log;
  EXPECT_NE(log.find("transformer.double.1"), std::string::npos) << log;
  EXPECT_NE(log.find("bits per weight"), std::string::npos) << log;
  EXPECT_EQ(testing::run_klein("inspect --json -m " + out.string(), &log), 0) << log;
  const auto j = nlohmann::json::parse(log);
  EXPECT_EQ(j["by_type"]["f16"]["bits_per_weight"], 16.0);
  EXPECT_EQ(j["conversion"]["target_type"], "f16");

  flip_bit(out, t.offset + t.size / 2);
  EXPECT_EQ(testing::run_klein("verify -q " + out.string(), &log), 1) << log;
  EXPECT_NE(log.find("BAD unit"), std::string::npos) << log;

  // A failing conversion: no output, no temporary file.
  EXPECT_NE(testing::run_klein("convert -m " + testing::tiny_model().string() + " -o " +
                                   (dir / "x.klein").string() + " -t q5",
                               &log),
            0);
  EXPECT_NE(log.find("unknown storage type"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "x.klein"));
  EXPECT_EQ(files_in(dir).size(), 1u);
}

// --- the policy ----------------------------------------------------------------------------

TEST(Policy, DefaultsKeepSensitiveTensorsAtFloat) {
  const convert::PrecisionPolicy p;
  auto type = [&](const std::string& name, Shape shape, DType target) {
    return p.choose(name, shape, target).type;
  };
  EXPECT_EQ(type("transformer.transformer_blocks.0.attn.to_q.weight", {3072, 3072}, DType::Q4),
            DType::Q4);
  EXPECT_EQ(type("transformer.transformer_blocks.0.attn.norm_q.weight", {128}, DType::Q4),
            DType::BF16);
  EXPECT_EQ(type("transformer.x_embedder.weight", {3072, 128}, DType::Q4), DType::BF16);
  EXPECT_EQ(
      type("transformer.double_stream_modulation_img.linear.weight", {18432, 3072}, DType::Q8),
      DType::BF16);
  EXPECT_EQ(type("transformer.norm_out.linear.weight", {6144, 3072}, DType::Q4), DType::BF16);
  EXPECT_EQ(type("text_encoder.model.embed_tokens.weight", {151936, 2560}, DType::Q4), DType::Q8);
  EXPECT_EQ(type("text_encoder.model.embed_tokens.weight", {151936, 2560}, DType::BF16),
            DType::BF16);
  EXPECT_EQ(type("vae.decoder.conv_in.weight", {512, 32, 3, 3}, DType::Q4), DType::BF16);
  // A float target satisfies every floor: a bf16 container is entirely bf16.
  EXPECT_EQ(type("vae.decoder.conv_in.weight", {512, 32, 3, 3}, DType::F16), DType::F16);
  EXPECT_EQ(type("transformer.x_embedder.weight", {3072, 128}, DType::F32), DType::F32);
}

// -t keep: every source type to the storage type of its precision class, never fewer bits.
TEST(Policy, KeepGivesEachSourceTypeItsClass) {
  using convert::keep_precision;
  using convert::keep_precision_ggml;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::Q8, DType::Q4})
    EXPECT_EQ(keep_precision(t, "w"), t) << dtype_name(t);
  EXPECT_EQ(keep_precision(DType::F8_E4M3, "w"), DType::Q8);
  EXPECT_EQ(keep_precision(DType::F8_E5M2, "w"), DType::Q8);
  // GGML type ids (gguf-py constants): Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q2_K 10, Q3_K 11,
  // Q4_K 12, Q5_K 13, Q6_K 14.
  for (uint32_t q4 : {2u, 3u, 10u, 11u, 12u}) EXPECT_EQ(keep_precision_ggml(q4, "w"), DType::Q4) << q4;
  for (uint32_t q8 : {6u, 7u, 13u, 14u}) EXPECT_EQ(keep_precision_ggml(q8, "w"), DType::Q8) << q8;
  EXPECT_THROW(keep_precision_ggml(4, "w"), Error);  // 4 is not a GGML type (removed Q4_2)
  EXPECT_THROW(keep_precision(DType::I32, "w"), Error);
}

TEST(Policy, UserRulesComeFirstAndFirstMatchWins) {
  const auto p = convert::PrecisionPolicy::with_user_rules(
      "# mine\n"
      "transformer.single_transformer_blocks.*.attn.to_out.weight  q8   # late layers\n"
      "re:transformer\\.transformer_blocks\\.[0-9]+\\.ff\\..*  >=q8\n"
      "transformer.*  f16\n"
      "vae.*          q4\n",
      "my.policy");
  EXPECT_EQ(p.choose("transformer.single_transformer_blocks.3.attn.to_out.weight", {3072, 12288},
                     DType::Q4)
                .type,
            DType::Q8);
  EXPECT_EQ(
      p.choose("transformer.transformer_blocks.3.ff.linear_in.weight", {18432, 3072}, DType::Q4)
          .type,
      DType::Q8);
  EXPECT_EQ(
      p.choose("transformer.transformer_blocks.3.ff.linear_in.weight", {18432, 3072}, DType::BF16)
          .type,
      DType::BF16);
  // The user's "transformer.* f16" wins over the built-in @1d floor.
  const auto c = p.choose("transformer.transformer_blocks.3.attn.norm_q.weight", {128}, DType::Q4);
  EXPECT_EQ(c.type, DType::F16);
  EXPECT_EQ(c.rule->origin, "my.policy:4");
  EXPECT_EQ(p.choose("vae.encoder.conv_in.weight", {32, 3, 3, 3}, DType::BF16).type, DType::Q4);
  EXPECT_EQ(p.choose("text_encoder.model.layers.0.mlp.up_proj.weight", {192, 64}, DType::Q4).rule,
            nullptr);
}

TEST(Policy, MalformedLinesNameTheLine) {
  EXPECT_ERROR_HAS(convert::parse_policy("a.* q8\nb.*\n", "p"), "p:2: expected");
  EXPECT_ERROR_HAS(convert::parse_policy("re:([ q8\n", "p"), "p:1: invalid regular expression");
  EXPECT_ERROR_HAS(convert::parse_policy("@2d q8\n", "p"), "p:1: unknown selector");
  EXPECT_ERROR_HAS(convert::parse_policy("x q8 extra\n", "p"), "p:1: unexpected \"extra\"");
  EXPECT_ERROR_HAS(convert::parse_policy("x >=q3\n", "p"), "p:1: unknown storage type");
}

// Regular expressions are bounded: deep nesting compiles or fails with the rule named (no
// stack overflow), catastrophic backtracking stops with the rule named (no minutes-long
// match), and a policy that is not UTF-8 is refused when it is read (not after converting).
TEST(Policy, HostileRegexesAndBytesFailWithTheirLine) {
  const std::string deep = "re:" + std::string(20000, '(') + "a" + std::string(20000, ')') + " q8\n";
  try {  // compiled without recursion, or refused with the rule named: never a crash
    const auto nested = convert::PrecisionPolicy::with_user_rules(deep, "p");
    EXPECT_EQ(nested.choose("a", {4, 4}, DType::BF16).type, DType::Q8);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("p:1:"), std::string::npos) << e.what();
  }
  const auto slow = convert::PrecisionPolicy::with_user_rules("re:(a|a?)+ q8\n", "p");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ERROR_HAS(slow.choose(std::string(40, 'a') + "!", {4, 4}, DType::Q4), "p:1:");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  EXPECT_ERROR_HAS(convert::parse_policy("vae.* q8\ntext_\xff\xfe.* q4\n", "p"), "p:2: not valid UTF-8");
  // Ordinary patterns still match whole names only.
  const auto p = convert::PrecisionPolicy::with_user_rules("re:vae\\..*conv.* q8\n", "p");
  EXPECT_EQ(p.choose("vae.decoder.conv_in.weight", {8, 8}, DType::BF16).type, DType::Q8);
  EXPECT_EQ(p.choose("xvae.decoder.conv_in.weight", {8, 8}, DType::BF16).rule, nullptr);
}

}  // namespace
}  // namespace klein
