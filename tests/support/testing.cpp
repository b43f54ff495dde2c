#include "support/build_tree.h"
#include "support/testing.h"

#include "core/error.h"
#include "core/files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <map>
#include <mutex>

namespace klein::testing {

namespace fs = std::filesystem;

fs::path tiny_dir() {
  if (const char* env = std::getenv("KLEIN_TESTDATA")) return fs::path(env) / "klein-tiny";
  return fs::path(KLEIN_TESTDATA) / "klein-tiny";
}
fs::path tiny_model() { return tiny_dir() / "model"; }
fs::path tiny_vectors() { return tiny_dir() / "vectors"; }

namespace {

// The directory of this test process's temporary files, removed when the process exits
// normally (not by a forked child: death tests exit in a copy of the process), unless
// KLEIN_KEEP_TEST_FILES is set (to look at them after a failure).
const fs::path& process_temp_root() {
  static const fs::path root = [] {
    fs::path r = fs::temp_directory_path() / ("klein-test-" + std::to_string(::getpid()));
    static const pid_t owner = ::getpid();
    std::atexit([] {
      if (::getpid() != owner || std::getenv("KLEIN_KEEP_TEST_FILES")) return;
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("klein-test-" + std::to_string(owner)), ec);
    });
    return r;
  }();
  return root;
}

}  // namespace

std::string official_watermark_bits() {
  return nlohmann::json::parse(read_text_file(fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" /
                                              "watermark" / "manifest.json"))["message_bits"];
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = process_temp_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

namespace {

// An exclusive lock on a file, held while it lives.
class FileLock {
 public:
  explicit FileLock(const fs::path& path)
      : fd_(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw std::runtime_error("cannot open the lock file " + path.string());
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) throw std::runtime_error("cannot lock " + path.string());
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

std::string fnv1a64(const void* data, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

fs::path shared_fixture(const std::string& key, const std::function<bool(const fs::path&)>& make) {
  static std::mutex mutex;
  static std::map<std::string, fs::path> made;  // by this process
  const std::lock_guard<std::mutex> hold(mutex);
  if (const auto it = made.find(key); it != made.end()) return it->second;
  const char* root = std::getenv("KLEIN_TEST_FIXTURES");
  if (root == nullptr || *root == '\0') {
    const fs::path dir = temp_dir("fixture-" + key);
    if (make(dir)) made[key] = dir;
    return dir;
  }
  fs::create_directories(root);
  const fs::path dir = fs::path(root) / key;
  const fs::path complete = fs::path(root) / (key + ".complete");
  const FileLock lock(fs::path(root) / (key + ".lock"));
  if (!fs::exists(complete)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    // Kept only when it was made (a throw leaves it incomplete too): the next process that
    // asks makes it again, and fails where it fails.
    if (!make(dir)) return dir;
    std::ofstream(complete) << key << "\n";
  }
  return made[key] = dir;
}

namespace {

// Runs `script ARGS OUT` of tools/ (Debian's python3, which scripts/test.sh installs) into the
// shared fixture `name` and returns its directory (a test failure when the script fails).
fs::path run_fixture_script(const std::string& name, const fs::path& script,
                            const std::string& args) {
  return shared_fixture(name, [&](const fs::path& dir) {
    const std::string cmd = "/usr/bin/python3 " +
                            shell_arg(fs::path(KLEIN_SOURCE_DIR) / "tools" / script) + " " +
                            args + " " + shell_arg(dir) + " > /dev/null";
    if (std::system(cmd.c_str()) == 0) return true;
    ADD_FAILURE() << "the fixture script failed: " << cmd;
    return false;
  });
}

}  // namespace

fs::path tokenizer_json_fixture(const std::string& variant) {
  // Qwen/Qwen3-0.6B's tokenizer.json (11 422 654 bytes), which the pair variant equals.
  static const fs::path dir = run_fixture_script(
      "tokenizer-json-fixtures", fs::path("tokenizer_json") / "make_fixture.py",
      "--expect-pairs-sha256 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 " +
          shell_arg(tiny_model() / "tokenizer"));
  return dir / variant / "tokenizer.json";
}

fs::path lora_fixtures() {
  static const fs::path dir = run_fixture_script(
      "lora-fixtures", fs::path("lora") / "lora_fixture.py",
      "make " + shell_arg(tiny_model() / "transformer" / "diffusion_pytorch_model.safetensors"));
  return dir;
}

fs::path zimage_lora_fixtures() {
  static const fs::path dir = run_fixture_script(
      "zimage-lora-fixtures", fs::path("lora") / "lora_fixture.py",
      "make-zimage " + shell_arg(tiny_dir().parent_path() / "zimage-tiny" / "model" /
                                 "transformer" / "diffusion_pytorch_model.safetensors"));
  return dir;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

double scaled_diff(const float* got, const float* ref, int64_t n) {
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!(d <= max_diff)) max_diff = d;  // NaN propagates as a failure
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

::testing::AssertionResult matches_npy(const float* got, int64_t n, const fs::path& ref_path,
                                       double tol) {
  NpyArray ref = read_npy(ref_path);
  if (ref.numel() != n)
    return ::testing::AssertionFailure()
           << ref_path.filename() << ": got " << n << " values, reference has " << ref.numel()
           << " " << shape_str(ref.shape);
  std::vector<float> r = ref.to_f32();
  double s = scaled_diff(got, r.data(), n);
  if (s <= tol) return ::testing::AssertionSuccess();
  int64_t worst = 0;
  double wd = -1;
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs(double(got[i]) - r[size_t(i)]);
    if (!(d <= wd)) {
      wd = d;
      worst = i;
    }
  }
  return ::testing::AssertionFailure()
         << ref_path.filename() << ": scaled diff " << s << " > " << tol << "; worst at flat index "
         << worst << ": got " << got[worst] << ", reference " << r[size_t(worst)];
}

::testing::AssertionResult matches_npy(const Tensor& got, const fs::path& ref, double tol) {
  return matches_npy(got.data(), got.numel(), ref, tol);
}

const char* klein_binary() { return KLEIN_BINARY; }

bool sanitized() {
#if defined(KLEIN_SANITIZED)
  return true;
#else
  return false;
#endif
}

int run_klein(const std::string& args, std::string* output) {
  std::string cmd = std::string(klein_binary()) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  std::string out;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = ::pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

nlohmann::json klein_json(const std::string& args, int status) {
  std::string out;
  EXPECT_EQ(run_klein(args + " --json", &out), status) << args << "\n" << out;
  size_t at = 0;
  while (at < out.size()) {
    const size_t end = std::min(out.find('\n', at), out.size());
    if (out[at] == '{') {
      nlohmann::json j = nlohmann::json::parse(out.substr(at, end - at), nullptr, false);
      if (!j.is_discarded()) return j;
    }
    at = end + 1;
  }
  ADD_FAILURE() << "no JSON line in the output of klein " << args << ":\n" << out;
  return nlohmann::json::object();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected klein::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected klein::Error, nothing was thrown";
  return "";
}

std::vector<float> random_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

Tensor random_tensor(Shape shape, uint32_t seed) {
  Tensor t(shape);
  const std::vector<float> v = random_values(t.numel(), seed);
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

::testing::AssertionResult convert_tiny(const fs::path& out, const std::string& args,
                                        std::string* log) {
  const auto convert = [&](const fs::path& to, std::string& output) {
    const std::string command =
        "convert -m " + shell_arg(tiny_model()) + " " + args + " -o " + shell_arg(to);
    const int rc = run_klein(command, &output);
    if (rc == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "klein " << command << " exited with " << rc
                                         << ":\n" << output;
  };
  if (log != nullptr) return convert(out, *log);
  // One conversion per set of arguments in a test run (named by their hash).
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  const std::string key = "convert-" + fnv1a64(args.data(), args.size());
  const fs::path dir = shared_fixture(key, [&](const fs::path& d) {
    std::string output;
    result = convert(d / "tiny.klein", output);
    return bool(result);
  });
  if (!result) return result;
  std::error_code ec;
  fs::copy_file(dir / "tiny.klein", out, fs::copy_options::overwrite_existing, ec);
  if (!ec) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "cannot copy the converted tiny model to " << out
                                       << ": " << ec.message();
}

std::string shell_arg(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

std::string tiny_components(const std::filesystem::path& transformer) {
  const std::filesystem::path m = tiny_model();
  return " --diffusion-model " + shell_arg(transformer) + " --text-encoder " +
         shell_arg(m / "text_encoder" / "model.safetensors.index.json") + " --vae " +
         shell_arg(m / "vae" / "diffusion_pytorch_model.safetensors") + " --tokenizer " +
         shell_arg(m / "tokenizer") + " --variant 4b";
}

}  // namespace klein::testing
