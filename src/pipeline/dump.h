#pragma once
// --dump: a generation's stages as .npy files, with the names and layouts of the golden vectors
// of the family's test set (testdata <set>/vectors/e2e/<case>/), batch dimension included.
// Does nothing without a directory.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/npy.h"
#include "core/tensor.h"
#include "models/flux2/positions.h"

namespace klein {

class Dumper {
 public:
  explicit Dumper(std::filesystem::path dir) : dir_(std::move(dir)) {
    if (!dir_.empty()) std::filesystem::create_directories(dir_);
  }
  bool on() const { return !dir_.empty(); }
  void f32(const std::string& name, const float* data, const Shape& shape) const {
    if (on()) write_npy(dir_ / (name + ".npy"), DType::F32, shape, data);
  }
  void f32(const std::string& name, const Tensor& t, const Shape& shape) const {
    f32(name, t.data(), shape);
  }
  void ids(const std::string& name, const std::vector<flux2::PositionId>& ids) const {
    if (!on()) return;
    std::vector<int64_t> flat;
    for (const auto& id : ids) flat.insert(flat.end(), id.begin(), id.end());
    write_npy(dir_ / (name + ".npy"), DType::I64, {1, int64_t(ids.size()), 4}, flat.data());
  }
  // The decoded image [3, H, W] in [-1, 1] as image_decoded.npy [1, 3, H, W] and as the
  // pipelines' output_type="np", image.npy [H, W, 3] in [0, 1].
  void image(const Tensor& decoded) const {
    if (!on()) return;
    const int64_t H = decoded.dim(1), W = decoded.dim(2), plane = H * W;
    f32("image_decoded", decoded, {1, decoded.dim(0), H, W});
    std::vector<float> hwc(size_t(plane * 3));
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < plane; ++i) {
        const float u = 0.5f * decoded.data()[c * plane + i] + 0.5f;
        hwc[size_t(i * 3 + c)] = std::min(1.0f, std::max(0.0f, u));
      }
    f32("image", hwc.data(), {H, W, 3});
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace klein
