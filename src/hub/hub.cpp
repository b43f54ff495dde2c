// The Hub client of hub.h: libcurl for HTTP, OpenSSL's EVP digests for the checks.
#include "hub/hub.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/version.h"

namespace klein::hub {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- hashes ------------------------------------------------------------------------------

class Digest {
 public:
  explicit Digest(const EVP_MD* md) : ctx_(EVP_MD_CTX_new()) {
    check(ctx_ && EVP_DigestInit_ex(ctx_, md, nullptr) == 1, "cannot start a hash");
  }
  ~Digest() { EVP_MD_CTX_free(ctx_); }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void update(const void* data, size_t n) { EVP_DigestUpdate(ctx_, data, n); }
  std::string hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, out, &n);
    static const char* digits = "0123456789abcdef";
    std::string s;
    for (unsigned i = 0; i < n; ++i) {
      s += digits[out[i] >> 4];
      s += digits[out[i] & 15];
    }
    return s;
  }

 private:
  EVP_MD_CTX* ctx_;
};

bool has_hash(const RemoteFile& f) { return !f.sha256.empty() || !f.git_oid.empty(); }

// The digest a file is checked with: SHA-256 of the content for LFS files, else git's blob id
// (nullptr for a file that has neither).
std::unique_ptr<Digest> start_digest(const RemoteFile& f) {
  if (!f.sha256.empty()) return std::make_unique<Digest>(EVP_sha256());
  if (f.git_oid.empty()) return nullptr;
  auto d = std::make_unique<Digest>(EVP_sha1());
  const std::string header = "blob " + std::to_string(f.size) + std::string(1, '\0');
  d->update(header.data(), header.size());
  return d;
}

const std::string& expected_hash(const RemoteFile& f) {
  return f.sha256.empty() ? f.git_oid : f.sha256;
}

// Feeds the first `bytes` of `path` to the digest.
void hash_file(Digest& d, const fs::path& path, uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot read ", path.string());
  std::vector<char> buf(1 << 20);
  while (bytes > 0) {
    const size_t n = size_t(std::min<uint64_t>(bytes, buf.size()));
    in.read(buf.data(), std::streamsize(n));
    check(size_t(in.gcount()) == n, "cannot read ", path.string());
    d.update(buf.data(), n);
    bytes -= n;
  }
}

// ---- HTTP --------------------------------------------------------------------------------

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

std::string escape_path(const std::string& s, bool keep_slashes) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slashes && c == '/'))
      out += char(c);
    else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

std::string trim_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// One HTTP GET: the final response's status, headers and (for non-downloads) body.
struct Response {
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names, of the last response
  std::string body;                            // error bodies and API replies
};

class Request {
 public:
  Request(const Endpoint& e, const std::string& url) : url_(url) {
    static CurlGlobal global;
    curl_ = curl_easy_init();
    check(curl_ != nullptr, "cannot start an HTTP transfer (libcurl)");
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl_, CURLOPT_MAXREDIRS, 10L);
    // libcurl sends a custom Authorization header to the first host only, never to the
    // content host a redirect leads to.
    curl_easy_setopt(curl_, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_TIME, e.stall_seconds);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    const std::string agent = std::string("klein-edge/") + KLEIN_VERSION;
    curl_easy_setopt(curl_, CURLOPT_USERAGENT, agent.c_str());
    curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, &Request::on_header);
    curl_easy_setopt(curl_, CURLOPT_HEADERDATA, this);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &Request::on_body);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, this);
    if (!e.token.empty()) header("Authorization: Bearer " + e.token);
  }
  ~Request() {
    curl_slist_free_all(headers_);
    curl_easy_cleanup(curl_);
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  void header(const std::string& h) { headers_ = curl_slist_append(headers_, h.c_str()); }

  // Body bytes of a successful final response go to sink (when set); error bodies and
  // replies without a sink are kept in the Response (at most 64 KiB).
  std::function<bool(const char*, size_t, long status)> sink;

  CURLcode perform(Response& r) {
    response_ = &r;
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error_);
    error_[0] = '\0';
    const CURLcode code = curl_easy_perform(curl_);
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &r.status);
    return code;
  }
  std::string error(CURLcode code) const {
    return error_[0] ? std::string(error_) : std::string(curl_easy_strerror(code));
  }
  const std::string& url() const { return url_; }

 private:
  static size_t on_header(char* data, size_t size, size_t n, void* self) {
    auto& r = *static_cast<Request*>(self);
    std::string line(data, size * n);
    if (line.rfind("HTTP/", 0) == 0) r.response_->headers.clear();  // a new response
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
      while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) value.pop_back();
      r.response_->headers[name] = value;
    }
    return size * n;
  }
  static size_t on_body(char* data, size_t size, size_t n, void* self) {
    auto& r = *static_cast<Request*>(self);
    long status = 0;
    curl_easy_getinfo(r.curl_, CURLINFO_RESPONSE_CODE, &status);
    if (r.sink && status >= 200 && status < 300)
      return r.sink(data, size * n, status) ? size * n : 0;
    // API replies are kept whole (up to 64 MiB), error pages only their start.
    const size_t cap = status >= 200 && status < 300 ? size_t(64) << 20 : size_t(64) << 10;
    std::string& body = r.response_->body;
    if (status >= 200 && status < 300 && body.size() + size * n > cap) return 0;
    body.append(data, std::min(size * n, cap - std::min(body.size(), cap)));
    return size * n;
  }

  CURL* curl_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string url_;
  Response* response_ = nullptr;
  char error_[CURL_ERROR_SIZE] = {};
};

// The error for a failed response, in the Hub's terms where its headers give them.
[[noreturn]] void fail_response(const Endpoint& e, const Repo& repo, const Request& q,
                                const Response& r, const std::string& what) {
  auto header = [&](const char* name) {
    auto it = r.headers.find(name);
    return it == r.headers.end() ? std::string() : it->second;
  };
  const std::string code = header("x-error-code");
  std::string message = header("x-error-message");
  if (message.empty() && !r.body.empty() && r.body.size() < 500) {
    const json j = json::parse(r.body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_string())
      message = j["error"].get<std::string>();
  }
  const std::string status = "HTTP " + std::to_string(r.status);
  if (code == "GatedRepo" || ((r.status == 401 || r.status == 403) &&
                              message.find("gated") != std::string::npos))
    fail(repo.id, " is a gated repository (", status, "): open ", repo.page(e),
         ", accept its licence with your Hub account, and set HF_TOKEN to an access token of "
         "that account (", trim_slash(e.url), "/settings/tokens)",
         e.token.empty() ? "; no token was given" : "; the token given has no access yet");
  if (code == "RevisionNotFound")
    fail(repo.id, ": no revision \"", repo.revision, "\" (", status, ")");
  if (code == "EntryNotFound") fail(repo.id, ": no file ", what, " (", status, ")");
  if (code == "RepoNotFound" || r.status == 401 || (r.status == 404 && what.empty()))
    fail(repo.id, ": no such repository at ", trim_slash(e.url), " (", status,
         "), or it is private", e.token.empty() ? ": set HF_TOKEN for a private repository"
                                                : " and the token has no access");
  fail("GET ", q.url(), ": ", status, message.empty() ? "" : ": " + message);
}

bool worth_retrying(CURLcode code) {
  switch (code) {
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

std::string api_url(const Endpoint& e, const Repo& repo) {
  return trim_slash(e.url) + "/api/models/" + repo.id + "/tree/" +
         escape_path(repo.revision, false) + "?recursive=true";
}

std::string file_url(const Endpoint& e, const Repo& repo, const std::string& path) {
  return trim_slash(e.url) + "/" + repo.id + "/resolve/" + escape_path(repo.revision, false) +
         "/" + escape_path(path, true);
}

std::string read_token_file() {
  const char* home = std::getenv("HF_HOME");
  fs::path file;
  if (home && *home)
    file = fs::path(home) / "token";
  else if (const char* user = std::getenv("HOME"))
    file = fs::path(user) / ".cache" / "huggingface" / "token";
  std::ifstream in(file);
  std::string token;
  if (in) std::getline(in, token);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  return token;
}

bool is_hex(const std::string& s, size_t length) {
  if (s.size() != length) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A listed value for an error message: quoted, its start only, unprintable bytes as '?'.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 72; ++i)
    out += std::isprint(static_cast<unsigned char>(s[i])) ? s[i] : '?';
  return out + (s.size() > 72 ? "...\"" : "\"");
}

}  // namespace

// ---- endpoint and repository -------------------------------------------------------------

Endpoint Endpoint::from_environment() {
  Endpoint e;
  if (const char* url = std::getenv("HF_ENDPOINT"); url && *url) e.url = url;
  if (const char* token = std::getenv("HF_TOKEN"); token && *token)
    e.token = token;
  else
    e.token = read_token_file();
  return e;
}

std::string Repo::name() const { return id.substr(id.find('/') + 1); }

std::string Repo::page(const Endpoint& e) const { return trim_slash(e.url) + "/" + id; }

Repo parse_repo(const std::string& text) {
  Repo r;
  const size_t at = text.find('@');
  r.id = text.substr(0, at);
  if (at != std::string::npos) r.revision = text.substr(at + 1);
  const size_t slash = r.id.find('/');
  const bool shape_ok = slash != std::string::npos && slash > 0 && slash + 1 < r.id.size() &&
                        r.id.find('/', slash + 1) == std::string::npos;
  bool chars_ok = true;
  for (char c : r.id)
    chars_ok = chars_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                            c == '.' || c == '/');
  check(shape_ok && chars_ok && r.id.find("..") == std::string::npos,
        "repository \"", text, "\": expected OWNER/NAME or OWNER/NAME@REVISION, e.g. "
        "black-forest-labs/FLUX.2-klein-4B");
  check(!r.revision.empty(), "repository \"", text, "\": empty revision after @");
  return r;
}

// ---- listing and choosing ----------------------------------------------------------------

// The URL of a `Link: <URL>; rel="next"` header, or "".
std::string next_link(const std::string& link) {
  size_t pos = 0;
  while ((pos = link.find('<', pos)) != std::string::npos) {
    const size_t end = link.find('>', pos);
    if (end == std::string::npos) break;
    const size_t next_part = link.find(',', end);
    const std::string params = link.substr(end + 1, next_part == std::string::npos
                                                        ? std::string::npos
                                                        : next_part - end - 1);
    if (params.find("rel=\"next\"") != std::string::npos ||
        params.find("rel=next") != std::string::npos)
      return link.substr(pos + 1, end - pos - 1);
    pos = end;
  }
  return "";
}

std::vector<RemoteFile> parse_file_list(const std::string& body, const Repo& repo) {
  std::vector<RemoteFile> files;
  const json list = json::parse(body, nullptr, false);
  check(list.is_array(), repo.id, ": the file list from the Hub is not a JSON array");
  auto text = [](const json& o, const char* key) {
    const auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto count = [&](const json& o, const char* key, uint64_t fallback) {
    const auto it = o.find(key);
    return it != o.end() && it->is_number_unsigned() ? it->get<uint64_t>() : fallback;
  };
  for (const json& item : list) {
    if (!item.is_object() || text(item, "type") != "file") continue;
    RemoteFile f;
    f.path = text(item, "path");
    // Names become files under the download folder: plain relative paths only.
    bool plain = !f.path.empty() && f.path.front() != '/' && f.path.back() != '/' &&
                 f.path.find('\\') == std::string::npos && f.path.find('\0') == std::string::npos;
    for (size_t at = 0; plain && at <= f.path.size();) {
      const size_t slash = std::min(f.path.find('/', at), f.path.size());
      const std::string part = f.path.substr(at, slash - at);
      plain = !part.empty() && part != "." && part != "..";
      at = slash + 1;
    }
    check(plain, repo.id, ": the file list names an unusable path \"", f.path, "\"");
    f.size = count(item, "size", 0);
    // A file in LFS is checked by the SHA-256 of its content only: its "oid" is the blob id
    // of the pointer file git holds. A value that is not a hash is kept as the reason the
    // file cannot be checked, never dropped in silence.
    if (const auto lfs = item.find("lfs"); lfs != item.end() && lfs->is_object()) {
      const std::string sha256 = text(*lfs, "oid");
      f.size = count(*lfs, "size", f.size);
      if (is_hex(sha256, 64))
        f.sha256 = lower(sha256);
      else
        f.hash_problem = sha256.empty() ? "its \"lfs\" entry has no \"oid\""
                                        : quoted(sha256) + " is not 64 hex digits";
    } else {
      const std::string oid = text(item, "oid");
      if (is_hex(oid, 40))
        f.git_oid = lower(oid);
      else
        f.hash_problem = oid.empty() ? "it has no \"oid\"" : quoted(oid) + " is not 40 hex digits";
    }
    files.push_back(std::move(f));
  }
  return files;
}

std::vector<RemoteFile> list_files(const Endpoint& e, const Repo& repo) {
  std::vector<RemoteFile> files;
  std::string url = api_url(e, repo);
  for (int page = 0; !url.empty(); ++page) {
    check(page < 1000, repo.id, ": the file list does not end (over 1000 pages)");
    Request q(e, url);
    Response r;
    const CURLcode code = q.perform(r);
    check(code == CURLE_OK, "cannot list ", repo.id, " at ", trim_slash(e.url), ": ",
          q.error(code));
    if (r.status != 200) fail_response(e, repo, q, r, "");
    for (RemoteFile& f : parse_file_list(r.body, repo)) files.push_back(std::move(f));
    url = next_link(r.headers.count("link") ? r.headers.at("link") : "");
  }
  return files;
}

std::vector<RemoteFile> files_for_conversion(const std::vector<RemoteFile>& files,
                                             const std::string& model_index, const Repo& repo) {
  const json index = json::parse(model_index, nullptr, false);
  check(index.is_object(), repo.id, ": model_index.json is not a JSON object");
  // Components are the entries ["library", "Class"]; "_class_name" and the like are not.
  std::set<std::string> components;
  for (const auto& [key, value] : index.items())
    if (!key.empty() && key[0] != '_' && value.is_array() && value.size() == 2 &&
        value[1].is_string())
      components.insert(key);
  check(!components.empty(), repo.id, ": model_index.json names no components");

  auto suffix = [](const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  auto is_variant = [](const std::string& name) {
    for (const char* v : {".fp16.", ".fp16-", ".bf16.", ".bf16-", ".fp32.", ".fp32-"})
      if (name.find(v) != std::string::npos) return true;
    return name.find(".index.fp16.json") != std::string::npos ||
           name.find(".index.bf16.json") != std::string::npos;
  };
  std::map<std::string, std::vector<const RemoteFile*>> by_folder;
  std::vector<RemoteFile> chosen;
  for (const RemoteFile& f : files) {
    if (f.path == "model_index.json") {
      chosen.push_back(f);
      continue;
    }
    const size_t slash = f.path.find('/');
    if (slash == std::string::npos || f.path.find('/', slash + 1) != std::string::npos) continue;
    if (!components.count(f.path.substr(0, slash))) continue;
    const std::string name = f.path.substr(slash + 1);
    if (suffix(name, ".json") || suffix(name, ".txt") || suffix(name, ".jinja") ||
        suffix(name, ".safetensors"))
      by_folder[f.path.substr(0, slash)].push_back(&f);
  }
  for (const auto& [folder, list] : by_folder) {
    bool has_plain_weights = false;
    for (const RemoteFile* f : list)
      has_plain_weights |= suffix(f->path, ".safetensors") && !is_variant(f->path);
    for (const RemoteFile* f : list)
      if (!(has_plain_weights && is_variant(f->path))) chosen.push_back(*f);
  }
  return chosen;
}

// ---- downloading -------------------------------------------------------------------------

std::string unchecked_reason(const Repo& repo, const RemoteFile& file) {
  if (has_hash(file)) return "";
  return repo.id + ": " + file.path + ": the file list gives no valid SHA-256 or git blob id (" +
         (file.hash_problem.empty() ? "none is given" : file.hash_problem) + ")";
}

bool matches(const RemoteFile& file, const fs::path& path, std::string* got) {
  std::unique_ptr<Digest> d = start_digest(file);
  if (!d) {  // nothing to check against: no match
    if (got) *got = "no hash to check against";
    return false;
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != file.size) {
    if (got) *got = ec ? "no file" : std::to_string(size) + " bytes";
    return false;
  }
  hash_file(*d, path, size);
  const std::string hex = d->hex();
  if (got) *got = hex;
  return hex == expected_hash(file);
}

namespace {

// Where a transfer's bytes go, attempt after attempt: appended to a part file (download), or
// written in place into a file of the right size (download_in_place).
class Sink {
 public:
  virtual ~Sink() = default;
  // Starts an attempt; the bytes kept so far (the next attempt asks for the rest).
  virtual uint64_t begin_attempt() = 0;
  // The server ignored the range: the whole file follows, from byte 0.
  virtual void restart() = 0;
  virtual bool write(const char* data, size_t n) = 0;  // false: it could not be written
  virtual bool end_attempt() = 0;                       // false: it could not be written
  virtual void discard() = 0;  // what is kept is not a prefix of this file
  virtual std::string where() const = 0;
};

class PartFile final : public Sink {
 public:
  explicit PartFile(fs::path part) : part_(std::move(part)) {}
  uint64_t begin_attempt() override {
    std::error_code ec;
    uint64_t have = fs::exists(part_, ec) ? fs::file_size(part_, ec) : 0;
    out_.reset(std::fopen(part_.c_str(), have ? "ab" : "wb"));
    check(out_ != nullptr, "cannot write ", part_.string(), ": ", std::strerror(errno));
    return have;
  }
  void restart() override {
    std::fflush(out_.get());
    check(::ftruncate(::fileno(out_.get()), 0) == 0, "cannot truncate ", part_.string());
    std::fseek(out_.get(), 0, SEEK_SET);
  }
  bool write(const char* data, size_t n) override {
    return std::fwrite(data, 1, n, out_.get()) == n;
  }
  bool end_attempt() override {
    const bool ok = std::fflush(out_.get()) == 0;
    out_.reset();
    return ok;
  }
  void discard() override {
    out_.reset();
    std::error_code ec;
    fs::remove(part_, ec);
  }
  std::string where() const override { return part_.string(); }

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  fs::path part_;
  std::unique_ptr<std::FILE, Close> out_;
};

class InPlace final : public Sink {
 public:
  InPlace(const RemoteFile& file, const fs::path& dest, const ByteFn& on_bytes)
      : file_(file), dest_(dest), on_bytes_(on_bytes), digest_(start_digest(file)) {
    fd_ = ::open(dest.c_str(), O_WRONLY);
    check(fd_ >= 0, "cannot write ", dest.string(), ": ", std::strerror(errno));
    struct stat st {};
    check(::fstat(fd_, &st) == 0 && uint64_t(st.st_size) == file.size, "internal: ",
          dest.string(), " is not of the size of ", file.path);
  }
  ~InPlace() override { ::close(fd_); }
  uint64_t begin_attempt() override { return have_; }
  void restart() override { discard(); }
  bool write(const char* data, size_t n) override {
    for (size_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(fd_, data + done, n - done, off_t(have_ + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += size_t(w);
    }
    if (digest_) digest_->update(data, n);
    if (on_bytes_) on_bytes_(data, n, have_);
    have_ += n;
    return true;
  }
  bool end_attempt() override { return true; }
  void discard() override {
    have_ = 0;
    digest_ = start_digest(file_);
  }
  std::string where() const override { return dest_.string(); }
  std::string hex() { return digest_ ? digest_->hex() : std::string(); }

 private:
  const RemoteFile& file_;
  fs::path dest_;
  const ByteFn& on_bytes_;
  std::unique_ptr<Digest> digest_;
  int fd_ = -1;
  uint64_t have_ = 0;
};

// GET the file into the sink: resumed with a Range request after a dropped connection (up to
// endpoint.attempts), progress as bytes arrive, a clear error for everything else.
void transfer(const Endpoint& e, const Repo& repo, const RemoteFile& file, Sink& sink,
              const TransferFn& progress, const std::atomic<bool>* cancel) {
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  uint64_t this_run = 0;
  double delay = e.retry_delay;
  std::string last_error;
  for (int attempt = 1;; ++attempt) {
    check(!(cancel && *cancel), "download of ", file.path, " cancelled");
    uint64_t have = sink.begin_attempt();
    if (have > file.size) {  // not a prefix of this file
      sink.end_attempt();
      sink.discard();
      have = sink.begin_attempt();
    }
    if (have == file.size && file.size > 0) {  // complete; checked by the caller
      sink.end_attempt();
      break;
    }
    Request q(e, file_url(e, repo, file.path));
    if (have > 0) q.header("Range: bytes=" + std::to_string(have) + "-");
    uint64_t on_disk = have;
    bool first = true, write_failed = false, too_long = false;
    auto last_report = std::chrono::steady_clock::now();
    q.sink = [&](const char* data, size_t n, long status) {
      if (cancel && *cancel) return false;
      if (first) {
        first = false;
        if (have > 0 && status == 200) {  // the range was ignored: the whole file follows
          sink.restart();
          on_disk = 0;
        }
      }
      if (on_disk + n > file.size) {  // more than the listed size
        too_long = true;
        return false;
      }
      if (!sink.write(data, n)) {
        write_failed = true;
        return false;
      }
      on_disk += n;
      this_run += n;
      const auto now = std::chrono::steady_clock::now();
      if (progress && now - last_report > std::chrono::milliseconds(250)) {
        last_report = now;
        progress({&file, on_disk, this_run, seconds()});
      }
      return true;
    };
    Response r;
    const CURLcode code = q.perform(r);
    const bool flushed = sink.end_attempt();
    check(!write_failed && flushed, "cannot write ", sink.where(), ": ", std::strerror(errno),
          " (is the disk full?)");
    check(!(cancel && *cancel), "download of ", file.path, " cancelled");
    if (code == CURLE_OK && r.status == 416 && have > 0) {  // the range starts past the end
      sink.discard();
      continue;
    }
    // A server error (5xx) is retried like a dropped connection; others say what is wrong.
    if (code == CURLE_OK && r.status >= 400 && (r.status < 500 || attempt >= e.attempts))
      fail_response(e, repo, q, r, file.path);
    if (code == CURLE_OK && on_disk == file.size) break;
    if (too_long) {
      sink.discard();
      fail("cannot download ", file.path, ": the server sent more than the ", file.size,
           " bytes the file list gives");
    }
    last_error = code == CURLE_OK && r.status >= 500 ? "HTTP " + std::to_string(r.status)
                 : code == CURLE_OK ? "the transfer ended after " + std::to_string(on_disk) +
                                        " of " + std::to_string(file.size) + " bytes"
                                  : q.error(code);
    check(code == CURLE_OK || worth_retrying(code), "cannot download ", file.path, " from ",
          trim_slash(e.url), ": ", last_error);
    check(attempt < e.attempts, "cannot download ", file.path, " after ", attempt,
          " attempts: ", last_error, " (run again to resume from ", on_disk, " bytes)");
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    delay *= 2;
  }
  if (progress) progress({&file, file.size, this_run, seconds()});
}

[[noreturn]] void fail_hash(const RemoteFile& file, const std::string& got,
                            const std::string& then) {
  fail(file.path, ": the downloaded bytes do not match the repository's ",
       file.sha256.empty() ? "git blob id " : "SHA-256 ", expected_hash(file), " (got ", got,
       "); ", then);
}

// A file without a hash is fetched only when the endpoint allows unchecked files.
void refuse_unchecked(const Endpoint& e, const Repo& repo, const RemoteFile& file) {
  const std::string why = unchecked_reason(repo, file);
  if (!why.empty() && !e.allow_unchecked)
    fail(why, "; refusing to download a file that cannot be checked (--no-verify allows it)");
}

}  // namespace

void download(const Endpoint& e, const Repo& repo, const RemoteFile& file, const fs::path& dest,
              const TransferFn& progress, const std::atomic<bool>* cancel) {
  refuse_unchecked(e, repo, file);
  const bool checked = has_hash(file);
  std::error_code ec;
  if (fs::exists(dest, ec)) {
    std::string got;
    if (checked && matches(file, dest, &got)) {
      if (progress) progress({&file, file.size, 0, 0});
      return;
    }
    fs::remove(dest, ec);  // an earlier run's file that is not this one
  }
  fs::create_directories(dest.parent_path(), ec);
  const fs::path part = dest.string() + ".part";
  PartFile sink(part);
  transfer(e, repo, file, sink, progress, cancel);
  std::string got;
  if (checked && !matches(file, part, &got)) {
    fs::remove(part, ec);
    fail_hash(file, got, "the partial file was removed, run again to download it afresh");
  }
  fs::rename(part, dest, ec);
  check(!ec, "cannot rename ", part.string(), " to ", dest.string(), ": ", ec.message());
}

void download_in_place(const Endpoint& e, const Repo& repo, const RemoteFile& file,
                       const fs::path& dest, const ByteFn& on_bytes, const TransferFn& progress,
                       const std::atomic<bool>* cancel) {
  refuse_unchecked(e, repo, file);
  InPlace sink(file, dest, on_bytes);
  transfer(e, repo, file, sink, progress, cancel);
  if (!has_hash(file)) return;  // allowed unchecked
  const std::string got = sink.hex();
  if (got != expected_hash(file)) fail_hash(file, got, "nothing was written from them");
}

std::string read_prefix(const Endpoint& e, const Repo& repo, const RemoteFile& file,
                        uint64_t n) {
  refuse_unchecked(e, repo, file);
  n = std::min(n, file.size);
  std::string out;
  for (int attempt = 1;; ++attempt) {
    out.clear();
    if (n == 0) return out;
    Request q(e, file_url(e, repo, file.path));
    q.header("Range: bytes=0-" + std::to_string(n - 1));
    // A server that ignores the range sends the whole file: the transfer stops at n bytes.
    q.sink = [&](const char* data, size_t size, long) {
      out.append(data, std::min<uint64_t>(size, n - out.size()));
      return out.size() < n;
    };
    Response r;
    const CURLcode code = q.perform(r);
    if (out.size() == n) return out;
    if (code == CURLE_OK && r.status >= 400 && (r.status < 500 || attempt >= e.attempts))
      fail_response(e, repo, q, r, file.path);
    const std::string why = code == CURLE_OK ? "HTTP " + std::to_string(r.status) + ", " +
                                                   std::to_string(out.size()) + " bytes"
                                             : q.error(code);
    check(code == CURLE_OK || worth_retrying(code), "cannot read the first ", n, " bytes of ",
          file.path, ": ", why);
    check(attempt < e.attempts, "cannot read the first ", n, " bytes of ", file.path, " after ",
          attempt, " attempts: ", why);
    std::this_thread::sleep_for(std::chrono::duration<double>(e.retry_delay));
  }
}

}  // namespace klein::hub
