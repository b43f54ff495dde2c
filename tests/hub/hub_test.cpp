// `klein pull` and the Hub client against a fake Hub on the loopback address: the file-list
// API (paged, with LFS SHA-256s and git blob ids computed here by sha256sum and git), file
// downloads that redirect large files to a second "content host", a gated repository,
// a connection dropped mid-file, bytes that do not match their hash, a file list without
// usable hashes (refused unless --no-verify). The container pull makes is the one `klein
// convert` makes from the same files, byte for byte, for FLUX.2-klein and Z-Image.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/arrival.h"
#include "core/error.h"
#include "hub/hub.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The first word a shell command prints.
std::string command_word(const std::string& cmd) {
  std::string out;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  return out.substr(0, out.find_first_of(" \t\n"));
}

struct Logged {
  std::string host, path, range;
  bool authorized;
};

// A repository served the way the Hub serves one. Files ending in .safetensors are "LFS":
// listed with their SHA-256 and redirected to the content host.
class FakeHub {
 public:
  std::string repo = "acme/tiny-klein";
  std::string token;                 // non-empty: a gated repository that needs this token
  std::set<std::string> drop_once;   // files whose first transfer stops halfway
  std::set<std::string> corrupt;     // files served with one byte changed
  // What the file list gives instead of a file's hash (the LFS SHA-256 of .safetensors
  // files, else the git blob id); nullopt: no hash at all.
  std::map<std::string, std::optional<std::string>> listed_hash;
  // Safetensors files whose header, read ahead with a range request, is served with its
  // "format" metadata changed (the file itself is served as it is).
  std::set<std::string> lying_header;
  std::map<std::string, std::string> files;
  int page_size = 4;

  explicit FakeHub(const fs::path& model_dir, const fs::path& scratch) {
    for (const auto& e : fs::recursive_directory_iterator(model_dir))
      if (e.is_regular_file())
        files[fs::relative(e.path(), model_dir).generic_string()] = read_file(e.path());
    // What a real repository has besides: a single-file checkpoint at the root, a precision
    // variant, a README; none of them is downloaded.
    files["flux-2-klein-tiny.safetensors"] = std::string(3000, 'x');
    files["transformer/diffusion_pytorch_model.fp16.safetensors"] = std::string(2000, 'y');
    files["README.md"] = "# tiny\n";
    // Hashes from the tools everyone has: sha256sum and git.
    for (const auto& [path, bytes] : files) {
      const fs::path f = scratch / "hash-me";
      std::ofstream(f, std::ios::binary) << bytes;
      sha256_[path] = command_word("sha256sum " + testing::shell_arg(f));
      oid_[path] = command_word("git hash-object " + testing::shell_arg(f));
    }
    routes();
    api_port_ = api_.bind_to_any_port("127.0.0.1");
    cdn_port_ = cdn_.bind_to_any_port("127.0.0.1");
    threads_.emplace_back([this] { api_.listen_after_bind(); });
    threads_.emplace_back([this] { cdn_.listen_after_bind(); });
  }
  ~FakeHub() {
    api_.stop();
    cdn_.stop();
    for (auto& t : threads_) t.join();
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(api_port_); }
  std::vector<Logged> log() {
    const std::lock_guard lock(mutex_);
    return log_;
  }
  std::vector<Logged> downloads_of(const std::string& path) {
    std::vector<Logged> out;
    for (const auto& l : log())
      if (l.path.size() >= path.size() &&
          l.path.compare(l.path.size() - path.size(), path.size(), path) == 0)
        out.push_back(l);
    return out;
  }
  const std::string& sha256(const std::string& path) { return sha256_.at(path); }

 private:
  void record(const std::string& host, const httplib::Request& q) {
    const std::lock_guard lock(mutex_);
    log_.push_back({host, q.path, q.get_header_value("Range"), q.has_header("Authorization")});
  }
  // Gated: no token 401, a wrong one 403, both with the Hub's error headers.
  bool refused(const httplib::Request& q, httplib::Response& r) {
    if (token.empty()) return false;
    const std::string given = q.get_header_value("Authorization");
    if (given == "Bearer " + token) return false;
    r.status = given.empty() ? 401 : 403;
    r.set_header("X-Error-Code", "GatedRepo");
    r.set_header("X-Error-Message", "Access to model " + repo + " is restricted.");
    return true;
  }
  void serve(const std::string& path, const httplib::Request& q, httplib::Response& r) {
    std::string bytes = files.at(path);
    if (corrupt.count(path)) bytes[bytes.size() / 2] ^= 1;
    // The first transfer that goes past the middle is dropped there (not a read of the
    // first few bytes, e.g. a safetensors header).
    const std::string range = q.get_header_value("Range");
    const size_t dash = range.find('-');
    if (lying_header.count(path) && range.starts_with("bytes=0-") && range.size() > 9) {
      const size_t format = bytes.find("\"format\":\"pt\"");
      if (format != std::string::npos) bytes[format + 10] = 'q';
    }
    const bool past_middle = !range.starts_with("bytes=") || dash + 1 >= range.size() ||
                             std::stoull(range.substr(dash + 1)) >= bytes.size() / 2;
    bool drop = false;
    if (past_middle) {
      const std::lock_guard lock(mutex_);
      drop = drop_once.erase(path) > 0;
    }
    auto shared = std::make_shared<std::string>(std::move(bytes));
    r.set_content_provider(shared->size(), "application/octet-stream",
                           [shared, drop](size_t offset, size_t length, httplib::DataSink& sink) {
                             if (drop && offset + length > shared->size() / 2) {
                               // Half the file, then the connection goes away.
                               const size_t half = shared->size() / 2;
                               if (offset < half) sink.write(shared->data() + offset, half - offset);
                               return false;
                             }
                             sink.write(shared->data() + offset, length);
                             return true;
                           });
  }
  void routes() {
    api_.Get(R"(/api/models/([^/]+/[^/]+)/tree/([^/]+))",
             [this](const httplib::Request& q, httplib::Response& r) {
               record("api", q);
               if (q.matches[1] != repo) {
                 r.status = 401;  // what the Hub answers for a missing repository
                 r.set_header("X-Error-Code", "RepoNotFound");
                 return;
               }
               if (refused(q, r)) return;
               if (q.matches[2] != "main" && q.matches[2] != "v1.0") {
                 r.status = 404;
                 r.set_header("X-Error-Code", "RevisionNotFound");
                 return;
               }
               const size_t cursor =
                   q.has_param("cursor") ? std::stoul(q.get_param_value("cursor")) : 0;
               json list = json::array();
               size_t i = 0;
               for (const auto& [path, bytes] : files) {
                 if (i++ < cursor || list.size() >= size_t(page_size)) continue;
                 // (an LFS file's "oid" is its pointer file's blob id: a made-up one here)
                 const bool lfs = path.ends_with(".safetensors");
                 json item = {{"type", "file"}, {"path", path}, {"size", bytes.size()},
                              {"oid", lfs ? std::string(40, 'e') : oid_.at(path)}};
                 if (lfs)
                   item["lfs"] = {{"oid", sha256_.at(path)}, {"size", bytes.size()},
                                  {"pointerSize", 134}};
                 if (const auto listed = listed_hash.find(path); listed != listed_hash.end()) {
                   json& holder = lfs ? item["lfs"] : item;
                   if (listed->second)
                     holder["oid"] = *listed->second;
                   else
                     holder.erase("oid");
                 }
                 list.push_back(item);
               }
               list.push_back({{"type", "directory"}, {"path", "vae"}, {"oid", "0"}});
               if (cursor + page_size < files.size())
                 r.set_header("Link", "<" + endpoint() + "/api/models/" + repo + "/tree/" +
                                          std::string(q.matches[2]) + "?recursive=true&cursor=" +
                                          std::to_string(cursor + page_size) +
                                          ">; rel=\"next\"");
               r.set_content(list.dump(), "application/json");
             });
    api_.Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))",
             [this](const httplib::Request& q, httplib::Response& r) {
               record("api", q);
               if (refused(q, r)) return;
               const std::string path = q.matches[3];
               if (q.matches[1] != repo || !files.count(path)) {
                 r.status = 404;
                 r.set_header("X-Error-Code", "EntryNotFound");
                 return;
               }
               if (path.ends_with(".safetensors")) {
                 r.set_redirect("http://127.0.0.1:" + std::to_string(cdn_port_) + "/blobs/" + path,
                                302);
                 return;
               }
               serve(path, q, r);
             });
    cdn_.Get(R"(/blobs/(.+))", [this](const httplib::Request& q, httplib::Response& r) {
      record("cdn", q);
      serve(q.matches[1], q, r);
    });
  }

  httplib::Server api_, cdn_;
  int api_port_ = 0, cdn_port_ = 0;
  std::vector<std::thread> threads_;
  std::map<std::string, std::string> sha256_, oid_;
  std::mutex mutex_;
  std::vector<Logged> log_;
};

// Environment for a `klein pull` run: the fake Hub as HF_ENDPOINT, a token or none.
class HubEnv {
 public:
  HubEnv(const std::string& endpoint, const std::string& token) {
    ::setenv("HF_ENDPOINT", endpoint.c_str(), 1);
    ::setenv("HF_HOME", "/nonexistent-hf-home", 1);  // no token file
    // The container records its date: the same one for pull and convert.
    ::setenv("SOURCE_DATE_EPOCH", "1700000000", 1);
    if (token.empty())
      ::unsetenv("HF_TOKEN");
    else
      ::setenv("HF_TOKEN", token.c_str(), 1);
  }
  ~HubEnv() {
    ::unsetenv("HF_ENDPOINT");
    ::unsetenv("HF_TOKEN");
    ::unsetenv("HF_HOME");
    ::unsetenv("SOURCE_DATE_EPOCH");
  }
};

// A read of a file's first bytes ("bytes=0-N"): pull reads each safetensors header so before
// the file itself.
bool header_read(const Logged& l) {
  return l.range.starts_with("bytes=0-") && l.range.size() > 8;
}

std::vector<Logged> transfers(const std::vector<Logged>& gets) {
  std::vector<Logged> out;
  for (const auto& l : gets)
    if (!header_read(l)) out.push_back(l);
  return out;
}

fs::path tiny_copy(const std::string& name, const fs::path& model = testing::tiny_model()) {
  // The model's name comes from its folder: convert a copy named as the repository.
  const fs::path dir = testing::temp_dir("hub-source") / name;
  fs::create_directories(dir);
  fs::copy(model, dir, fs::copy_options::recursive);
  return dir;
}

using testing::zimage_model;

// The files of the fake Hub that were downloaded (resolved), by path in the repository.
std::set<std::string> fetched_files(FakeHub& hub) {
  std::set<std::string> fetched;
  for (const auto& l : hub.log()) {
    size_t at = l.path.find("/resolve/");
    if (at == std::string::npos) continue;
    at = l.path.find('/', at + 9);  // past the revision
    fetched.insert(l.path.substr(at + 1));
  }
  return fetched;
}

// The JSON lines of a --json run.
std::vector<json> events_of(const std::string& log) {
  std::vector<json> events;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("event")) events.push_back(j);
  }
  return events;
}

TEST(Pull, MakesTheContainerConvertMakesAndDownloadsOnlyWhatItNeeds) {
  const fs::path out = testing::temp_dir("pull-basic");
  FakeHub hub(testing::tiny_model(), out);
  HubEnv env(hub.endpoint(), "");
  std::string log, convert_log;
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein -t q4 --json -o " +
                                   testing::shell_arg(out / "pulled.klein"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(tiny_copy("tiny-klein")) +
                                   " -t q4 -q -o " + testing::shell_arg(out / "converted.klein"),
                               &convert_log),
            0)
      << convert_log;
  const std::string pulled = read_file(out / "pulled.klein");
  ASSERT_GT(pulled.size(), 1000u);
  EXPECT_TRUE(pulled == read_file(out / "converted.klein"))
      << "the pulled container differs from the converted one";
  EXPECT_FALSE(fs::exists(out / "pulled.klein.download")) << "the download was not removed";

  // Only the diffusers files: not the root single file, the fp16 variant or the README.
  std::set<std::string> fetched;
  for (const auto& l : hub.log())
    if (l.path.find("/resolve/") != std::string::npos)
      fetched.insert(l.path.substr(l.path.find("/main/") + 6));
  EXPECT_EQ(fetched.size(), 14u);
  EXPECT_FALSE(fetched.count("flux-2-klein-tiny.safetensors"));
  EXPECT_FALSE(fetched.count("transformer/diffusion_pytorch_model.fp16.safetensors"));
  EXPECT_FALSE(fetched.count("README.md"));
  EXPECT_TRUE(fetched.count("text_encoder/model-00002-of-00002.safetensors"));
  // Every file list page was read (the list is paged by four).
  int pages = 0;
  for (const auto& l : hub.log()) pages += l.path.find("/tree/") != std::string::npos;
  EXPECT_EQ(pages, 5);

  // --json: a plan, progress events, and the result with the peak disk use.
  json done;
  bool plan = false, progress = false;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    plan |= j.value("event", "") == "plan";
    progress |= j.value("event", "") == "download";
    if (j.value("event", "") == "done") done = j;
  }
  EXPECT_TRUE(plan && progress) << log;
  ASSERT_TRUE(done.is_object()) << log;
  EXPECT_EQ(done["container_bytes"].get<uint64_t>(), pulled.size());
  EXPECT_GT(done["peak_disk_bytes"].get<uint64_t>(), pulled.size());
}

// The conversion starts on the first file while later ones are still to come, and what it
// has stored is freed from the disk: the disk never holds the whole download.
TEST(Pull, ConvertsWhileDownloadingAndFreesWhatItStored) {
  const fs::path out = testing::temp_dir("pull-stream");
  FakeHub hub(testing::tiny_model(), out);
  HubEnv env(hub.endpoint(), "");
  std::string log;
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein --json -o " +
                                   testing::shell_arg(out / "a.klein"), &log),
            0)
      << log;
  std::vector<json> events;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("event")) events.push_back(j);
  }
  size_t first_stored = events.size(), last_byte = 0, units = 0;
  std::string last_file;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i]["event"] == "convert") {
      first_stored = std::min(first_stored, i);
      units = events[i]["units"].get<size_t>();
    }
    if (events[i]["event"] == "download") {
      last_byte = i;
      last_file = events[i]["file"].get<std::string>();
    }
  }
  ASSERT_GT(units, 0u) << log;
  EXPECT_LT(first_stored, last_byte) << "no unit was stored before the last file arrived";
  EXPECT_TRUE(last_file.ends_with(".safetensors")) << last_file;
  ASSERT_FALSE(events.empty());
  const json& done = events.back();
  ASSERT_EQ(done["event"], "done") << log;
  const uint64_t container = done["container_bytes"], sources = done["source_bytes"],
                 peak = done["peak_disk_bytes"], freed = done["freed_bytes"];
  uint64_t largest = 0, small = 0;
  for (const auto& [path, bytes] : hub.files) {
    if (path == "flux-2-klein-tiny.safetensors" || path.find(".fp16.") != std::string::npos)
      continue;
    if (path.ends_with(".safetensors"))
      largest = std::max<uint64_t>(largest, bytes.size());
    else
      small += bytes.size();
  }
  std::printf("container %llu, sources %llu (largest %llu), peak on disk %llu, freed %llu\n",
              (unsigned long long)container, (unsigned long long)sources,
              (unsigned long long)largest, (unsigned long long)peak, (unsigned long long)freed);
  EXPECT_GT(freed, sources / 2);
  EXPECT_GE(peak, container);
  // At most the container, the small files, one source file and the pages around what is
  // not stored yet.
  EXPECT_LE(peak, container + small + largest + 64 * 4096);
  EXPECT_LT(peak, container + sources);
  EXPECT_FALSE(fs::exists(out / "a.klein.download"));
}

TEST(Pull, GatedRepositoryNamesTheLicencePageAndTheTokenGoesToTheHubOnly) {
  const fs::path out = testing::temp_dir("pull-gated");
  FakeHub hub(testing::tiny_model(), out);
  hub.token = "hf_secret";
  std::string log;
  {
    HubEnv env(hub.endpoint(), "");
    EXPECT_NE(testing::run_klein("pull acme/tiny-klein -o " +
                                     testing::shell_arg(out / "a.klein"), &log), 0);
    EXPECT_NE(log.find("acme/tiny-klein is a gated repository (HTTP 401): open " +
                       hub.endpoint() + "/acme/tiny-klein, accept its licence"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("no token was given"), std::string::npos) << log;
  }
  {
    HubEnv env(hub.endpoint(), "hf_wrong");
    EXPECT_NE(testing::run_klein("pull acme/tiny-klein -o " +
                                     testing::shell_arg(out / "a.klein"), &log), 0);
    EXPECT_NE(log.find("gated repository (HTTP 403)"), std::string::npos) << log;
    EXPECT_NE(log.find("the token given has no access yet"), std::string::npos) << log;
  }
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  {
    HubEnv env(hub.endpoint(), "hf_secret");
    ASSERT_EQ(testing::run_klein("pull acme/tiny-klein -o " +
                                     testing::shell_arg(out / "a.klein"), &log), 0) << log;
    EXPECT_NE(log.find("[14/14] vae/diffusion_pytorch_model.safetensors"), std::string::npos)
        << log;
  }
  EXPECT_TRUE(fs::exists(out / "a.klein"));
  int cdn = 0;
  for (const auto& l : hub.log()) {
    if (l.host == "cdn") {
      ++cdn;
      EXPECT_FALSE(l.authorized) << "the token went to the content host: " << l.path;
    }
  }
  // The four safetensors files, redirected: each file's header length, its header, the file.
  EXPECT_EQ(cdn, 12);
}

TEST(Pull, ADroppedConnectionResumesWithARangeRequest) {
  const fs::path out = testing::temp_dir("pull-drop");
  FakeHub hub(testing::tiny_model(), out);
  const std::string big = "text_encoder/model-00001-of-00002.safetensors";
  hub.drop_once = {big, "vae/config.json"};
  HubEnv env(hub.endpoint(), "");
  std::string log;
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein -q -o " +
                                   testing::shell_arg(out / "a.klein"), &log), 0)
      << log;
  const auto all_gets = hub.downloads_of("/blobs/" + big);
  const auto gets = transfers(all_gets);
  EXPECT_EQ(all_gets.size() - gets.size(), 2u);  // the header's length, then the header
  ASSERT_EQ(gets.size(), 2u);
  EXPECT_EQ(gets[0].range, "");
  EXPECT_EQ(gets[1].range, "bytes=" + std::to_string(hub.files.at(big).size() / 2) + "-");
  const auto small = hub.downloads_of("/vae/config.json");
  ASSERT_EQ(small.size(), 2u);
  EXPECT_NE(small[1].range, "");
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(tiny_copy("tiny-klein")) +
                                   " -t q4 -q -o " + testing::shell_arg(out / "b.klein"), &log),
            0) << log;
  EXPECT_TRUE(read_file(out / "a.klein") == read_file(out / "b.klein"));
}

TEST(Pull, BytesThatDoNotMatchTheirHashAreRefusedAndARerunResumes) {
  const fs::path out = testing::temp_dir("pull-corrupt");
  FakeHub hub(testing::tiny_model(), out);
  const std::string bad = "vae/diffusion_pytorch_model.safetensors";
  hub.corrupt = {bad};
  HubEnv env(hub.endpoint(), "");
  std::string log;
  // Converted while downloading: the mismatch is found after the file's last byte; nothing
  // is written and the download (partly freed already) is removed.
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -q -o " +
                                   testing::shell_arg(out / "a.klein"), &log), 0);
  const std::string mismatch =
      bad + ": the downloaded bytes do not match the repository's SHA-256 " + hub.sha256(bad);
  EXPECT_NE(log.find(mismatch), std::string::npos) << log;
  EXPECT_NE(log.find("run the same command to start again, or add --keep-source DIR"),
            std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  EXPECT_FALSE(fs::exists(out / "a.klein.download"));
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find("a.klein"), std::string::npos)
        << "left behind: " << e.path();

  // --keep-source: a download that stays, and a rerun fetches what is missing only.
  const fs::path kept = out / "sources";
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -q --keep-source " +
                                   testing::shell_arg(kept) + " -o " +
                                   testing::shell_arg(out / "a.klein"), &log), 0);
  EXPECT_NE(log.find(mismatch), std::string::npos) << log;
  EXPECT_NE(log.find("the same command resumes"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  EXPECT_FALSE(fs::exists(kept / "tiny-klein" / (bad + ".part")));
  EXPECT_FALSE(fs::exists(kept / "tiny-klein" / bad));
  EXPECT_TRUE(fs::exists(kept / "tiny-klein" / "transformer/diffusion_pytorch_model.safetensors"));
  hub.corrupt.clear();
  const size_t before = hub.log().size();
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein -q --keep-source " +
                                   testing::shell_arg(kept) + " -o " +
                                   testing::shell_arg(out / "a.klein"), &log), 0)
      << log;
  std::set<std::string> again;
  const auto all = hub.log();
  for (size_t i = before; i < all.size(); ++i)
    if (all[i].path.find("/resolve/") != std::string::npos) again.insert(all[i].path);
  EXPECT_EQ(again.size(), 1u) << "files already downloaded were fetched again";
  EXPECT_TRUE(again.count("/acme/tiny-klein/resolve/main/" + bad));
  EXPECT_TRUE(fs::exists(out / "a.klein"));
  EXPECT_TRUE(fs::exists(kept / "tiny-klein" / bad));

  // Streaming again, now that the bytes are right: the same container.
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein -q -o " +
                                   testing::shell_arg(out / "b.klein"), &log), 0)
      << log;
  EXPECT_TRUE(read_file(out / "a.klein") == read_file(out / "b.klein"));
}

TEST(Pull, ClearErrorsBeforeAnyDownload) {
  const fs::path out = testing::temp_dir("pull-errors");
  FakeHub hub(testing::tiny_model(), out);
  HubEnv env(hub.endpoint(), "");
  std::string log;
  EXPECT_NE(testing::run_klein("pull acme/other -o " + testing::shell_arg(out / "a.klein"), &log),
            0);
  EXPECT_NE(log.find("acme/other: no such repository at " + hub.endpoint()), std::string::npos)
      << log;
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein@v2 -o " + testing::shell_arg(out / "a.klein"),
                               &log),
            0);
  EXPECT_NE(log.find("no revision \"v2\""), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -t q3 -o " + testing::shell_arg(out / "a.klein"),
                               &log),
            0);
  EXPECT_NE(log.find("-t: unknown storage type \"q3\""), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("pull tiny-klein", &log), 0);
  EXPECT_NE(log.find("expected OWNER/NAME"), std::string::npos) << log;
  for (const auto& l : hub.log()) EXPECT_EQ(l.path.find("/resolve/"), std::string::npos) << l.path;

  // A repository without model_index.json (single files, GGUF) is pointed at convert.
  hub.files.erase("model_index.json");
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -o " + testing::shell_arg(out / "a.klein"),
                               &log),
            0);
  EXPECT_NE(log.find("acme/tiny-klein has no model_index.json"), std::string::npos) << log;
  EXPECT_NE(log.find("klein convert --diffusion-model"), std::string::npos) << log;
}

TEST(Pull, ListPrintsTheFilesAndARevisionIsAskedFor) {
  const fs::path out = testing::temp_dir("pull-list");
  FakeHub hub(testing::tiny_model(), out);
  HubEnv env(hub.endpoint(), "");
  std::string log;
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein@v1.0 --list -o " +
                                   testing::shell_arg(out / "a.klein"), &log),
            0)
      << log;
  EXPECT_NE(log.find("14 files"), std::string::npos) << log;
  EXPECT_NE(log.find("transformer/diffusion_pytorch_model.safetensors"), std::string::npos);
  EXPECT_EQ(log.find("fp16"), std::string::npos) << log;
  bool asked = false;
  for (const auto& l : hub.log()) asked |= l.path == "/acme/tiny-klein/resolve/v1.0/model_index.json";
  EXPECT_TRUE(asked);
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  EXPECT_FALSE(fs::exists(out / "a.klein.download"));
}

// A file the file list gives no hash for cannot be checked: refused by name before anything
// of it is downloaded, and before any download at all when it is model_index.json.
TEST(Pull, AFileWithoutAHashIsRefusedByNameBeforeItIsDownloaded) {
  const fs::path out = testing::temp_dir("pull-no-hash");
  FakeHub hub(testing::tiny_model(), out);
  hub.listed_hash["transformer/config.json"] = std::nullopt;
  HubEnv env(hub.endpoint(), "");
  std::string log;
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -o " + testing::shell_arg(out / "a.klein"),
                               &log),
            0);
  EXPECT_NE(log.find("error: acme/tiny-klein: transformer/config.json: the file list gives no "
                     "valid SHA-256 or git blob id (it has no \"oid\"); refusing to download a "
                     "file that cannot be checked (--no-verify allows it)"),
            std::string::npos)
      << log;
  EXPECT_EQ(fetched_files(hub), std::set<std::string>{"model_index.json"});
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  EXPECT_FALSE(fs::exists(out / "a.klein.download"));
  // --list names it and downloads nothing more.
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein --list -o " +
                                   testing::shell_arg(out / "a.klein"), &log),
            0)
      << log;
  EXPECT_NE(log.find("transformer/config.json  (no valid hash: unchecked)"), std::string::npos)
      << log;
  EXPECT_EQ(fetched_files(hub), std::set<std::string>{"model_index.json"});

  // model_index.json itself: nothing is downloaded.
  hub.listed_hash = {{"model_index.json", std::nullopt}};
  const size_t before = hub.log().size();
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein --keep-source " +
                                   testing::shell_arg(out / "kept") + " -o " +
                                   testing::shell_arg(out / "a.klein"), &log),
            0);
  EXPECT_NE(log.find("error: acme/tiny-klein: model_index.json: the file list gives no valid "
                     "SHA-256 or git blob id (it has no \"oid\"); refusing"),
            std::string::npos)
      << log;
  const auto all = hub.log();
  for (size_t i = before; i < all.size(); ++i)
    EXPECT_EQ(all[i].path.find("/resolve/"), std::string::npos) << all[i].path;
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  EXPECT_FALSE(fs::exists(out / "kept" / "tiny-klein" / "model_index.json"));
}

// A value that is not a hash (a mirror's own format, a truncated one) is refused the same way:
// every such file is named, with what was wrong.
TEST(Pull, AMalformedHashIsRefusedTheSameWay) {
  const fs::path out = testing::temp_dir("pull-bad-hash");
  FakeHub hub(testing::tiny_model(), out);
  hub.listed_hash["vae/diffusion_pytorch_model.safetensors"] = "xyz";
  hub.listed_hash["vae/config.json"] = std::string(40, 'g');
  HubEnv env(hub.endpoint(), "");
  std::string log;
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -o " + testing::shell_arg(out / "a.klein"),
                               &log),
            0);
  EXPECT_NE(log.find("acme/tiny-klein: vae/diffusion_pytorch_model.safetensors: the file list "
                     "gives no valid SHA-256 or git blob id (\"xyz\" is not 64 hex digits)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("acme/tiny-klein: vae/config.json: the file list gives no valid SHA-256 or "
                     "git blob id (\"" + std::string(40, 'g') + "\" is not 40 hex digits)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("refusing to download 2 files that cannot be checked (--no-verify allows "
                     "them)"),
            std::string::npos)
      << log;
  EXPECT_EQ(fetched_files(hub), std::set<std::string>{"model_index.json"});
  for (const auto& l : hub.log()) EXPECT_NE(l.host, "cdn") << l.path;  // not even a header
  EXPECT_FALSE(fs::exists(out / "a.klein"));
  EXPECT_FALSE(fs::exists(out / "a.klein.download"));
}

// --no-verify: the same files are downloaded unchecked, each named in a warning on stderr and
// in the JSON stream, converting while downloading and with --keep-source alike.
TEST(Pull, NoVerifyDownloadsUncheckedFilesAndWarnsForEach) {
  const fs::path out = testing::temp_dir("pull-no-verify");
  FakeHub hub(testing::tiny_model(), out);
  hub.listed_hash["vae/diffusion_pytorch_model.safetensors"] = "xyz";
  hub.listed_hash["vae/config.json"] = std::nullopt;
  HubEnv env(hub.endpoint(), "");
  std::string log, kept_log;
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein --no-verify --json -o " +
                                   testing::shell_arg(out / "a.klein"), &log),
            0)
      << log;
  for (const std::string line :
       {"warning: acme/tiny-klein: vae/diffusion_pytorch_model.safetensors: the file list gives "
        "no valid SHA-256 or git blob id (\"xyz\" is not 64 hex digits); downloaded unchecked "
        "(--no-verify)",
        "warning: acme/tiny-klein: vae/config.json: the file list gives no valid SHA-256 or git "
        "blob id (it has no \"oid\"); downloaded unchecked (--no-verify)",
        "warning: 2 of the files"})
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  std::set<std::string> warned;
  json done;
  for (const json& e : events_of(log)) {
    if (e["event"] == "warning") warned.insert(e.value("file", ""));
    if (e["event"] == "done") done = e;
  }
  EXPECT_EQ(warned, (std::set<std::string>{"vae/config.json",
                                           "vae/diffusion_pytorch_model.safetensors"}));
  ASSERT_TRUE(done.is_object()) << log;
  EXPECT_EQ(done["unchecked_files"].size(), 2u) << done.dump();
  ASSERT_EQ(testing::run_klein("pull acme/tiny-klein --no-verify -q --keep-source " +
                                   testing::shell_arg(out / "kept") + " -o " +
                                   testing::shell_arg(out / "b.klein"), &kept_log),
            0)
      << kept_log;
  EXPECT_NE(kept_log.find("warning: acme/tiny-klein: vae/config.json: "), std::string::npos)
      << kept_log;
  EXPECT_TRUE(read_file(out / "a.klein") == read_file(out / "b.klein"));
}

// The conversion plans from each weight file's header, read ahead with a range request: a
// header that differs from the start of the checked file fails the pull.
TEST(Pull, AHeaderReadAheadMustBeTheCheckedFilesHeader) {
  const fs::path out = testing::temp_dir("pull-header");
  FakeHub hub(testing::tiny_model(), out);
  const std::string file = "vae/diffusion_pytorch_model.safetensors";
  hub.lying_header = {file};
  HubEnv env(hub.endpoint(), "");
  std::string log;
  EXPECT_NE(testing::run_klein("pull acme/tiny-klein -q -o " + testing::shell_arg(out / "a.klein"),
                               &log),
            0);
  EXPECT_NE(log.find(file + ": the header read ahead ("), std::string::npos) << log;
  EXPECT_NE(log.find("differs from the start of the checked file"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "a.klein"));
}

// A Z-Image repository (the tiny one of ../shared/testdata/zimage-tiny) pulled: the container
// `klein convert` makes from the same files, and one that generates.
TEST(Pull, AZImageRepositoryMakesTheContainerConvertMakes) {
  const fs::path out = testing::temp_dir("pull-zimage");
  FakeHub hub(zimage_model(), out);
  hub.repo = "acme/tiny-zimage";
  HubEnv env(hub.endpoint(), "");
  std::string log;
  ASSERT_EQ(testing::run_klein("pull acme/tiny-zimage -t q4 -q -o " +
                                   testing::shell_arg(out / "pulled.klein"), &log),
            0)
      << log;
  const std::set<std::string> fetched = fetched_files(hub);
  EXPECT_EQ(fetched.size(), 14u);
  EXPECT_TRUE(fetched.count("transformer/diffusion_pytorch_model.safetensors"));
  EXPECT_TRUE(fetched.count("text_encoder/model-00002-of-00002.safetensors"));
  EXPECT_FALSE(fetched.count("transformer/diffusion_pytorch_model.fp16.safetensors"));
  EXPECT_FALSE(fs::exists(out / "pulled.klein.download"));
  ASSERT_EQ(testing::run_klein("convert -m " +
                                   testing::shell_arg(tiny_copy("tiny-zimage", zimage_model())) +
                                   " -t q4 -q -o " + testing::shell_arg(out / "converted.klein"),
                               &log),
            0)
      << log;
  const std::string pulled = read_file(out / "pulled.klein");
  ASSERT_GT(pulled.size(), 1000u);
  EXPECT_TRUE(pulled == read_file(out / "converted.klein"))
      << "the pulled container differs from the converted one";
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(out / "pulled.klein"), &log), 0)
      << log;
  EXPECT_NE(log.find("Z-Image"), std::string::npos) << log;
  ASSERT_EQ(testing::run_klein("generate -m " + testing::shell_arg(out / "pulled.klein") +
                                   " -p \"a red fox\" --no-cache -q --seed 3 -W 32 -H 32 -s 1 -o " +
                                   testing::shell_arg(out / "fox.png"), &log),
            0)
      << log;
  EXPECT_GT(fs::file_size(out / "fox.png"), 100u);
}

// The client on its own: a file that exists with the right bytes is kept; with other bytes
// it is fetched again.
TEST(HubClient, AnExistingFileIsCheckedNotFetchedAgain) {
  const fs::path out = testing::temp_dir("hub-client");
  FakeHub hub(testing::tiny_model(), out);
  hub::Endpoint e;
  e.url = hub.endpoint();
  const hub::Repo repo = hub::parse_repo("acme/tiny-klein");
  const auto files = hub::list_files(e, repo);
  ASSERT_EQ(files.size(), hub.files.size());
  const hub::RemoteFile* vae = nullptr;
  for (const auto& f : files)
    if (f.path == "vae/config.json") vae = &f;
  ASSERT_NE(vae, nullptr);
  EXPECT_TRUE(vae->sha256.empty());
  EXPECT_EQ(vae->git_oid.size(), 40u);
  hub::download(e, repo, *vae, out / "config.json", nullptr);
  EXPECT_EQ(read_file(out / "config.json"), hub.files.at("vae/config.json"));
  hub::download(e, repo, *vae, out / "config.json", nullptr);
  EXPECT_EQ(hub.downloads_of("/vae/config.json").size(), 1u);
  std::ofstream(out / "config.json") << "{}";
  hub::download(e, repo, *vae, out / "config.json", nullptr);
  EXPECT_EQ(hub.downloads_of("/vae/config.json").size(), 2u);
  EXPECT_EQ(read_file(out / "config.json"), hub.files.at("vae/config.json"));
}

// Without a hash, nothing matches and nothing is downloaded, unless the endpoint allows
// unchecked files: then the file is fetched each time, never kept from before.
TEST(HubClient, AFileWithoutAHashMatchesNothingAndIsRefused) {
  const fs::path out = testing::temp_dir("hub-client-no-hash");
  FakeHub hub(testing::tiny_model(), out);
  hub.listed_hash["vae/config.json"] = "not-a-hash";
  hub::Endpoint e;
  e.url = hub.endpoint();
  const hub::Repo repo = hub::parse_repo("acme/tiny-klein");
  hub::RemoteFile vae;
  for (const auto& f : hub::list_files(e, repo))
    if (f.path == "vae/config.json") vae = f;
  ASSERT_EQ(vae.path, "vae/config.json");
  EXPECT_TRUE(vae.sha256.empty() && vae.git_oid.empty());
  EXPECT_EQ(vae.hash_problem, "\"not-a-hash\" is not 40 hex digits");
  std::ofstream(out / "config.json", std::ios::binary) << hub.files.at("vae/config.json");
  std::string got;
  EXPECT_FALSE(hub::matches(vae, out / "config.json", &got));
  EXPECT_EQ(got, "no hash to check against");
  const std::string refused =
      "acme/tiny-klein: vae/config.json: the file list gives no valid SHA-256 or git blob id "
      "(\"not-a-hash\" is not 40 hex digits); refusing to download a file that cannot be "
      "checked (--no-verify allows it)";
  EXPECT_EQ(testing::error_of([&] { hub::download(e, repo, vae, out / "dl.json", nullptr); }),
            refused);
  EXPECT_EQ(testing::error_of([&] { hub::read_prefix(e, repo, vae, 8); }), refused);
  EXPECT_EQ(testing::error_of([&] {
              hub::download_in_place(e, repo, vae, out / "config.json", nullptr, nullptr);
            }),
            refused);
  EXPECT_TRUE(hub.downloads_of("/vae/config.json").empty());
  EXPECT_FALSE(fs::exists(out / "dl.json"));
  e.allow_unchecked = true;
  hub::download(e, repo, vae, out / "dl.json", nullptr);
  EXPECT_EQ(read_file(out / "dl.json"), hub.files.at("vae/config.json"));
  hub::download(e, repo, vae, out / "dl.json", nullptr);
  EXPECT_EQ(hub.downloads_of("/vae/config.json").size(), 2u);

  // An LFS file is checked by its content's SHA-256 (kept in lower case), never by the
  // pointer's blob id beside it.
  const std::string sha(64, 'A'), oid(40, 'b');
  const auto parsed = hub::parse_file_list(
      json::array({{{"type", "file"}, {"path", "a.safetensors"}, {"size", 9}, {"oid", oid},
                    {"lfs", {{"oid", sha}, {"size", 9}}}},
                   {{"type", "file"}, {"path", "b.safetensors"}, {"size", 9}, {"oid", oid},
                    {"lfs", {{"oid", "sha256:" + sha}, {"size", 9}}}},
                   {{"type", "file"}, {"path", "c.json"}, {"size", 9}, {"oid", 7}}})
          .dump(),
      repo);
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0].sha256, std::string(64, 'a'));
  EXPECT_TRUE(parsed[0].git_oid.empty() && parsed[0].hash_problem.empty());
  EXPECT_TRUE(parsed[1].sha256.empty() && parsed[1].git_oid.empty());
  EXPECT_EQ(parsed[1].hash_problem, "\"sha256:" + sha + "\" is not 64 hex digits");
  EXPECT_EQ(hub::unchecked_reason(repo, parsed[2]),
            "acme/tiny-klein: c.json: the file list gives no valid SHA-256 or git blob id (it "
            "has no \"oid\")");
  EXPECT_EQ(hub::unchecked_reason(repo, parsed[0]), "");
}

// Converted bytes are freed by punching holes; where that cannot be done, a warning names the
// file, once, and says the bytes stay. (A FIFO stands for a file system without holes.)
TEST(Arrival, BytesThatCannotBeFreedAreNamedInOneWarning) {
  const fs::path out = testing::temp_dir("arrival-no-holes");
  const fs::path fifo = out / "weights.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<std::string> warnings;
  convert::SourceArrival arrival(/*free_consumed=*/true);
  arrival.set_warning([&](const std::string& m) { warnings.push_back(m); });
  const size_t n = arrival.expect(fifo, 1 << 20);
  arrival.arrived(n, 1 << 20);
  arrival.complete(n, "0123456789abcdef");  // frees what the conversion never reads
  arrival.complete(n, "0123456789abcdef");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cannot free the converted bytes of " +
                             fs::weakly_canonical(fifo).string()),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("stay on disk until the conversion ends"), std::string::npos)
      << warnings[0];
  EXPECT_EQ(arrival.unfreed_files(), 1u);

  // A file on a file system with holes: no warning.
  const fs::path file = out / "plain.safetensors";
  {
    std::ofstream(file, std::ios::binary) << std::string(1 << 20, 'x');
  }
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const bool holes = ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0;
  ::close(fd);
  if (!holes) GTEST_SKIP() << "the temporary directory's file system has no holes";
  warnings.clear();
  convert::SourceArrival plain(/*free_consumed=*/true);
  plain.set_warning([&](const std::string& m) { warnings.push_back(m); });
  plain.complete(plain.expect(file, 1 << 20), "0123456789abcdef");
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(plain.unfreed_files(), 0u);
  EXPECT_GT(plain.freed_bytes(), 0u);
}

}  // namespace
}  // namespace klein
