#pragma once
// Error metrics of a candidate against a reference: the numbers every part of the
// quantization report is made of.
//
// For reference values r and candidate values c, d = c - r, over n values:
//   RMSE    sqrt(Σd² / n)
//   NMSE    Σd² / Σr²                (0 when both sums are 0; +inf when only Σr² is)
//   SNR     10 log10(Σr² / Σd²) dB   (+inf for identical values)
//   cosine  Σrc / sqrt(Σr² Σc²)      (1 when both are all zeros, 0 when only one is)
//   max abs max |d|
// Sums are accumulated in double, so the metrics of billions of values are exact to far
// below the errors they measure.
#include <array>
#include <cstdint>
#include <vector>

namespace klein::report {

class ErrorStats {
 public:
  void add(const float* ref, const float* cand, int64_t n);
  void merge(const ErrorStats& other);

  int64_t count() const { return n_; }
  double sum_sq_error() const { return err2_; }
  double sum_sq_reference() const { return ref2_; }
  double rmse() const;
  double nmse() const;
  double snr_db() const;
  double cosine() const;
  double max_abs_error() const { return max_abs_; }

 private:
  int64_t n_ = 0;
  double err2_ = 0, ref2_ = 0, cand2_ = 0, dot_ = 0, max_abs_ = 0;
};

// The metrics of one comparison, as plain numbers for the writers.
struct ErrorSummary {
  int64_t count = 0;
  double rmse = 0, nmse = 0, snr_db = 0, cosine = 1, max_abs = 0;
};
ErrorSummary summarize(const ErrorStats& s);
ErrorSummary compare(const float* ref, const float* cand, int64_t n);

// NMSE (a ratio) in decibels, 10 log10(nmse): -inf for identical values. The writers plot
// errors in dB because they span many decades (Q8 and Q4 differ by ~25 dB).
double nmse_db(double nmse);

// Element errors relative to the RMS of their reference row, |c - r| / rms(r_row), counted in
// bins of a quarter decade from 1e-6 to 10 (quantization scales each block of a row, so the
// row is the natural yardstick; a histogram in absolute units would mix tensors whose values
// differ by orders of magnitude).
class ErrorHistogram {
 public:
  static constexpr double kMinLog10 = -6, kMaxLog10 = 1, kBinsPerDecade = 4;
  static constexpr int kBins = int((kMaxLog10 - kMinLog10) * kBinsPerDecade);

  // One row of n values.
  void add_row(const float* ref, const float* cand, int64_t n);
  void merge(const ErrorHistogram& other);

  // Lower edge of bin i as a relative error (10^(kMinLog10 + i / kBinsPerDecade)).
  static double bin_lower(int i);
  const std::array<int64_t, kBins>& bins() const { return bins_; }
  int64_t exact() const { return exact_; }  // d == 0
  int64_t below() const { return below_; }  // 0 < relative error < 1e-6
  int64_t above() const { return above_; }  // relative error >= 10, or a zero row with d != 0
  int64_t total() const;

 private:
  std::array<int64_t, kBins> bins_{};
  int64_t exact_ = 0, below_ = 0, above_ = 0;
};

// Images as float planes [channels][height][width] with values in [0, 1].
// PSNR = 10 log10(1 / MSE) dB (+inf for identical images).
double psnr_db(const float* ref, const float* cand, int64_t n);
// SSIM (Wang et al. 2004) with an 11x11 Gaussian window of sigma 1.5, C1 = 0.01², C2 = 0.03²,
// averaged over the window positions inside the image, then over the channels. Images
// smaller than the window use one window covering the whole image.
double ssim(const float* ref, const float* cand, int channels, int height, int width);

}  // namespace klein::report
