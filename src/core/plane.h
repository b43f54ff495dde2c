#pragma once
// A [C, H, W] float32 array read and written in bands of rows, kept either in memory or in a
// scratch file. In a file it costs page cache, which the kernel can write out under memory
// pressure, instead of process memory: what lets the VAE decode 2048x2048 in a bounded
// amount of memory, where one full-resolution 128-channel tensor alone is 2 GiB.
//
// The files are created unlinked (O_TMPFILE, or a unique name removed at once), so nothing is
// left behind when the process ends, however it ends. Reads and writes are pread/pwrite, not
// a mapping: mapped file pages would count as the process's memory again. A plane's channels
// can be spread over several files, each a contiguous range of them: a write takes its file's
// inode lock, so threads copying their own channels into one file would wait for each other.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/threadpool.h"

namespace klein {

class Plane {
 public:
  Plane() = default;
  // In memory when `scratch_dir` is empty, otherwise in `files` new files there (at most one
  // per channel; fewer when the process runs out of file descriptors after the first). Its
  // values are undefined until written: write each row before reading it.
  Plane(int64_t channels, int64_t height, int64_t width, const std::string& scratch_dir = "",
        int files = 1);
  // Takes a [C, H, W] tensor as an in-memory plane.
  static Plane from_tensor(Tensor t);
  Plane(Plane&& other) noexcept;
  Plane& operator=(Plane&& other) noexcept;
  Plane(const Plane&) = delete;
  Plane& operator=(const Plane&) = delete;
  ~Plane();

  int64_t channels() const { return channels_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  bool in_file() const { return !fds_.empty(); }
  int files() const { return int(fds_.size()); }
  size_t bytes() const { return size_t(channels_ * height_ * width_) * sizeof(float); }

  // Rows [y0, y1) of every channel as a new [C, y1 - y0, W] tensor. With a pool, channels
  // are copied in parallel (copying from the page cache is bound by one core's memcpy).
  Tensor rows(int64_t y0, int64_t y1, ThreadPool* pool = nullptr) const;
  // The same into dst, [C, y1 - y0, W] (a buffer reused from band to band).
  void read(int64_t y0, int64_t y1, float* dst, ThreadPool* pool = nullptr) const;
  // Rows [from, from + n) of `band` ([C, any, W]) into rows [y0, y0 + n) of the plane.
  void write(const Tensor& band, int64_t from, int64_t n, int64_t y0, ThreadPool* pool = nullptr);
  // The same from a buffer [C, band_rows, W].
  void write(const float* band, int64_t band_rows, int64_t from, int64_t n, int64_t y0,
             ThreadPool* pool = nullptr);
  // Values [offset, offset + n) of the flat C·H·W array: a pointer into the plane in memory,
  // or `buffer` (room for n values) filled from the file.
  const float* span(int64_t offset, int64_t n, float* buffer) const;
  // The whole plane as a tensor (a copy).
  Tensor to_tensor() const;

 private:
  // Where channel c's values start: its file and the value offset in it.
  struct Place {
    int fd;
    int64_t offset;
  };
  Place place(int64_t c) const;
  void read_at(int fd, float* dst, int64_t count, int64_t offset) const;
  void write_at(int fd, const float* src, int64_t count, int64_t offset);
  void close_files();

  int64_t channels_ = 0, height_ = 0, width_ = 0;
  Tensor memory_;
  std::vector<int> fds_;  // file f holds channels [first(f), first(f + 1))
  std::string dir_;       // for messages
};

// Where scratch files go when no directory is given: $TMPDIR if set, else /var/tmp (on disk
// on Debian, where /tmp may be a RAM-backed tmpfs).
std::string default_scratch_dir();

// Checks, before long work that will need them, that scratch files can be made in `dir` and
// that it has `bytes` free; throws klein::Error naming the directory otherwise.
void check_scratch_space(const std::string& dir, uint64_t bytes);

}  // namespace klein
