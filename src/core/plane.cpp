#include "core/plane.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace klein {

namespace {

// A new unlinked file in dir, or -1 with errno set.
int try_open_scratch(const std::string& dir) {
#ifdef O_TMPFILE
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  if (errno == EMFILE || errno == ENFILE) return -1;
#endif
  // File systems without O_TMPFILE: a unique name, removed as soon as it is open.
  std::string name = dir + "/klein-scratch-XXXXXX";
  const int named = ::mkostemp(name.data(), O_CLOEXEC);
  if (named >= 0) ::unlink(name.c_str());
  return named;
}

[[noreturn]] void cannot_create(const std::string& dir, int error) {
  fail("cannot create a scratch file in ", dir, ": ", std::strerror(error),
       error == EMFILE || error == ENFILE
           ? " (the process may open no more files: raise its limit, ulimit -n)"
           : " (set TMPDIR to a writable directory with free space)");
}

int open_scratch(const std::string& dir) {
  const int fd = try_open_scratch(dir);
  if (fd < 0) cannot_create(dir, errno);
  return fd;
}

// The first channel file f of n holds when a plane's channels are spread over n files in
// contiguous ranges: file f holds [first_channel(f), first_channel(f + 1)).
int64_t first_channel(int64_t f, int64_t channels, int64_t n) { return (f * channels + n - 1) / n; }

}  // namespace

std::string default_scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/var/tmp";
}

void check_scratch_space(const std::string& dir, uint64_t bytes) {
  ::close(open_scratch(dir));
  struct statvfs fs {};
  check(::statvfs(dir.c_str(), &fs) == 0, "cannot query the free space of the scratch directory ",
        dir, ": ", std::strerror(errno));
  const uint64_t free = uint64_t(fs.f_bavail) * uint64_t(fs.f_frsize);
  check(free >= bytes, "the scratch directory ", dir, " has ", free >> 20, " MiB free, ",
        bytes >> 20, " MiB are needed (set TMPDIR to a directory with more free space)");
}

Plane::Plane(int64_t channels, int64_t height, int64_t width, const std::string& scratch_dir,
             int files)
    : channels_(channels), height_(height), width_(width), dir_(scratch_dir) {
  check(channels > 0 && height > 0 && width > 0, "plane: invalid size ", channels, "x", height, "x",
        width);
  if (scratch_dir.empty()) {
    memory_ = Tensor({channels, height, width});  // every row is written before it is read
    return;
  }
  const int64_t wanted = std::clamp<int64_t>(files, 1, channels);
  try {
    while (int64_t(fds_.size()) < wanted) {
      const int fd = try_open_scratch(scratch_dir);
      if (fd < 0) {
        // Out of file descriptors with one open: fewer files hold the plane as well.
        if (!fds_.empty() && (errno == EMFILE || errno == ENFILE)) break;
        cannot_create(scratch_dir, errno);
      }
      fds_.push_back(fd);
    }
    const int64_t n = int64_t(fds_.size());
    for (int64_t f = 0; f < n; ++f) {
      // Sparse: blocks are allocated as rows are written, and unwritten rows read as zeros.
      const int64_t first = first_channel(f, channels, n), end = first_channel(f + 1, channels, n);
      const off_t size = off_t((end - first) * height * width) * off_t(sizeof(float));
      if (::ftruncate(fds_[size_t(f)], size) != 0)
        fail("cannot size a ", bytes() >> 20, " MiB scratch file in ", scratch_dir, ": ",
             std::strerror(errno));
    }
  } catch (...) {
    close_files();
    throw;
  }
}

Plane Plane::from_tensor(Tensor t) {
  check(t.shape().size() == 3, "plane: expected a [C, H, W] tensor, got ", shape_str(t.shape()));
  Plane p;
  p.channels_ = t.dim(0);
  p.height_ = t.dim(1);
  p.width_ = t.dim(2);
  p.memory_ = std::move(t);
  return p;
}

Plane::Plane(Plane&& o) noexcept
    : channels_(o.channels_),
      height_(o.height_),
      width_(o.width_),
      memory_(std::move(o.memory_)),
      fds_(std::exchange(o.fds_, {})),
      dir_(std::move(o.dir_)) {}

Plane& Plane::operator=(Plane&& o) noexcept {
  if (this != &o) {
    close_files();
    channels_ = o.channels_;
    height_ = o.height_;
    width_ = o.width_;
    memory_ = std::move(o.memory_);
    fds_ = std::exchange(o.fds_, {});
    dir_ = std::move(o.dir_);
  }
  return *this;
}

Plane::~Plane() { close_files(); }

void Plane::close_files() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

Plane::Place Plane::place(int64_t c) const {
  const int64_t n = int64_t(fds_.size());
  const int64_t f = c * n / channels_;  // the file whose range of channels has c
  return {fds_[size_t(f)], (c - first_channel(f, channels_, n)) * height_ * width_};
}

namespace {

// pread or pwrite of `bytes` bytes at byte `at`, resumed after a short transfer or EINTR;
// returns an error message, or nullptr when all were moved.
template <class Byte, class Transfer>
const char* transfer_all(Transfer transfer, Byte* p, size_t bytes, off_t at) {
  while (bytes > 0) {
    const ssize_t moved = transfer(p, bytes, at);
    if (moved < 0 && errno == EINTR) continue;
    if (moved < 0) return std::strerror(errno);
    if (moved == 0) return "no progress (end of file or no space)";
    p += moved;
    bytes -= size_t(moved);
    at += moved;
  }
  return nullptr;
}

}  // namespace

void Plane::read_at(int fd, float* dst, int64_t count, int64_t offset) const {
  const char* error =
      transfer_all([fd](char* p, size_t n, off_t at) { return ::pread(fd, p, n, at); },
                   reinterpret_cast<char*>(dst), size_t(count) * sizeof(float),
                   off_t(offset) * off_t(sizeof(float)));
  check(!error, "cannot read the scratch file in ", dir_, ": ", error);
}

void Plane::write_at(int fd, const float* src, int64_t count, int64_t offset) {
  const char* error =
      transfer_all([fd](const char* p, size_t n, off_t at) { return ::pwrite(fd, p, n, at); },
                   reinterpret_cast<const char*>(src), size_t(count) * sizeof(float),
                   off_t(offset) * off_t(sizeof(float)));
  check(!error, "cannot write the scratch file in ", dir_, ": ", error,
        " (set TMPDIR to a directory with more free space)");
}

namespace {

// fn(c) for every channel, on the pool's workers when there is one.
template <class Fn>
void each_channel(int64_t channels, ThreadPool* pool, Fn fn) {
  if (!pool) {
    for (int64_t c = 0; c < channels; ++c) fn(c);
    return;
  }
  pool->parallel_for(channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) fn(c);
  });
}

}  // namespace

Tensor Plane::rows(int64_t y0, int64_t y1, ThreadPool* pool) const {
  check(0 <= y0 && y0 < y1 && y1 <= height_, "plane: rows [", y0, ", ", y1, ") of ", height_);
  Tensor band({channels_, y1 - y0, width_});
  read(y0, y1, band.data(), pool);
  return band;
}

void Plane::read(int64_t y0, int64_t y1, float* dst, ThreadPool* pool) const {
  check(0 <= y0 && y0 < y1 && y1 <= height_, "plane: rows [", y0, ", ", y1, ") of ", height_);
  const int64_t n = (y1 - y0) * width_;
  each_channel(channels_, pool, [&](int64_t c) {
    if (in_file()) {
      const Place p = place(c);
      read_at(p.fd, dst + c * n, n, p.offset + y0 * width_);
    } else {
      std::memcpy(dst + c * n, memory_.data() + (c * height_ + y0) * width_,
                  size_t(n) * sizeof(float));
    }
  });
}

void Plane::write(const Tensor& band, int64_t from, int64_t n, int64_t y0, ThreadPool* pool) {
  check(band.shape().size() == 3 && band.dim(0) == channels_ && band.dim(2) == width_,
        "plane: cannot write a ", shape_str(band.shape()), " band into [", channels_, ", ", height_,
        ", ", width_, "]");
  write(band.data(), band.dim(1), from, n, y0, pool);
}

void Plane::write(const float* band, int64_t band_rows, int64_t from, int64_t n, int64_t y0,
                  ThreadPool* pool) {
  check(0 <= from && from + n <= band_rows && 0 <= y0 && y0 + n <= height_,
        "plane: cannot write rows [", from, ", ", from + n, ") of a ", band_rows,
        "-row band at row ", y0, " of [", channels_, ", ", height_, ", ", width_, "]");
  const int64_t band_plane = band_rows * width_, count = n * width_;
  each_channel(channels_, pool, [&](int64_t c) {
    const float* src = band + c * band_plane + from * width_;
    if (in_file()) {
      const Place p = place(c);
      write_at(p.fd, src, count, p.offset + y0 * width_);
    } else {
      std::memcpy(memory_.data() + (c * height_ + y0) * width_, src,
                  size_t(count) * sizeof(float));
    }
  });
}

const float* Plane::span(int64_t offset, int64_t n, float* buffer) const {
  check(0 <= offset && n >= 0 && offset + n <= channels_ * height_ * width_, "plane: values [",
        offset, ", ", offset + n, ") out of range");
  if (!in_file()) return memory_.data() + offset;
  const int64_t per_channel = height_ * width_;
  for (int64_t done = 0; done < n;) {  // channel by channel: they may be in different files
    const int64_t c = (offset + done) / per_channel, within = (offset + done) % per_channel;
    const int64_t count = std::min(n - done, per_channel - within);
    const Place p = place(c);
    read_at(p.fd, buffer + done, count, p.offset + within);
    done += count;
  }
  return buffer;
}

Tensor Plane::to_tensor() const { return rows(0, height_); }

}  // namespace klein
