#include "core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

// Removes "<name>.tmp-<pid>" files next to `path` whose process no longer runs: what a run
// killed before it could clean up left behind. A pid that runs again (reused) keeps its file.
void remove_stale_temps(const fs::path& path) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string prefix = path.filename().string() + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::stol(digits));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == -1 && errno == ESRCH) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

}  // namespace

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  remove_stale_temps(path_);
  temp_ = path_;
  temp_ += ".tmp-" + std::to_string(::getpid());
  file_ = std::fopen(temp_.c_str(), "wb");
  if (!file_) fail("cannot create ", temp_.string(), ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_) std::fclose(file_);
  if (!committed_) {
    std::error_code ec;
    fs::remove(temp_, ec);
  }
}

void AtomicFile::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, file_) != n)
    fail("cannot write ", temp_.string(), ": ", std::strerror(errno));
  offset_ += n;
}

void AtomicFile::flush() {
  if (file_ == nullptr) return;
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    fail("cannot write ", temp_.string(), ": ", std::strerror(errno));
  std::fclose(file_);
  file_ = nullptr;
}

void AtomicFile::commit() {
  flush();
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) fail("cannot rename ", temp_.string(), " to ", path_.string(), ": ", ec.message());
  committed_ = true;
}

namespace {

// Opens an input that must be a regular file. O_NONBLOCK: opening a FIFO for reading would
// otherwise wait for a writer, forever; it is refused below like any other special file.
int open_regular_file(const fs::path& path, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot open ", path.string(), ": ", std::strerror(errno));
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot stat ", path.string(), ": ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path.string(), " is not a regular file (a directory, pipe or device cannot be read as ",
         "an input)");
  }
  return fd;
}

}  // namespace

namespace {

// The ranges of the live mappings, for the SIGBUS handler: a fixed table it can read without
// locks or allocation. A slot is claimed by storing its start last, freed by clearing it.
struct MappingSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  char path[480] = {};
};
constexpr int kMappingSlots = 128;
MappingSlot g_mappings[kMappingSlots];

void register_mapping(const void* data, size_t size, const fs::path& path) {
  if (!data || size == 0) return;
  for (MappingSlot& slot : g_mappings) {
    uintptr_t expected = 0;
    // Reserve with a marker, fill in, then publish the real start.
    if (!slot.begin.compare_exchange_strong(expected, uintptr_t(1))) continue;
    std::snprintf(slot.path, sizeof slot.path, "%s", path.c_str());
    slot.end.store(uintptr_t(data) + size);
    slot.begin.store(uintptr_t(data));
    return;
  }
  // More than kMappingSlots files at once: a fault there is reported without the name.
}

void unregister_mapping(const void* data) {
  if (!data) return;
  for (MappingSlot& slot : g_mappings)
    if (slot.begin.load() == uintptr_t(data)) {
      slot.end.store(0);
      slot.begin.store(0);
      return;
    }
}

void write_all(const char* text) {
  size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= size_t(w);
  }
}

extern "C" void on_mapping_fault(int signal, siginfo_t* info, void*) {
  const uintptr_t at = uintptr_t(info ? info->si_addr : nullptr);
  for (const MappingSlot& slot : g_mappings) {
    const uintptr_t begin = slot.begin.load(), end = slot.end.load();
    if (begin > 1 && at >= begin && at < end) {
      write_all("error: ");
      write_all(slot.path);
      write_all(" shrank while in use (truncated or replaced by another program): its data can "
                "no longer be read; nothing was written\n");
      ::_exit(1);
    }
  }
  // Not a mapped file: the default action (a core dump, for a bug).
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

void install_mapping_fault_handler() {
  struct sigaction action = {};
  action.sa_sigaction = on_mapping_fault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, nullptr);
}

std::string file_identity(const fs::path& p) {
  struct stat st {};
  std::string id = fs::absolute(p).string();
  if (::stat(p.c_str(), &st) == 0)
    id += ":" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
          std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
          std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
          std::to_string(st.st_ctim.tv_nsec);
  return id;
}

FileStamp FileStamp::of(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("cannot examine ", path.string(), ": ", std::strerror(errno));
  FileStamp s;
  s.device = uint64_t(st.st_dev);
  s.inode = uint64_t(st.st_ino);
  s.size = uint64_t(st.st_size);
  s.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return s;
}

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("cannot map ", path.string(), ": ", std::strerror(e));
    }
    data_ = static_cast<const std::byte*>(p);
    register_mapping(data_, size_, path_);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) {
    unregister_mapping(data_);
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) {
      unregister_mapping(data_);
      ::munmap(const_cast<std::byte*>(data_), size_);
    }
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void read_pieces(int fd, const fs::path& path, std::span<char> buffer,
                 const std::function<bool(std::span<const char>)>& piece) {
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      fail("cannot read ", path.string(), ": ", std::strerror(e));
    }
    if (n == 0 || !piece(buffer.first(size_t(n)))) break;
  }
  ::close(fd);
}

std::string read_text_file(const fs::path& path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  std::string out;
  char buf[65536];
  read_pieces(fd, path, buf, [&](std::span<const char> p) {
    out.append(p.data(), p.size());
    return true;
  });
  return out;
}

void check_writable_output(const std::filesystem::path& path, std::string_view option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  check(!fs::is_directory(path, ec), option, " ", path.string(), ": is a directory; expected a file name");
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  check(fs::is_directory(dir, ec), option, " ", path.string(), ": the directory ", dir.string(),
        " does not exist");
  check(::access(dir.c_str(), W_OK) == 0, option, " ", path.string(), ": the directory ",
        dir.string(), " is not writable");
}

}  // namespace klein
