#include "convert/arrival.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace klein::convert {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSampleEvery = uint64_t(8) << 20;  // bytes arrived between disk samples

fs::path same_path(const fs::path& p) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c;
}

uint64_t allocated(int fd) {
  struct stat st {};
  return fd >= 0 && ::fstat(fd, &st) == 0 ? uint64_t(st.st_blocks) * 512 : 0;
}

}  // namespace

SourceArrival::~SourceArrival() {
  for (File& f : files_)
    if (f.fd >= 0) ::close(f.fd);
}

size_t SourceArrival::expect(const fs::path& file, uint64_t size) {
  const std::lock_guard lock(mutex_);
  File f;
  f.path = same_path(file);
  f.size = size;
  f.fd = ::open(file.c_str(), O_RDWR);
  check(f.fd >= 0, "cannot open ", file.string(), ": ", std::strerror(errno));
  files_.push_back(std::move(f));
  return files_.size() - 1;
}

void SourceArrival::throw_if_failed() const {
  if (failed_flag_) throw Error(failure_);
}

void SourceArrival::fail(const std::string& message) {
  {
    const std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = message;
    failed_flag_ = true;
  }
  changed_.notify_all();
}

std::vector<size_t> SourceArrival::wait_for_order() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return planned_ || failed_flag_; });
  throw_if_failed();
  return order_;
}

void SourceArrival::wait_turn(size_t k) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    if (failed_flag_) return true;
    bool used_up = true;
    for (size_t j = 0; j < k && j < order_.size(); ++j) {
      const File& f = files_[order_[j]];
      used_up &= f.complete && f.used >= f.needed;
    }
    if (used_up) return true;
    if (waiting_for_ < 0) return false;
    const auto at = std::find(order_.begin(), order_.end(), size_t(waiting_for_));
    return size_t(at - order_.begin()) >= k;
  });
  throw_if_failed();
}

void SourceArrival::arrived(size_t file, uint64_t bytes) {
  {
    const std::lock_guard lock(mutex_);
    File& f = files_.at(file);
    f.arrived = std::max(f.arrived, bytes);
    if (bytes >= last_sample_at_ + kSampleEvery || bytes < last_sample_at_) {
      last_sample_at_ = bytes;
      sample();
    }
  }
  changed_.notify_all();
}

void SourceArrival::complete(size_t file, const std::string& xxh3) {
  {
    const std::lock_guard lock(mutex_);
    File& f = files_.at(file);
    f.arrived = f.size;
    f.complete = true;
    f.xxh3 = xxh3;
    sample();
    // What the conversion never reads (tensors of dropped layers, whole unused files) goes
    // as soon as the file has been hashed.
    uint64_t at = 0;
    for (const auto& [b, e] : f.needed_ranges) {
      if (b > at) punch(f, at, b);
      at = std::max(at, e);
    }
    if (f.size > at) punch(f, at, f.size);
    last_sample_at_ = 0;
  }
  changed_.notify_all();
}

void SourceArrival::attach(const StoreOrigin& origin) {
  const std::lock_guard lock(mutex_);
  for (size_t i = 0; i < origin.files.size() && i < origin.mappings.size(); ++i) {
    const fs::path p = same_path(origin.files[i]);
    for (File& f : files_)
      if (f.path == p) f.base = origin.mappings[i].first;
  }
}

SourceArrival::File* SourceArrival::locate(const void* data, size_t n, uint64_t* offset) {
  const auto* p = static_cast<const std::byte*>(data);
  for (File& f : files_) {
    if (!f.base || p < f.base || p + n > f.base + f.size) continue;
    *offset = uint64_t(p - f.base);
    return &f;
  }
  return nullptr;
}

void SourceArrival::need(const void* data, size_t n) {
  const std::lock_guard lock(mutex_);
  uint64_t at = 0;
  File* f = locate(data, n, &at);
  if (!f) return;
  f->needed += n;
  f->needed_ranges.emplace_back(at, at + n);
  const size_t index = size_t(f - files_.data());
  if (std::find(order_.begin(), order_.end(), index) == order_.end()) order_.push_back(index);
}

void SourceArrival::planned() {
  {
    const std::lock_guard lock(mutex_);
    for (size_t i = 0; i < files_.size(); ++i) {
      std::sort(files_[i].needed_ranges.begin(), files_[i].needed_ranges.end());
      if (std::find(order_.begin(), order_.end(), i) == order_.end()) order_.push_back(i);
    }
    planned_ = true;
  }
  changed_.notify_all();
}

void SourceArrival::wait(const void* data, size_t n, const std::atomic<bool>* cancel) {
  std::unique_lock lock(mutex_);
  uint64_t at = 0;
  File* f = locate(data, n, &at);
  if (!f) return;
  const int index = int(f - files_.data());
  while (!failed_flag_ && f->arrived < at + n && !(cancel && *cancel)) {
    if (waiting_for_ != index) {
      waiting_for_ = index;
      changed_.notify_all();
    }
    changed_.wait_for(lock, std::chrono::milliseconds(200));
  }
  waiting_for_ = -1;
  throw_if_failed();
}

void SourceArrival::consumed(const void* data, size_t n) {
  {
    const std::lock_guard lock(mutex_);
    uint64_t at = 0;
    File* f = locate(data, n, &at);
    if (!f || n == 0) return;
    f->used += n;
    // Merge [at, at + n) into the consumed ranges.
    uint64_t b = at, e = at + n;
    auto it = f->consumed.upper_bound(b);
    if (it != f->consumed.begin() && std::prev(it)->second >= b) {
      --it;
      b = it->first;
      e = std::max(e, it->second);
      it = f->consumed.erase(it);
    }
    while (it != f->consumed.end() && it->first <= e) {
      e = std::max(e, it->second);
      it = f->consumed.erase(it);
    }
    f->consumed[b] = e;
    // The disk use is largest just before bytes are freed.
    sample();
    // The pages this range touches that are now wholly consumed.
    const uint64_t lo = std::max(b, at / kPage * kPage);
    const uint64_t hi = std::min(e, (at + n + kPage - 1) / kPage * kPage);
    if (hi > lo) punch(*f, lo, hi);
  }
  changed_.notify_all();
}

void SourceArrival::punch(File& f, uint64_t begin, uint64_t end) {
  if (!free_consumed_ || f.punch_failed) return;
  // Whole pages only, except the file's last partial page.
  begin = (begin + kPage - 1) / kPage * kPage;
  end = end >= f.size ? f.size : end / kPage * kPage;
  if (end <= begin) return;
  const uint64_t before = allocated(f.fd);
  if (::fallocate(f.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(begin),
                  off_t(end - begin)) != 0) {
    // A file system without holes: the file's bytes stay until the file is removed (klein
    // pull removes its download when the conversion ends). Said once for the file.
    const int error = errno;
    f.punch_failed = true;
    ++unfreed_;
    const std::string message = "cannot free the converted bytes of " + f.path.string() +
                                " (punching a hole: " + std::strerror(error) +
                                "): its downloaded bytes stay on disk until the conversion "
                                "ends, so the disk may hold all of this file at once";
    if (warn_)
      warn_(message);
    else
      std::fprintf(stderr, "warning: %s\n", message.c_str());
    return;
  }
  const uint64_t after = allocated(f.fd);
  if (before > after) freed_ += before - after;
}

std::optional<std::pair<std::string, uint64_t>> SourceArrival::source_xxh3(
    const fs::path& file, const std::function<bool()>& stop) {
  std::unique_lock lock(mutex_);
  const fs::path p = same_path(file);
  File* f = nullptr;
  for (File& g : files_)
    if (g.path == p) f = &g;
  if (!f) return std::nullopt;
  while (!f->complete) {
    throw_if_failed();
    if (stop()) return std::nullopt;
    changed_.wait_for(lock, std::chrono::milliseconds(100));
  }
  return std::make_pair(f->xxh3, f->size);
}

void SourceArrival::set_output(const fs::path& file) {
  const std::lock_guard lock(mutex_);
  output_ = file;
}

void SourceArrival::sample() {
  uint64_t total = other_bytes_;
  for (const File& f : files_) total += allocated(f.fd);
  struct stat st {};
  if (!output_.empty() && ::stat(output_.c_str(), &st) == 0)
    total += std::max<uint64_t>(uint64_t(st.st_size), uint64_t(st.st_blocks) * 512);
  peak_ = std::max(peak_, total);
}

uint64_t SourceArrival::peak_disk_bytes() {
  const std::lock_guard lock(mutex_);
  sample();
  return peak_;
}

uint64_t SourceArrival::freed_bytes() {
  const std::lock_guard lock(mutex_);
  return freed_;
}

size_t SourceArrival::unfreed_files() {
  const std::lock_guard lock(mutex_);
  return unfreed_;
}

void SourceArrival::set_warning(std::function<void(const std::string&)> warn) {
  const std::lock_guard lock(mutex_);
  warn_ = std::move(warn);
}

}  // namespace klein::convert
