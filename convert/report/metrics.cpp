#include "convert/report/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace klein::report {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Weighted moments of two signals under one window: what SSIM compares.
struct Moments {
  double mx = 0, my = 0, xx = 0, yy = 0, xy = 0;
};

double ssim_of(const Moments& m) {
  constexpr double c1 = 0.01 * 0.01, c2 = 0.03 * 0.03;
  const double vx = m.xx - m.mx * m.mx, vy = m.yy - m.my * m.my, cxy = m.xy - m.mx * m.my;
  return ((2 * m.mx * m.my + c1) * (2 * cxy + c2)) /
         ((m.mx * m.mx + m.my * m.my + c1) * (vx + vy + c2));
}

std::vector<double> gaussian_window(int size, double sigma) {
  std::vector<double> w(size_t(size), 0.0);
  double sum = 0;
  for (int i = 0; i < size; ++i) {
    const double t = i - (size - 1) / 2.0;
    w[size_t(i)] = std::exp(-t * t / (2 * sigma * sigma));
    sum += w[size_t(i)];
  }
  for (double& v : w) v /= sum;
  return w;
}

// The five products SSIM needs, per pixel, as planes.
struct Planes {
  std::vector<double> x, y, xx, yy, xy;
};

Planes products(const float* a, const float* b, int64_t n) {
  Planes p;
  for (auto* v : {&p.x, &p.y, &p.xx, &p.yy, &p.xy}) v->resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    p.x[size_t(i)] = x;
    p.y[size_t(i)] = y;
    p.xx[size_t(i)] = x * x;
    p.yy[size_t(i)] = y * y;
    p.xy[size_t(i)] = x * y;
  }
  return p;
}

// Separable filtering over the positions where the window lies inside the image ("valid").
std::vector<double> filter_valid(const std::vector<double>& plane, int height, int width,
                                 const std::vector<double>& w) {
  const int k = int(w.size()), oh = height - k + 1, ow = width - k + 1;
  std::vector<double> rows(size_t(height) * size_t(ow)), out(size_t(oh) * size_t(ow));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < ow; ++x) {
      double s = 0;
      for (int i = 0; i < k; ++i) s += w[size_t(i)] * plane[size_t(y) * width + size_t(x + i)];
      rows[size_t(y) * ow + size_t(x)] = s;
    }
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < ow; ++x) {
      double s = 0;
      for (int i = 0; i < k; ++i) s += w[size_t(i)] * rows[size_t(y + i) * ow + size_t(x)];
      out[size_t(y) * ow + size_t(x)] = s;
    }
  return out;
}

double ssim_channel(const float* a, const float* b, int height, int width) {
  constexpr int kWindow = 11;
  const int64_t n = int64_t(height) * width;
  if (height < kWindow || width < kWindow) {
    Moments m;
    for (int64_t i = 0; i < n; ++i) {
      const double x = a[i], y = b[i];
      m.mx += x, m.my += y, m.xx += x * x, m.yy += y * y, m.xy += x * y;
    }
    for (double* v : {&m.mx, &m.my, &m.xx, &m.yy, &m.xy}) *v /= double(n);
    return ssim_of(m);
  }
  const std::vector<double> w = gaussian_window(kWindow, 1.5);
  const Planes p = products(a, b, n);
  const auto mx = filter_valid(p.x, height, width, w), my = filter_valid(p.y, height, width, w);
  const auto xx = filter_valid(p.xx, height, width, w), yy = filter_valid(p.yy, height, width, w);
  const auto xy = filter_valid(p.xy, height, width, w);
  double sum = 0;
  for (size_t i = 0; i < mx.size(); ++i) sum += ssim_of({mx[i], my[i], xx[i], yy[i], xy[i]});
  return sum / double(mx.size());
}

}  // namespace

void ErrorStats::add(const float* ref, const float* cand, int64_t n) {
  double err2 = 0, ref2 = 0, cand2 = 0, dot = 0, max_abs = max_abs_;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref[i], c = cand[i], d = c - r;
    err2 += d * d;
    ref2 += r * r;
    cand2 += c * c;
    dot += r * c;
    const double a = std::fabs(d);
    if (!(a <= max_abs)) max_abs = a;  // NaN sticks, so a broken tensor cannot look fine
  }
  n_ += n;
  err2_ += err2, ref2_ += ref2, cand2_ += cand2, dot_ += dot;
  max_abs_ = max_abs;
}

void ErrorStats::merge(const ErrorStats& o) {
  n_ += o.n_;
  err2_ += o.err2_, ref2_ += o.ref2_, cand2_ += o.cand2_, dot_ += o.dot_;
  if (!(o.max_abs_ <= max_abs_)) max_abs_ = o.max_abs_;
}

double ErrorStats::rmse() const { return n_ > 0 ? std::sqrt(err2_ / double(n_)) : 0.0; }

double ErrorStats::nmse() const {
  if (ref2_ > 0) return err2_ / ref2_;
  return err2_ > 0 ? kInf : 0.0;
}

double ErrorStats::snr_db() const {
  if (err2_ == 0) return kInf;
  if (ref2_ == 0) return -kInf;
  return 10 * std::log10(ref2_ / err2_);
}

double ErrorStats::cosine() const {
  if (ref2_ == 0 && cand2_ == 0) return 1.0;
  if (ref2_ == 0 || cand2_ == 0) return 0.0;
  return dot_ / std::sqrt(ref2_ * cand2_);
}

ErrorSummary summarize(const ErrorStats& s) {
  return {s.count(), s.rmse(), s.nmse(), s.snr_db(), s.cosine(), s.max_abs_error()};
}

ErrorSummary compare(const float* ref, const float* cand, int64_t n) {
  ErrorStats s;
  s.add(ref, cand, n);
  return summarize(s);
}

double nmse_db(double nmse) { return nmse > 0 ? 10 * std::log10(nmse) : -kInf; }

void ErrorHistogram::add_row(const float* ref, const float* cand, int64_t n) {
  double ref2 = 0;
  for (int64_t i = 0; i < n; ++i) ref2 += double(ref[i]) * ref[i];
  const double rms = n > 0 ? std::sqrt(ref2 / double(n)) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(cand[i]) - ref[i]);
    if (d == 0) {
      ++exact_;
      continue;
    }
    if (rms == 0 || !(d < rms * std::pow(10.0, kMaxLog10))) {
      ++above_;
      continue;
    }
    const double bin = (std::log10(d / rms) - kMinLog10) * kBinsPerDecade;
    if (bin < 0) {
      ++below_;
      continue;
    }
    ++bins_[size_t(std::min(int(bin), kBins - 1))];
  }
}

void ErrorHistogram::merge(const ErrorHistogram& o) {
  for (int i = 0; i < kBins; ++i) bins_[size_t(i)] += o.bins_[size_t(i)];
  exact_ += o.exact_, below_ += o.below_, above_ += o.above_;
}

double ErrorHistogram::bin_lower(int i) {
  return std::pow(10.0, kMinLog10 + double(i) / kBinsPerDecade);
}

int64_t ErrorHistogram::total() const {
  int64_t t = exact_ + below_ + above_;
  for (int64_t b : bins_) t += b;
  return t;
}

double psnr_db(const float* ref, const float* cand, int64_t n) {
  double err2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(cand[i]) - ref[i];
    err2 += d * d;
  }
  if (err2 == 0) return kInf;
  return 10 * std::log10(double(n) / err2);
}

double ssim(const float* ref, const float* cand, int channels, int height, int width) {
  const int64_t plane = int64_t(height) * width;
  double sum = 0;
  for (int c = 0; c < channels; ++c)
    sum += ssim_channel(ref + c * plane, cand + c * plane, height, width);
  return sum / channels;
}

}  // namespace klein::report
