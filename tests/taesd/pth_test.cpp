// The .pth reader (formats/pth.h, formats/torch_pickle.h) on torch.save's own files, what it
// refuses (a global that is not a tensor's, an opcode a state dict does not use, a tensor
// that is not contiguous, a file cut short), and the tiny autoencoder's weights read from a
// .pth and from a .safetensors copy (ComfyUI's prefixed names) being the same.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/pth.h"
#include "formats/safetensors_writer.h"
#include "formats/torch_pickle.h"
#include "models/taesd/taesd.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing::taef2_dir;

std::vector<float> values_of(const PthFile& f, const std::string& name) {
  const PthEntry* e = f.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (e == nullptr) return {};
  const TensorView v = f.view(*e);
  std::vector<float> out(size_t(v.numel()));
  to_f32(v.dtype, v.data, out.data(), out.size());
  return out;
}

// torch.save({"whole": x, "rows": x[1:3], "half": arange(4, float16) / 4}), x = arange(12) as
// [4, 3]: two views of one storage, one at an offset, and a float16 tensor.
TEST(Pth, ReadsViewsOfSharedStorages) {
  const PthFile f(taef2_dir() / "bad" / "views.pth");
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].name, "whole");  // the state dict's order
  EXPECT_EQ(f.find("whole")->shape, (Shape{4, 3}));
  EXPECT_EQ(f.find("rows")->shape, (Shape{2, 3}));
  EXPECT_EQ(f.find("half")->dtype, DType::F16);
  EXPECT_EQ(values_of(f, "whole"), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(values_of(f, "rows"), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(values_of(f, "half"), (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
}

TEST(Pth, ReadsThePublishedTaef2Files) {
  const PthFile decoder(taef2_dir() / "taef2_decoder.pth");
  EXPECT_EQ(decoder.entries().size(), 79u);
  EXPECT_EQ(decoder.find("1.weight")->shape, (Shape{64, 32, 3, 3}));
  EXPECT_EQ(decoder.find("3.pool.0.weight")->shape, (Shape{256, 64, 1, 1}));
  EXPECT_EQ(decoder.find("19.bias")->dtype, DType::F16);
  const PthFile encoder(taef2_dir() / "taef2_encoder.pth");
  EXPECT_EQ(encoder.find("14.weight")->shape, (Shape{32, 64, 3, 3}));
}

TEST(Pth, RefusesAGlobalThatIsNotATensors) {
  const fs::path file = taef2_dir() / "bad" / "os_system.pth";
  const std::string e = testing::error_of([&] { PthFile f(file); });
  EXPECT_THAT(e, HasSubstr(file.string()));
  EXPECT_THAT(e, HasSubstr("global os.system"));
  EXPECT_THAT(e, HasSubstr("nothing in the file is executed"));
}

TEST(Pth, RefusesAnOpcodeAStateDictDoesNotUse) {
  const fs::path file = taef2_dir() / "bad" / "float_value.pth";  // {"w": tensor, "lr": 0.5}
  const std::string e = testing::error_of([&] { PthFile f(file); });
  EXPECT_THAT(e, HasSubstr(file.string()));
  EXPECT_THAT(e, HasSubstr("BINFLOAT (0x47)"));
}

TEST(Pth, RefusesATensorThatIsNotRowMajor) {
  const fs::path file = taef2_dir() / "bad" / "transposed.pth";
  const std::string e = testing::error_of([&] { PthFile f(file); });
  EXPECT_THAT(e, HasSubstr(file.string()));
  EXPECT_THAT(e, HasSubstr("not contiguous"));
}

TEST(Pth, RefusesAStorageShorterThanItsTensors) {
  const fs::path file = taef2_dir() / "bad" / "short_storage.pth";  // 44 bytes for 12 floats
  const std::string e = testing::error_of([&] { PthFile f(file); });
  EXPECT_THAT(e, HasSubstr(file.string()));
  EXPECT_THAT(e, HasSubstr("holds 44 bytes, but 12 F32 elements need 48"));
}

// Cut anywhere, the published file is an error naming it: the end records go first, then the
// central directory, the entries' data, the pickle.
TEST(Pth, RefusesATruncatedFile) {
  const fs::path source = taef2_dir() / "taef2_decoder.pth";
  std::ifstream in(source, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path cut = testing::temp_dir("taesd-truncated") / "taef2_decoder.pth";
  for (size_t keep : {size_t(0), size_t(10), size_t(200), size_t(11000), bytes.size() / 2,
                      bytes.size() - 200, bytes.size() - 1}) {
    SCOPED_TRACE(keep);
    std::ofstream(cut, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), std::streamsize(keep));
    const std::string e = testing::error_of([&] { PthFile f(cut); });
    EXPECT_THAT(e, HasSubstr(cut.string()));
  }
}

// The interpreter alone: a pickle cut inside an opcode or before STOP, and what is not a state
// dict of tensors.
TEST(TorchPickle, RefusesTruncatedAndForeignPickles) {
  auto read = [](const std::string& bytes) {
    return testing::error_of([&] {
      read_torch_state_dict_pickle(
          std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), "x.pth");
    });
  };
  EXPECT_EQ(read_torch_state_dict_pickle(
                std::span(reinterpret_cast<const std::byte*>("\x80\x02}q\x00."), 6), "x.pth")
                .size(),
            0u);
  EXPECT_THAT(read(std::string("\x80\x02}q", 4)), HasSubstr("ends inside BINPUT"));
  EXPECT_THAT(read(std::string("\x80\x02}", 3)), HasSubstr("without a STOP"));
  EXPECT_THAT(read(std::string("\x80\x04}.", 4)), HasSubstr("protocol 4"));
  EXPECT_THAT(read(std::string("\x80\x02]q\x00.", 6)), HasSubstr("EMPTY_LIST"));
  EXPECT_THAT(read(std::string("\x80\x02K\x01.", 5)), HasSubstr("x.pth: data.pkl holds an int"));
  // A dict holding an int where a tensor belongs.
  EXPECT_THAT(read(std::string("\x80\x02}X\x01\x00\x00\x00"
                               "aK\x01s.",
                               13)),
              HasSubstr("entry a is an int, expected a tensor"));
  // A storage class called through REDUCE.
  EXPECT_THAT(read(std::string("\x80\x02"
                               "ctorch\nFloatStorage\n)R.",
                               24)),
              HasSubstr("only accepted inside a storage reference"));
}

// TAEF2 on FLUX.1 latents (Z-Image), TAEF1 on FLUX.2's, a decoder given as the encoder.
TEST(TinyAutoencoderFile, RefusesTheWrongLatentWidthOrHalf) {
  const fs::path taef2 = taef2_dir() / "taef2_decoder.pth";
  std::string e = testing::error_of([&] { taesd::TinyDecoder d(taef2, 16, "Z-Image's latents"); });
  EXPECT_THAT(e, HasSubstr(taef2.string()));
  EXPECT_THAT(e, HasSubstr("32 latent channels: TAEF2"));
  EXPECT_THAT(e, HasSubstr("Z-Image's latents need one of 16 latent channels: TAEF1"));
  const fs::path taef1 = taef2_dir() / "taef1_random_encoder.pth";
  e = testing::error_of([&] { taesd::TinyEncoder d(taef1, 32, "FLUX.2's latents"); });
  EXPECT_THAT(e, HasSubstr(taef1.string()));
  EXPECT_THAT(e, HasSubstr("16 latent channels: TAEF1"));
  const fs::path encoder = taef2_dir() / "taef2_encoder.pth";
  e = testing::error_of([&] { taesd::TinyDecoder d(encoder); });
  EXPECT_THAT(e, HasSubstr(encoder.string()));
  EXPECT_THAT(e, HasSubstr("it looks like the encoder"));
}

// Both published halves copied byte for byte into one .safetensors under ComfyUI's prefixes
// (taesd_decoder.*, taesd_encoder.*): the same tensors, the same decoded image.
TEST(TinyAutoencoderFile, PthAndSafetensorsGiveTheSameWeights) {
  const fs::path copy = testing::temp_dir("taesd-safetensors") / "taef2.safetensors";
  std::vector<SafetensorsDecl> decls;
  std::vector<std::pair<const PthFile*, const PthEntry*>> sources;
  const PthFile dec(taef2_dir() / "taef2_decoder.pth"), enc(taef2_dir() / "taef2_encoder.pth");
  for (const auto& [file, prefix] : {std::pair{&dec, "taesd_decoder."}, {&enc, "taesd_encoder."}})
    for (const PthEntry& e : file->entries()) {
      decls.push_back({prefix + e.name, e.dtype, e.shape});
      sources.emplace_back(file, &e);
    }
  SafetensorsWriter w(copy, decls);
  for (const auto& [file, e] : sources) {
    const TensorView v = file->view(*e);
    w.write(v.data, v.nbytes);
  }
  w.finish();
  for (const taesd::Half half : {taesd::Half::Decoder, taesd::Half::Encoder}) {
    const taesd::TinyWeights a = taesd::read_tiny_weights(
        taef2_dir() / (half == taesd::Half::Decoder ? "taef2_decoder.pth" : "taef2_encoder.pth"),
        half);
    const taesd::TinyWeights b = taesd::read_tiny_weights(copy, half);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [name, t] : a.tensors) {
      auto it = b.tensors.find(name);
      ASSERT_NE(it, b.tensors.end()) << name;
      EXPECT_EQ(t.first, it->second.first) << name;
      EXPECT_EQ(0, std::memcmp(t.second.data(), it->second.second.data(),
                               t.second.size() * sizeof(float)))
          << name;
    }
  }
  Compute cx(2);
  const Tensor z = testing::random_tensor({32, 2, 2}, 5);
  const Tensor x = taesd::TinyDecoder(taef2_dir() / "taef2_decoder.pth").decode(z, cx);
  const Tensor y = taesd::TinyDecoder(copy).decode(z, cx);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), size_t(x.numel()) * sizeof(float)));
}

}  // namespace
}  // namespace klein
