// The core every API of `klein serve` runs on: the queue, the generation runner, and the
// one place an exception becomes an HTTP answer.
#include "server/impl.h"

#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <new>

#include "core/base64.h"
#include "core/error.h"
#include "formats/image/image.h"
#include "pipeline/noise.h"
#include "pipeline/preview.h"

namespace klein {

namespace fs = std::filesystem;
using namespace requests;

namespace {

HttpError shutting_down() { return {503, "cancelled: the server is shutting down", "cancelled"}; }

}  // namespace

Server::Impl::Impl(Compute& c, ServerOptions o)
    : cx(c), options(std::move(o)), loras(list_loras(options.lora_dir)) {}

Server::Impl::~Impl() {
  {
    const std::lock_guard lock(mutex);
    stopping = true;
  }
  turn.notify_all();
  cx.cancel();
  std::map<std::string, std::shared_ptr<Job>> all;
  {
    const std::lock_guard lock(jobs_mutex);
    all.swap(jobs);
  }
  for (auto& [_, job] : all)
    if (job->thread.joinable()) job->thread.join();
}

Model& Server::Impl::ready_model() {
  Model* m = model.load();
  if (!m)
    throw HttpError{503, "the model is still loading: GET /health answers 200 once it is ready",
                    "not_ready"};
  return *m;
}

namespace serve {

namespace {

bool abandoned(Impl& s, const Ticket& t) {
  if (t.job) {
    const std::lock_guard lock(s.jobs_mutex);
    return t.job->cancel;
  }
  return t.client && t.client->gone();
}

HttpError abandoned_error(const Ticket& t) {
  return t.job ? HttpError{503, "cancelled (DELETE /v1/jobs/" + t.job->id + ")", "cancelled"}
               : HttpError{503, "cancelled: the client closed the connection", "cancelled"};
}

}  // namespace

// --- the queue -------------------------------------------------------------------------------

Slot::Slot(Impl& s) : s_(s) {
  const std::lock_guard lock(s_.mutex);
  if (s_.stopping) throw shutting_down();
  // One runs (or is about to: first in line between two generations), up to max_queue wait.
  const int waiting = s_.waiting();
  if (int(s_.line.size()) + (s_.running ? 1 : 0) > s_.options.max_queue)
    throw HttpError{429,
                    "busy: " + std::to_string(waiting) +
                        " requests are already waiting (--max-queue " +
                        std::to_string(s_.options.max_queue) + ")",
                    "queue_full"};
  place_ = s_.next_place++;
  s_.line.push_back(place_);
  queued_ = true;
}

void Slot::take(const Ticket& t) {
  std::unique_lock lock(s_.mutex);
  while ((s_.running || s_.line.front() != place_) && !s_.stopping) {
    s_.turn.wait_for(lock, std::chrono::milliseconds(100));
    lock.unlock();
    const bool gone = abandoned(s_, t);
    lock.lock();
    if (gone) throw abandoned_error(t);
  }
  if (s_.stopping) throw shutting_down();
  leave_line();
  s_.running = holding_ = true;
}

Slot::~Slot() {
  {
    const std::lock_guard lock(s_.mutex);
    if (queued_) leave_line();
    if (holding_) s_.running = false;
  }
  s_.turn.notify_all();
}

void Slot::leave_line() {
  queued_ = false;
  s_.line.erase(std::find(s_.line.begin(), s_.line.end(), place_));
}

// --- the generation runner -------------------------------------------------------------------

namespace {

// The pipeline's progress events into `live` and the phase times into the metrics; at each
// event, whether the requester is still there (if not, the generation is cancelled).
class LiveProgress final : public Progress {
 public:
  LiveProgress(Impl& s, const Ticket& t) : s_(s), t_(t) {}
  void begin(const std::string& phase, int total) override {
    look();
    const std::lock_guard lock(s_.live_mutex);
    s_.live.phase = phase;
    if (phase == "denoise") s_.live.step = 0, s_.live.steps = total;
  }
  void step(const std::string& phase, int done, int total) override {
    look();
    if (phase != "denoise") return;
    const std::lock_guard lock(s_.live_mutex);
    s_.live.step = done;
    s_.live.steps = total;
  }
  void end(const std::string& phase, double seconds) override { s_.metrics.phase(phase, seconds); }
  // The requester went away and the generation was cancelled for it.
  bool abandoned() const { return abandoned_; }
  void look() {
    if (!abandoned_ && serve::abandoned(s_, t_)) {
      abandoned_ = true;
      s_.cx.cancel();
    }
  }

 private:
  Impl& s_;
  const Ticket& t_;
  bool abandoned_ = false;
};

// Why a generation was cancelled: the server stops, its requester went away, or
// /sdapi/v1/interrupt.
HttpError cancelled(Impl& s, const LiveProgress& progress, const Ticket& t) {
  const std::lock_guard lock(s.mutex);
  if (s.stopping) return shutting_down();
  if (progress.abandoned()) return abandoned_error(t);
  return {503, "interrupted (/sdapi/v1/interrupt)", "cancelled"};
}

bool should_stop(Impl& s) {
  const std::lock_guard lock(s.mutex);
  return s.stopping || s.interrupted;
}

// "upsample": true. By the remote model when the server has one (a failure falls back to the
// prompt as given, recorded nowhere but the log, unless strict: 502); else by the model's
// text encoder (a model without a language-model head: 400), greedy unless the server was
// started with sampling options, the request's first seed drawing them.
void upsample_request(Impl& s, Model& m, GenerateOptions& o, LiveProgress& progress) {
  const bool edit = !o.references.empty();
  std::string rewritten;
  if (s.options.upsample_endpoint) {
    progress.begin("upsample prompt", 0);
    const hub::RemoteUpsample r = [&] {
      try {
        return hub::remote_upsample(*s.options.upsample_endpoint,
                                    s.options.upsample.system.empty()
                                        ? default_upsample_system(edit)
                                        : s.options.upsample.system,
                                    o.prompt, {}, s.options.upsample_strict);
      } catch (const Error& e) {
        throw HttpError{502, e.what(), "upstream_error"};
      }
    }();
    progress.end("upsample prompt", r.seconds);
    if (r.fell_back) {
      std::fprintf(stderr, "klein serve: %s\n", r.warning.c_str());
      return;
    }
    rewritten = r.prompt;
  } else {
    const std::string why = upsample_unavailable(m);
    if (!why.empty()) throw bad_request("\"upsample\": " + why);
    UpsampleOptions u = s.options.upsample;
    u.edit = edit;
    u.seed = o.seed.value_or(0);
    progress.begin("upsample prompt", u.max_new_tokens);
    const auto start = std::chrono::steady_clock::now();
    rewritten = upsample_prompt(m, s.cx, o.prompt, u, [&](int n) {
                  progress.step("upsample prompt", n, u.max_new_tokens);
                }).prompt;
    progress.end("upsample prompt",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  o.original_prompt = o.prompt;
  o.prompt = rewritten;
}

}  // namespace

Made generate(Impl& s, ImageRequest request, Slot& slot, const Ticket& t) {
  Model& m = s.ready_model();
  slot.take(t);
  if (t.job) {
    const std::lock_guard lock(s.jobs_mutex);
    t.job->state = "running";
  }
  {
    const std::lock_guard lock(s.mutex);
    s.interrupted = false;
  }
  {
    const std::lock_guard lock(s.live_mutex);
    s.live = Impl::Live{true, t.job ? t.job->id : "",          "queued", 0, request.count, 0, 0,
                        "",   std::chrono::steady_clock::now()};
  }
  struct Idle {  // the live view goes back to idle however this ends
    Impl& s;
    ~Idle() {
      const std::lock_guard lock(s.live_mutex);
      s.live.active = false;
    }
  } idle{s};
  Made made;
  GenerateOptions& o = request.options;
  if (!o.seed) o.seed = random_seed();  // below 2^32: seed + i stays exact for every client
  const uint64_t first_seed = *o.seed;
  LiveProgress progress(s, t);
  const StepHook preview = [&s](const StepView& v) {
    const std::string b64 = base64_encode(png_bytes(v.preview()));
    const std::lock_guard lock(s.live_mutex);
    s.live.preview = b64;
  };
  if (s.options.check_prompt) {
    progress.begin("check prompt", 0);
    if (!s.prompt_checker) s.prompt_checker = std::make_unique<PromptChecker>(m, s.cx);
    const PromptCheck c = s.prompt_checker->check(o.prompt);
    progress.end("check prompt", c.seconds);
    if (c.flagged) throw PromptFlagged(prompt_check_refusal("the server's prompt check"), c);
  }
  if (request.upsample) {
    try {
      upsample_request(s, m, o, progress);
    } catch (const Cancelled&) {
      throw cancelled(s, progress, t);
    }
  }
  if (!o.original_prompt.empty()) made.upsampled_prompt = o.prompt;
  // The images of the request denoised together (in groups when the memory budget does not
  // hold all of them): Session::generate_batch. Input that start() refuses is the client's
  // fault, so an error before the first group has started is a 400.
  std::vector<GenerateOptions> images(size_t(request.count), o);
  for (int i = 0; i < request.count; ++i) images[size_t(i)].seed = first_seed + uint64_t(i);
  bool running = false;
  auto began = std::chrono::steady_clock::now();
  size_t group_first = 0, group = 1;
  Session session(m, s.cx);
  try {
    session.generate_batch(
        images, progress,
        [&](size_t i, GenerateResult& r) {
          {
            const std::lock_guard lock(s.live_mutex);
            s.live.image = int(i);
          }
          const GenerateOptions& used = images[i];
          const std::string text = parameters_text(used, r, m.name);
          const std::string metadata_json = parameters_json(used, r, m.name, m.checksum);
          const ImageMetadata meta = {{"parameters", text},
                                      {"klein", metadata_json},
                                      {kXmpKey, provenance_xmp(metadata_json)}};
          made.png.push_back(base64_encode(png_bytes(r.image, meta)));
          made.seeds.push_back(r.seed.value_or(0));
          made.infotexts.push_back(text);
          if (i == 0) made.first = r;
          // When a group is done, each of its images is charged an equal part of its time.
          if (i + 1 == group_first + group) {
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
            for (size_t k = 0; k < group; ++k)
              s.metrics.image_done(t.route, seconds / double(group));
          }
        },
        preview,
        [&](size_t first, size_t count) {
          running = true;
          group_first = first;
          group = count;
          began = std::chrono::steady_clock::now();
          {
            const std::lock_guard lock(s.live_mutex);
            s.live.image = int(first);
          }
          // start() clears the cancel flag: a stop, interrupt or departure before it counts.
          progress.look();
          if (should_stop(s) || progress.abandoned()) throw cancelled(s, progress, t);
        });
  } catch (const Cancelled&) {
    // Which cancellation it was is known only here.
    throw cancelled(s, progress, t);
  } catch (const SafetyFlagged&) {
    throw;  // neither bad input nor our failure: http_error's 422
  } catch (const Error& e) {
    // Whose fault it was is known only here; a later failure goes on to http_error (500).
    if (!running) throw bad_request(e.what());
    throw;
  }
  return made;
}

Made generate_now(Impl& s, ImageRequest r, const httplib::Request& req, const std::string& route) {
  s.ready_model();
  take_lora_tags(r.options, s.loras);
  Slot slot(s);
  const ClientConnection client(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  return generate(s, std::move(r), slot, Ticket{route, &client, nullptr});
}

UploadDir::UploadDir() {
  std::string pattern = (fs::temp_directory_path() / "klein-serve-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw HttpError{500, "cannot create a directory for uploads"};
  dir_ = pattern;
}

void place_uploads(requests::ImageRequest& r, UploadDir& dir) {
  if (!r.control_image.empty()) r.options.control_image = dir.write("control_image", r.control_image);
  for (size_t i = 0; i < r.references.size(); ++i)
    r.options.references.push_back(dir.write("references" + std::to_string(i), r.references[i]));
  if (!r.init_image.empty()) r.options.init_image = dir.write(r.init_field, r.init_image);
  if (!r.mask.empty()) r.options.mask = dir.write("mask", r.mask);
  r.control_image.clear();
  r.references.clear();
  r.init_image.clear();
  r.mask.clear();
}

std::shared_ptr<UploadDir> place_uploads(requests::ImageRequest& r) {
  if (r.control_image.empty() && r.references.empty() && r.init_image.empty() && r.mask.empty())
    return nullptr;
  auto dir = std::make_shared<UploadDir>();
  place_uploads(r, *dir);
  return dir;
}

UploadDir::~UploadDir() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

fs::path UploadDir::write(const std::string& field, const std::string& bytes) {
  if (bytes.empty()) throw bad_request("\"" + field + "\": the image is empty");
  std::string name;
  for (char c : field) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  const fs::path path = dir_ / (name + ".img");
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw HttpError{500, "cannot store the upload \"" + field + "\""};
  return path;
}

// --- errors and routes -----------------------------------------------------------------------

HttpError http_error(const std::exception_ptr& thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const HttpError& e) {
    return e;
  } catch (const SafetyFlagged& e) {
    // A request well formed, but an image of it the safety check refuses.
    return {422, e.what(), "flagged"};
  } catch (const PromptFlagged& e) {
    return {422, e.what(), "flagged"};  // and its prompt, the prompt check
  } catch (const std::bad_alloc&) {
    return {500, "out of memory"};
  } catch (const std::exception& e) {
    return {500, e.what()};
  }
}

std::string kind_of(const HttpError& e) {
  if (!e.kind.empty()) return e.kind;
  switch (e.status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 429: return "queue_full";
    case 503: return "unavailable";
    default: return "internal";
  }
}

namespace {

const char* status_name(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

json error_body(Api api, const HttpError& error) {
  const int status = error.status;
  if (api == Api::A1111) return {{"error", status_name(status)}, {"detail", error.message}};
  const char* type = status == 422                   ? "content_policy_violation"
                     : status == 400 || status == 401 ? "invalid_request_error"
                                                      : "server_error";
  return {{"error", {{"message", error.message}, {"type", type}, {"code", status}}}};
}

// Compared in time that does not depend on where the first wrong byte is.
bool authorized(const ServerOptions& options, const httplib::Request& req) {
  if (options.api_key.empty()) return true;
  const std::string expected = "Bearer " + options.api_key;
  const std::string given = req.get_header_value("Authorization");
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

}  // namespace

httplib::Server::Handler api_route(Impl& s, Api api, std::string name, Handler fn) {
  return [&s, api, name = std::move(name), fn = std::move(fn)](const httplib::Request& req,
                                                               httplib::Response& res) {
    HttpError error{0, ""};
    try {
      if (!authorized(s.options, req))
        throw HttpError{401, "missing or wrong API key (Authorization: Bearer KEY)"};
      const json reply = fn(req, res);
      if (!reply.is_null()) res.set_content(reply.dump(), "application/json");
      return;
    } catch (...) {
      error = http_error(std::current_exception());
    }
    s.metrics.error(name, kind_of(error));
    res.status = error.status;
    res.set_content(error_body(api, error).dump(), "application/json");
  };
}

json parse_json(const httplib::Request& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    throw bad_request("the request body must be a JSON object");
  return body;
}

}  // namespace serve
}  // namespace klein
