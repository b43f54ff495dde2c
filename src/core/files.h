#pragma once
// File helpers shared by every writer and reader: atomic output and read-only mappings.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace klein {

// Writes to "<path>.tmp-<pid>" and renames onto `path` in commit(); if the object dies
// without commit() (an error, an exception) the temporary file is removed, so a failed
// run never leaves a partial output behind. Temporary files of `path` that processes no
// longer running left behind (killed with no chance to clean up) are removed on creation.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t offset() const { return offset_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  // For libraries that want a FILE* (libpng, libjpeg): valid until commit().
  std::FILE* stream() { return file_; }
  // Puts everything written on the disk (the step a full disk fails); commit() after it
  // only renames. For several files that must all be written before any replaces its target.
  void flush();
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path temp_;
  std::FILE* file_ = nullptr;
  uint64_t offset_ = 0;
  bool committed_ = false;
};

// A whole file mapped read-only. Move-only. While mapped, its range is registered so that a
// fault on it (SIGBUS: the file shrank under the mapping) can be reported by name; see
// install_mapping_fault_handler.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Makes a fault on a MappedFile's range (SIGBUS: the file was truncated while in use) end the
// process with "error: FILE shrank while in use ..." on stderr and exit status 1 instead of a
// crash; other SIGBUS keep their default action. For programs: a library should not take
// over a signal, so the C library leaves this to its caller.
void install_mapping_fault_handler();

// What identifies a file's contents without reading them: device, inode, size and
// modification time. Equal stamps: the same file, not rewritten (short of a writer that
// restores the time).
struct FileStamp {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
  // Throws naming the path when it cannot be examined.
  static FileStamp of(const std::filesystem::path& path);
};

// A string that identifies a file's contents for caches without reading them: the absolute
// path, device and inode, size, modification time and change time (the kernel sets the change
// time on every write and it cannot be set back, so a file rewritten in place with its size and
// time restored still gets a new identity). The path alone when the file cannot be examined.
std::string file_identity(const std::filesystem::path& path);

std::string read_text_file(const std::filesystem::path& path);

// Reads the open file `fd` (named `path` in errors) from where it stands to its end through
// `buffer`, handing each piece to `piece`, which returns false to stop early. Closes fd when
// done, on an error (which fails naming the path) or when stopped.
void read_pieces(int fd, const std::filesystem::path& path, std::span<char> buffer,
                 const std::function<bool(std::span<const char>)>& piece);

// Fails (naming `option` and the path) unless a file can be written at `path`: its directory
// exists and is writable, and the path is not a directory. For checks before long work.
void check_writable_output(const std::filesystem::path& path, std::string_view option);

}  // namespace klein
