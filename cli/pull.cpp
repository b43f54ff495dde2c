// klein pull: a diffusers repository on the Hugging Face Hub -> one klein container. Lists
// the repository (src/hub), downloads the files a conversion reads (checked against the
// repository's hashes; a file the list gives no hash for is refused, or with --no-verify
// named in a warning) and converts them as `klein convert` does: while they arrive, freeing
// what is stored (convert/arrival.h), or after a --keep-source download that resumes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <cstring>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/convert_run.h"
#include "convert/arrival.h"
#include "convert/convert.h"
#include "convert/policy.h"
#include "core/error.h"
#include "formats/container/format.h"
#include "formats/safetensors.h"
#include "formats/xxh3.h"
#include "hub/hub.h"
#include "weights/family.h"

namespace klein::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct PullArgs {
  std::string repo;
  std::string type = "q4";
  std::string output;
  std::string keep_source;
  std::string policy;
  int threads = 0;
  bool list = false;
  bool keep_llm = false;
  bool json = false;
  bool quiet = false;
  bool no_verify = false;
};

std::string size_text(double bytes) {
  char buf[32];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

std::string duration_text(double seconds) {
  char buf[32];
  const long s = long(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

void emit(const json& event) {
  std::printf("%s\n", event.dump().c_str());
  std::fflush(stdout);
}

// Progress over all the files: bytes, rate and ETA, on one line of a terminal (rewritten in
// place), as a line per finished file otherwise, or as JSON events. While files are
// converted as they arrive, the line also says how many units are stored. Called from the
// downloading and the converting thread.
class PullProgress {
 public:
  PullProgress(const PullArgs& a, uint64_t total) : a_(a), total_(total) {
    tty_ = ::isatty(STDERR_FILENO) != 0;
  }
  void file(const hub::Transfer& t, size_t index, size_t count, uint64_t done_before) {
    const std::lock_guard lock(mutex_);
    const uint64_t done = done_before + t.done;
    received_ += t.this_run - last_this_run_;
    last_this_run_ = t.this_run;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = elapsed > 0 ? double(received_) / elapsed : 0;
    const double eta = rate > 0 ? double(total_ - done) / rate : 0;
    const bool finished = t.done == t.file->size;
    if (a_.json) {
      emit({{"event", "download"}, {"file", t.file->path}, {"file_done", t.done},
            {"file_size", t.file->size}, {"done", done}, {"total", total_},
            {"bytes_per_second", rate}, {"eta_seconds", eta}, {"finished", finished}});
      return;
    }
    if (a_.quiet) return;
    char line[512];
    std::snprintf(line, sizeof line, "[%zu/%zu] %-48s %9s / %-9s  %6.1f MB/s  ETA %s",
                  index + 1, count, t.file->path.c_str(), size_text(double(done)).c_str(),
                  size_text(double(total_)).c_str(), rate / 1e6, duration_text(eta).c_str());
    line_ = line;
    if (tty_)
      show();
    else if (finished)
      std::fprintf(stderr, "%s\n", line);
  }
  void next_file() {
    const std::lock_guard lock(mutex_);
    last_this_run_ = 0;
  }
  // A unit stored by a conversion that runs while the files arrive.
  void converted(const convert::ConvertProgress& p) {
    const std::lock_guard lock(mutex_);
    if (a_.json) {
      emit({{"event", "convert"}, {"unit", p.unit}, {"units", p.units}, {"name", p.name},
            {"written_bytes", p.written_bytes}});
      return;
    }
    if (a_.quiet) return;
    units_ = "  stored " + std::to_string(p.unit) + "/" + std::to_string(p.units) + " units";
    if (tty_)
      show();
    else
      std::fprintf(stderr, "stored [%zu/%zu] %s\n", p.unit, p.units, p.name.c_str());
  }
  // A warning line on stderr (after the progress line, which is shown again), and an event.
  void warn(const std::string& message) {
    const std::lock_guard lock(mutex_);
    if (a_.json) emit({{"event", "warning"}, {"message", message}});
    if (tty_ && !a_.quiet && !a_.json && !line_.empty()) std::fprintf(stderr, "\n");
    std::fprintf(stderr, "warning: %s\n", message.c_str());
    if (tty_ && !a_.quiet && !a_.json && !line_.empty()) show();
  }
  // Ends the terminal line.
  void finish() {
    const std::lock_guard lock(mutex_);
    if (tty_ && !a_.quiet && !a_.json && !line_.empty()) std::fprintf(stderr, "\n");
    line_.clear();
  }

 private:
  void show() { std::fprintf(stderr, "\r%-116s", (line_ + units_).c_str()); }

  const PullArgs& a_;
  uint64_t total_;
  std::mutex mutex_;
  std::string line_, units_;
  uint64_t received_ = 0;
  uint64_t last_this_run_ = 0;
  bool tty_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

uint64_t directory_bytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  return total;
}

// Files among `list` that the file list gives no valid hash for: refused before they are
// downloaded, or with --no-verify each one named in a warning (stderr, and the JSON stream).
// Returns the paths of the files that go unchecked.
std::vector<std::string> unchecked_files(const PullArgs& a, const hub::Repo& repo,
                                         const std::vector<hub::RemoteFile>& list) {
  std::vector<std::string> paths, reasons;
  for (const auto& f : list)
    if (std::string why = hub::unchecked_reason(repo, f); !why.empty()) {
      paths.push_back(f.path);
      reasons.push_back(std::move(why));
    }
  if (reasons.empty()) return paths;
  if (!a.no_verify) {
    std::string all;
    for (const auto& why : reasons) all += (all.empty() ? "" : "\n") + why;
    if (reasons.size() == 1)
      fail(all, "; refusing to download a file that cannot be checked (--no-verify allows it)");
    fail(all, "\nrefusing to download ", reasons.size(),
         " files that cannot be checked (--no-verify allows them)");
  }
  for (size_t i = 0; i < reasons.size(); ++i) {
    const std::string message = reasons[i] + "; downloaded unchecked (--no-verify)";
    std::fprintf(stderr, "warning: %s\n", message.c_str());
    if (a.json) emit({{"event", "warning"}, {"file", paths[i]}, {"message", message}});
  }
  return paths;
}

void run_pull(const PullArgs& a) {
  hub::Endpoint endpoint = hub::Endpoint::from_environment();
  endpoint.allow_unchecked = a.no_verify;
  const hub::Repo repo = hub::parse_repo(a.repo);
  // What can be checked before gigabytes arrive.
  if (a.type != "keep") convert::parse_storage_type(a.type, "-t");
  check(a.policy.empty() || fs::is_regular_file(a.policy), "--policy ", a.policy,
        ": no such file");
  const std::string output = a.output.empty() ? repo.name() + "-" + a.type + ".klein" : a.output;
  auto say = [&](const std::string& text) {
    if (!a.quiet && !a.json) std::fprintf(stderr, "%s\n", text.c_str());
  };

  const std::vector<hub::RemoteFile> all = hub::list_files(endpoint, repo);
  const hub::RemoteFile* index = nullptr;
  for (const auto& f : all)
    if (f.path == "model_index.json") index = &f;
  if (!index) {
    std::string examples;
    for (size_t i = 0; i < all.size() && i < 4; ++i) examples += (i ? ", " : "") + all[i].path;
    fail(repo.id,
         " has no model_index.json: `klein pull` takes diffusers repositories "
         "(",
         family_titles(), "). It holds ", all.size(), " files", all.empty() ? "" : " (", examples,
         all.size() > 4 ? ", ..." : "", all.empty() ? "" : ")",
         "; for single files, download them and run `klein convert --diffusion-model FILE "
         "--text-encoder FILE --vae FILE --tokenizer DIR`");
  }

  std::vector<std::string> unchecked = unchecked_files(a, repo, {*index});

  // The files go to DIR/<name>/ (the model's name comes from its folder), DIR being
  // --keep-source or a folder beside the output that is removed after the conversion.
  const bool keep = !a.keep_source.empty();
  const fs::path base = keep ? fs::path(a.keep_source) : fs::path(output + ".download");
  const fs::path dir = base / repo.name();
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec, "cannot create ", dir.string(), ": ", ec.message());

  hub::download(endpoint, repo, *index, dir / index->path, nullptr);
  std::ifstream in(dir / index->path);
  const std::string index_text((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
  const std::vector<hub::RemoteFile> files =
      hub::files_for_conversion(all, index_text, repo);
  uint64_t total = 0, all_bytes = 0;
  for (const auto& f : files) total += f.size;
  for (const auto& f : all) all_bytes += f.size;

  if (a.list) {
    for (const auto& f : files)
      std::printf("%12llu  %s%s\n", static_cast<unsigned long long>(f.size), f.path.c_str(),
                  hub::unchecked_reason(repo, f).empty() ? "" : "  (no valid hash: unchecked)");
    std::printf("%zu files, %s of the repository's %s\n", files.size(),
                size_text(double(total)).c_str(), size_text(double(all_bytes)).c_str());
    if (!keep) fs::remove_all(base, ec);
    return;
  }
  // Every file is checkable (or --no-verify said otherwise) before the first byte of one.
  std::vector<hub::RemoteFile> rest;
  for (const auto& f : files)
    if (f.path != index->path) rest.push_back(f);
  try {
    for (std::string& path : unchecked_files(a, repo, rest)) unchecked.push_back(std::move(path));
  } catch (const Error&) {
    if (!keep) fs::remove_all(base, ec);
    throw;
  }
  auto remind_unchecked = [&] {
    if (!unchecked.empty())
      std::fprintf(stderr,
                   "warning: %zu of the files %s was made from were not checked against "
                   "a hash (--no-verify)\n",
                   unchecked.size(), output.c_str());
  };
  if (a.json)
    emit({{"event", "plan"}, {"repo", repo.id}, {"revision", repo.revision},
          {"files", files.size()}, {"bytes", total}, {"repository_bytes", all_bytes},
          {"directory", dir.string()}, {"output", output}});
  say("pulling " + repo.id + "@" + repo.revision + ": " + std::to_string(files.size()) +
      " files, " + size_text(double(total)) + " (of the repository's " +
      size_text(double(all_bytes)) + ") into " + dir.string() +
      (keep ? "" : ", removed after the conversion"));

  const uint64_t have = directory_bytes(dir);
  const fs::space_info space = fs::space(dir, ec);
  ConvertArgs c;
  c.paths.model = dir;
  c.output = output;
  c.type = a.type;
  c.policy = a.policy;
  c.threads = a.threads;
  c.keep_llm = a.keep_llm;
  c.quiet = a.quiet || a.json;
  PullProgress progress(a, total);
  // Files fetched whole, the shown-th of the pull's files, counted in done_before.
  uint64_t done_before = 0;
  size_t shown = 0;
  auto fetch_whole = [&](const hub::RemoteFile& f) {
    progress.next_file();
    hub::download(endpoint, repo, f, dir / f.path, [&](const hub::Transfer& t) {
      progress.file(t, shown, files.size(), done_before);
    });
    done_before += f.size;
    ++shown;
  };

  if (keep) {
    // Room for what is still to come; the container needs room too, which the converter
    // checks as it writes.
    if (!ec && total > have)
      check(space.available >= total - have, "not enough disk space in ", dir.string(), ": ",
            size_text(double(total - have)), " still to download, ",
            size_text(double(space.available)), " free");
    try {
      for (const auto& f : files) fetch_whole(f);
    } catch (const Error& e) {
      fail(e.what(), "\nthe files downloaded so far stay in ", base.string(),
           ": the same command resumes");
    }
    progress.finish();
    say("converting to " + output);
    run_convert(c);
    const uint64_t container = fs::file_size(output, ec);
    const uint64_t sources = directory_bytes(base);
    if (a.json)
      emit({{"event", "done"}, {"output", output}, {"container_bytes", container},
            {"source_bytes", sources}, {"peak_disk_bytes", container + sources},
            {"kept_source", dir.string()}, {"unchecked_files", unchecked}});
    say("wrote " + output + " (" + size_text(double(container)) + "); the disk held at most " +
        size_text(double(container + sources)) + " (sources and container); the sources stay in " +
        dir.string());
    remind_unchecked();
    return;
  }

  // Converted while downloading: the small files first, then the weight files, each created
  // at its full size with its safetensors header (read ahead with a range request) so that
  // the conversion can plan; the bytes then arrive in the order the conversion reads the
  // files, and what it has stored is freed from the disk (convert/arrival.h).
  uint64_t largest = 0;
  for (const auto& f : files) largest = std::max(largest, f.size);
  if (!ec)
    check(space.available + have >= largest, "not enough disk space in ", dir.string(), ": ",
          "the largest file is ", size_text(double(largest)), ", ",
          size_text(double(space.available)), " free");
  std::vector<size_t> small, weights;
  for (size_t i = 0; i < files.size(); ++i)
    (files[i].path.ends_with(".safetensors") ? weights : small).push_back(i);
  convert::SourceArrival arrival(/*free_consumed=*/true);  // numbers the files as `weights`
  arrival.set_warning([&](const std::string& message) { progress.warn(message); });
  // Each weight file's header as read ahead: the conversion plans from it, so the checked
  // download must bring the same bytes.
  std::vector<std::string> heads(files.size());
  auto start_over = [&](const std::string& what) {
    fs::remove_all(base, ec);
    fail(what, "\nthe download was removed (it is freed as it is converted): run the same "
         "command to start again, or add --keep-source DIR for a download that resumes");
  };
  try {
    for (size_t i : small) fetch_whole(files[i]);
    for (size_t i : weights) {
      const hub::RemoteFile& f = files[i];
      const std::string length = hub::read_prefix(endpoint, repo, f, 8);
      // (read_prefix gives 8 bytes whenever the file has them)
      const uint64_t n = safetensors_header_length(
          reinterpret_cast<const std::byte*>(length.data()), f.size, f.path);
      std::string& head = heads[i];
      head = hub::read_prefix(endpoint, repo, f, 8 + n);
      const fs::path path = dir / f.path;
      fs::create_directories(path.parent_path(), ec);
      fs::remove(path.string() + ".part", ec);  // a --keep-source run's leftovers
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      check(fd >= 0, "cannot write ", path.string(), ": ", std::strerror(errno));
      const bool ok = ::ftruncate(fd, off_t(f.size)) == 0 &&
                      ::pwrite(fd, head.data(), head.size(), 0) == ssize_t(head.size());
      ::close(fd);
      check(ok, "cannot write ", path.string(), ": ", std::strerror(errno));
      arrival.expect(path, f.size);
    }
  } catch (const Error& e) {
    start_over(e.what());
  }
  uint64_t small_bytes = 0;
  for (size_t i : small) small_bytes += files[i].size;
  arrival.set_other_bytes(small_bytes);

  std::thread downloader([&] {
    try {
      const std::vector<size_t> order = arrival.wait_for_order();
      for (size_t k = 0; k < order.size(); ++k) {
        arrival.wait_turn(k);
        const hub::RemoteFile& f = files[weights[order[k]]];
        progress.next_file();
        const std::string& head = heads[weights[order[k]]];
        xxh3::Hasher hasher;
        bool same_head = true;
        hub::download_in_place(
            endpoint, repo, f, dir / f.path,
            [&](const char* data, size_t n, uint64_t offset) {
              if (offset == 0) {
                hasher.reset();
                same_head = true;
              }
              hasher.update(data, n);
              if (offset < head.size()) {
                const size_t m = size_t(std::min<uint64_t>(n, head.size() - offset));
                same_head &= std::memcmp(data, head.data() + offset, m) == 0;
              }
              arrival.arrived(order[k], offset + n);
            },
            [&](const hub::Transfer& t) { progress.file(t, shown + k, files.size(), done_before); },
            arrival.cancelled());
        check(same_head, f.path, ": the header read ahead (", head.size(),
              " bytes, a range request) differs from the start of the checked file");
        arrival.complete(order[k], container::hex64(hasher.digest()));
        done_before += f.size;
      }
    } catch (const std::exception& e) {
      arrival.fail(e.what());
    }
  });
  say("converting to " + output + " as the files arrive");
  c.arrival = &arrival;
  c.on_progress = [&](const convert::ConvertProgress& p) { progress.converted(p); };
  try {
    run_convert(c);
  } catch (const Error& e) {
    arrival.fail(e.what());
    downloader.join();
    progress.finish();
    start_over(e.what());
  }
  downloader.join();
  progress.finish();
  const uint64_t container = fs::file_size(output, ec);
  const uint64_t peak = std::max(arrival.peak_disk_bytes(), container);
  fs::remove_all(base, ec);
  if (a.json)
    emit({{"event", "done"}, {"output", output}, {"container_bytes", container},
          {"source_bytes", total}, {"peak_disk_bytes", peak},
          {"freed_bytes", arrival.freed_bytes()}, {"kept_source", ""},
          {"unchecked_files", unchecked}});
  const size_t unfreed = arrival.unfreed_files();
  say("pulled " + output + " (" + size_text(double(container)) + "); the disk held at most " +
      size_text(double(peak)) + " at once, container included (" + size_text(double(total)) +
      " downloaded, " +
      (unfreed ? std::to_string(unfreed) + " of the files not freed as they were stored"
               : std::string("each source byte freed once stored")) +
      ")");
  remind_unchecked();
}

}  // namespace

static Registration pull_command("pull", 9, [](CLI::App& app) {
  auto a = std::make_shared<PullArgs>();
  CLI::App* cmd = app.add_subcommand(
      "pull", "Download a model from the Hugging Face Hub and convert it into a container");
  cmd->add_option("repo", a->repo,
                  "OWNER/NAME[@REVISION] of a diffusers repository, e.g. "
                  "black-forest-labs/FLUX.2-klein-4B or Tongyi-MAI/Z-Image-Turbo")
      ->required();
  cmd->add_option("-t,--type", a->type, "storage type, as klein convert -t")->capture_default_str();
  cmd->add_option("-o,--output", a->output, "the container to write (default NAME-TYPE.klein)");
  cmd->add_option("--keep-source", a->keep_source,
                  "download into DIR/NAME first and keep the files (resumable across runs; "
                  "default: convert while downloading in OUTPUT.download, freeing each source "
                  "byte once it is stored)");
  cmd->add_option("--policy", a->policy, "precision policy file, as klein convert --policy");
  cmd->add_option("--threads", a->threads, "packing threads (default: all)");
  cmd->add_flag("--keep-llm", a->keep_llm,
                "keep what prompt upsampling needs, as klein convert --keep-llm");
  cmd->add_flag("--list", a->list, "print the files the conversion needs and their sizes; "
                                   "download nothing else");
  cmd->add_flag("--json", a->json, "progress and the result as JSON lines on stdout");
  cmd->add_flag("--no-verify", a->no_verify,
                "download files the repository's file list gives no valid SHA-256 or git blob "
                "id for, unchecked, with a warning for each (default: refuse them)");
  cmd->add_flag("-q,--quiet", a->quiet, "no progress output (errors are still printed)");
  cmd->footer(
      "Environment: HF_ENDPOINT (a mirror; default https://huggingface.co), HF_TOKEN (an "
      "access token, for gated or private repositories; else the token file of "
      "huggingface-cli login). The conversion runs as the files arrive and frees what it "
      "has stored, so the disk never holds the whole download; a dropped connection is "
      "resumed, a failed pull starts over (with --keep-source DIR it resumes).");
  cmd->callback([a] { run_pull(*a); });
});

}  // namespace klein::cli
