#pragma once
// Helpers for the quant tests: random matrices of several shapes of distribution, and packed
// weight matrices that own their bytes.
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "quant/matmul.h"

namespace klein::quant::testing {

enum class Dist {
  Gauss,
  Laplace,
  StudentT3,     // heavy tails
  ColumnScaled,  // Gauss times a per-column log-normal factor, like trained weights
  Outliers,      // Gauss with a few columns 100x larger, like transformer activations
  Zeros,
};

inline std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed, Dist dist,
                                        float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  std::student_t_distribution<float> student(3.0f);
  std::vector<float> col_scale(size_t(cols), 1.0f);
  if (dist == Dist::ColumnScaled)
    for (auto& c : col_scale) c = std::exp(0.5f * gauss(rng));
  if (dist == Dist::Outliers)
    for (int64_t c = 3; c < cols; c += 61) col_scale[size_t(c)] = 100.0f;
  std::vector<float> m(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = 0;
      switch (dist) {
        case Dist::Laplace: {
          const float u = uniform(rng);
          v = -std::copysign(std::log(1.0f - 2.0f * std::fabs(u)), u);
          break;
        }
        case Dist::StudentT3: v = student(rng); break;
        case Dist::Zeros: v = 0; break;
        default: v = gauss(rng); break;
      }
      m[size_t(r * cols + c)] = scale * v * col_scale[size_t(c)];
    }
  }
  return m;
}

// A weight matrix packed from floats, owning its bytes.
struct Packed {
  std::vector<uint8_t> bytes;
  Matrix matrix;

  Packed(const float* w, int64_t rows, int64_t cols, DType type, Layout layout) {
    bytes.resize(storage_bytes(type, layout, rows, cols));
    pack(w, rows, cols, type, layout, bytes.data());
    matrix = Matrix{type, layout, rows, cols, bytes.data(), bytes.size()};
  }
  Packed(const Packed&) = delete;
};

inline std::vector<std::pair<DType, Layout>> all_formats() {
  return {{DType::F32, Layout::RowMajor},  {DType::BF16, Layout::RowMajor},
          {DType::F16, Layout::RowMajor},  {DType::Q8, Layout::RowMajor},
          {DType::Q8, Layout::Interleaved16}, {DType::Q4, Layout::RowMajor},
          {DType::Q4, Layout::Interleaved16}};
}

}  // namespace klein::quant::testing
