#pragma once
// The Hugging Face Hub as `klein pull` needs it: a repository's file list, the choice of the
// files a conversion reads, and resumable, verified downloads. Knows URLs, headers and files,
// not models. HTTP is libcurl; the hashes are OpenSSL's.
//
//   GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true   the file list (JSON,
//       paged by a `Link: <...>; rel="next"` header): path, size, the git blob id ("oid") and,
//       for files in LFS, "lfs": {"oid": SHA-256 of the content, "size"}
//   GET {endpoint}/{repo}/resolve/{revision}/{path}                   a file's bytes (large
//       files redirect to a content host; the token is sent to the endpoint's host only)
//
// Errors: 401/403 with "X-Error-Code: GatedRepo" is a gated repository (the message names its
// licence page), other 401/404 a repository that does not exist or is private,
// "RevisionNotFound" and "EntryNotFound" what they say.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace klein::hub {

struct Endpoint {
  std::string url = "https://huggingface.co";  // HF_ENDPOINT: a mirror
  std::string token;                           // HF_TOKEN: for gated and private repositories
  int attempts = 6;          // per file: a dropped connection is resumed this many times in all
  long stall_seconds = 60;   // a transfer that receives nothing for this long is dropped
  double retry_delay = 1.0;  // seconds before the first retry, doubling after each
  // A file the file list gives no valid hash for (RemoteFile::hash_problem) cannot be
  // checked: the downloads below refuse it unless this is set (klein pull --no-verify), and
  // then write its bytes unchecked.
  bool allow_unchecked = false;

  // HF_ENDPOINT and HF_TOKEN (or the token file huggingface-cli login writes, $HF_HOME/token
  // or ~/.cache/huggingface/token) from the environment.
  static Endpoint from_environment();
};

struct Repo {
  std::string id;                 // "owner/name"
  std::string revision = "main";  // a branch, tag or commit
  std::string name() const;       // "name"
  std::string page(const Endpoint& e) const;  // the repository's web page
};

// "owner/name" or "owner/name@revision"; a clear error for anything else.
Repo parse_repo(const std::string& text);

struct RemoteFile {
  std::string path;     // in the repository, '/'-separated
  uint64_t size = 0;
  std::string sha256;   // files in LFS: the SHA-256 of the content (hex)
  std::string git_oid;  // files not in LFS: the git blob id, SHA-1 of "blob SIZE\0" and the
                        // content (hex; an LFS file's "oid" is its pointer's, not kept)
  // Empty when the file has one of the two; else why it has none ("\"xyz\" is not 64 hex
  // digits", "it has no \"oid\""): such a file cannot be checked.
  std::string hash_problem;
};

// For a file that cannot be checked, "REPO: PATH: the file list gives no valid SHA-256 or git
// blob id (WHY)"; "" for a file that can.
std::string unchecked_reason(const Repo& repo, const RemoteFile& file);

std::vector<RemoteFile> list_files(const Endpoint& endpoint, const Repo& repo);

// One page of the file-list API (a JSON array), and the next page's URL from a Link header
// ("" when there is none): the parsers of what the Hub sends, apart for fuzzing. Hashes are
// kept in lower case; a missing or malformed one is recorded in hash_problem.
std::vector<RemoteFile> parse_file_list(const std::string& body, const Repo& repo);
std::string next_link(const std::string& link_header);

// The files `klein convert` reads from a diffusers repository: model_index.json and, in each
// component folder it names, the configuration, tokenizer and safetensors files (precision
// variants such as *.fp16.safetensors only when the plain files are absent). model_index is
// the text of model_index.json. Throws when the repository is not in the diffusers layout.
std::vector<RemoteFile> files_for_conversion(const std::vector<RemoteFile>& files,
                                             const std::string& model_index, const Repo& repo);

struct Transfer {
  const RemoteFile* file;
  uint64_t done = 0;          // bytes of the file on disk, resumed ones included
  uint64_t this_run = 0;      // bytes received by this call
  double seconds = 0;         // since the call began
};
using TransferFn = std::function<void(const Transfer&)>;

// Downloads `file` to `dest`. The bytes go to dest + ".part", which a later call resumes with
// an HTTP Range request (from the start when the server ignores the range); a dropped
// connection is resumed the same way, up to endpoint.attempts. The whole file is checked
// against its SHA-256 (or git blob id) and then renamed to dest; a mismatch removes the part
// file and throws, naming both hashes. A dest that exists with the right size is checked
// and kept. A file without a hash is refused before any byte is fetched (with
// endpoint.allow_unchecked: fetched afresh, never kept from an earlier run, and unchecked).
// progress is called as bytes arrive (at most a few times a second); cancel stops the
// transfer (the part file stays for a resume).
void download(const Endpoint& endpoint, const Repo& repo, const RemoteFile& file,
              const std::filesystem::path& dest, const TransferFn& progress,
              const std::atomic<bool>* cancel = nullptr);

// Every byte of a file once, in order: `offset` is where `data` starts in the file. A
// transfer that starts over (a server that ignores a range) begins again at offset 0.
using ByteFn = std::function<void(const char* data, size_t n, uint64_t offset)>;

// Downloads `file` into `dest`, which exists already with the file's size (klein pull
// converts the part that has arrived while the rest comes): the bytes are written in
// place, in order from the start, and handed to on_bytes once written. A dropped
// connection is resumed with a Range request as download() does; the whole stream is
// checked against the SHA-256 (or git blob id) as it passes, and a mismatch throws after
// the last byte. A file without a hash is refused as download() refuses it. A failed or
// cancelled call leaves dest as it is (not resumable by a later call: the caller knows how
// far it got from on_bytes).
void download_in_place(const Endpoint& endpoint, const Repo& repo, const RemoteFile& file,
                       const std::filesystem::path& dest, const ByteFn& on_bytes,
                       const TransferFn& progress, const std::atomic<bool>* cancel = nullptr);

// The first n bytes of `file` (a Range request; fewer when the file is shorter), e.g. a
// safetensors header before the file itself is fetched. Not checked here (the caller
// compares them with the checked download); a file without a hash is refused as above.
std::string read_prefix(const Endpoint& endpoint, const Repo& repo, const RemoteFile& file,
                        uint64_t n);

// Whether a file on disk has the size and the hash `download` checks it against; got is what
// was found. False for a RemoteFile that has neither hash: nothing matches what cannot be
// checked. Exposed for tests and for checking a kept download.
bool matches(const RemoteFile& file, const std::filesystem::path& path, std::string* got);

}  // namespace klein::hub
