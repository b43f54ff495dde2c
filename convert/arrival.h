#pragma once
// Source files that are converted while they download (klein pull). The files exist from
// the start with their full size (their safetensors headers written, the rest a hole), so
// the source store opens them as usual; the conversion then waits for each tensor's bytes
// before it reads them, and gives them back once they are stored. The downloader says how
// far each file has come. With `free_consumed`, bytes given back are freed from the disk
// (a hole punched into the file), so the disk holds the container and the source bytes not
// yet converted, not the whole download. Where the file system cannot punch holes, a file's
// bytes stay until it is removed (by klein pull, when the conversion ends), and a warning
// says so once for that file.
//
//   downloader thread                         convert_model (ConvertOptions::arrival)
//   expect(file, size) for every file: its number
//                                             attach(store.origin())
//                                             need(bytes) per tensor, in the order of the
//                                             container; planned()
//   order = wait_for_order()
//   per file k: wait_turn(k), then
//     arrived(k, n) as bytes come             wait(bytes) ... consumed(bytes)
//     complete(k, xxh3)                       source_xxh3(file) for the record
//   fail(message) on an error: every wait throws it; cancelled() tells the download to stop.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "weights/weight_store.h"

namespace klein::convert {

class SourceArrival {
 public:
  explicit SourceArrival(bool free_consumed) : free_consumed_(free_consumed) {}
  ~SourceArrival();
  SourceArrival(const SourceArrival&) = delete;
  SourceArrival& operator=(const SourceArrival&) = delete;

  // --- the downloader's side
  // A file that will arrive; it exists already with `size` bytes. Returns its number (0, 1,
  // ... in the order of the calls), by which the downloader names it below.
  size_t expect(const std::filesystem::path& file, uint64_t size);
  // The expected files' numbers in the order the conversion first reads them (the files it
  // never reads at the end), once the conversion has planned; throws after fail().
  std::vector<size_t> wait_for_order();
  // Waits until the files before order[k] are used up, or the conversion waits for bytes of
  // order[k] or a later file: at most one file is downloaded ahead of the conversion.
  void wait_turn(size_t k);
  // File `file`'s first `bytes` are on disk.
  void arrived(size_t file, uint64_t bytes);
  // All of it is on disk and checked; `xxh3` is the hex XXH3-64 of the whole file.
  void complete(size_t file, const std::string& xxh3);
  // Stops everything: waits on either side throw an error with this message.
  void fail(const std::string& message);
  const std::atomic<bool>* cancelled() const { return &failed_flag_; }

  // --- the conversion's side
  // The store's files and mappings (StoreOrigin::files, ::mappings, in the same order).
  void attach(const StoreOrigin& origin);
  // The bytes of one tensor, in the order the conversion will read them.
  void need(const void* data, size_t n);
  void planned();
  // Blocks until these mapped bytes are on disk (no-op for bytes of files not expected), or
  // until *cancel becomes true.
  void wait(const void* data, size_t n, const std::atomic<bool>* cancel = nullptr);
  // These bytes have been converted and are not read again.
  void consumed(const void* data, size_t n);
  // The XXH3 of an expected file once it is complete, with its size; nullopt for a file
  // that is not expected, or when `stop()` says so before it is complete.
  std::optional<std::pair<std::string, uint64_t>> source_xxh3(
      const std::filesystem::path& file, const std::function<bool()>& stop);

  // --- measuring
  // The conversion's output file, whose size counts in the disk use.
  void set_output(const std::filesystem::path& file);
  // Bytes on disk outside the expected files (the small files downloaded before).
  void set_other_bytes(uint64_t bytes) { other_bytes_ = bytes; }
  // The largest disk use sampled (blocks allocated to the expected files, the output file's
  // size and the other bytes), sampled as bytes arrive and are freed.
  uint64_t peak_disk_bytes();
  // Bytes freed by punching holes into the expected files.
  uint64_t freed_bytes();
  // Expected files whose consumed bytes could not be freed (no holes on their file system).
  size_t unfreed_files();
  // Told, once per such file, what could not be freed and why; called with the arrival's
  // lock held (it must not call back into the arrival). Default: a warning line on stderr.
  void set_warning(std::function<void(const std::string&)> warn);

 private:
  struct File {
    std::filesystem::path path;
    uint64_t size = 0;
    uint64_t arrived = 0;
    bool complete = false;
    std::string xxh3;
    const std::byte* base = nullptr;  // the conversion's mapping of it
    int fd = -1;                      // for punching holes and measuring
    std::map<uint64_t, uint64_t> consumed;  // merged [begin, end) ranges
    std::vector<std::pair<uint64_t, uint64_t>> needed_ranges;  // [begin, end), sorted at planned()
    uint64_t needed = 0, used = 0;          // bytes the conversion reads / has read
    bool punch_failed = false;
  };
  // The file whose mapping holds [data, data + n), and the offset; nullptr when none does.
  File* locate(const void* data, size_t n, uint64_t* offset);
  void throw_if_failed() const;
  void sample();  // with mutex_ held
  void punch(File& f, uint64_t begin, uint64_t end);

  const bool free_consumed_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<File> files_;
  std::vector<size_t> order_;  // indices into files_
  bool planned_ = false;
  int waiting_for_ = -1;  // the file the conversion waits on (index into files_), or -1
  std::atomic<bool> failed_flag_{false};
  std::string failure_;
  std::filesystem::path output_;
  uint64_t other_bytes_ = 0, peak_ = 0, freed_ = 0, last_sample_at_ = 0, progress_ = 0;
  size_t unfreed_ = 0;
  std::function<void(const std::string&)> warn_;
};

}  // namespace klein::convert
