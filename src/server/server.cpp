#include "server/server.h"

#include <httplib.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "core/random.h"
#include "formats/image/image.h"
#include "pipeline/noise.h"
#include "pipeline/preview.h"
#include "server/connection.h"
#include "server/metrics.h"
#include "server/page.h"
#include "server/requests.h"
#include "core/base64.h"

namespace klein {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace requests;

const char* status_name(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

// The label of an error in /metrics.
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

HttpError shutting_down() { return {503, "cancelled: the server is shutting down", "cancelled"}; }

// 128 random bits in hex: a job's id, not guessable by another client.
std::string new_job_id() {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx",
                static_cast<unsigned long long>(os_random_u64()),
                static_cast<unsigned long long>(os_random_u64()));
  return text;
}

// A per-request directory for uploaded images (the pipeline reads files), removed with it.
class UploadDir {
 public:
  UploadDir() {
    std::string pattern = (fs::temp_directory_path() / "klein-serve-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw HttpError{500, "cannot create a directory for uploads"};
    dir_ = pattern;
  }
  ~UploadDir() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  UploadDir(const UploadDir&) = delete;
  UploadDir& operator=(const UploadDir&) = delete;

  // Writes the bytes as an image file named after the request field.
  fs::path write(const std::string& field, const std::string& bytes) {
    if (bytes.empty()) throw bad_request("\"" + field + "\": the image is empty");
    std::string name;
    for (char c : field) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    const fs::path path = dir_ / (name + ".img");
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) throw HttpError{500, "cannot store the upload \"" + field + "\""};
    return path;
  }

 private:
  fs::path dir_;
};

}  // namespace

// --- the server ------------------------------------------------------------------------------

struct Server::Impl {
  Compute& cx;
  ServerOptions options;
  httplib::Server http;
  int port = 0;
  std::atomic<Model*> model{nullptr};  // null while the model opens (set_model)
  Metrics metrics;

  // One generation at a time; the others wait in turn.
  std::mutex mutex;
  std::condition_variable turn;
  bool running = false;
  // The places taken in the queue (Slot) by synchronous requests and jobs that wait, by
  // number, first come first.
  std::deque<uint64_t> line;
  uint64_t next_place = 0;
  bool stopping = false;
  std::atomic<bool> serving{false};  // inside run()'s listen (set under `mutex`)

  std::map<std::string, fs::path> loras;  // --lora-dir

  Impl(Compute& c, ServerOptions o)
      : cx(c), options(std::move(o)), loras(list_loras(options.lora_dir)) {}

  // An asynchronous job (POST /v1/jobs): its own thread runs it through the same queue as the
  // synchronous requests. Everything but `id` and `thread` is guarded by jobs_mutex.
  struct Job {
    std::string id;
    std::string state = "queued";  // queued, running, done, failed, cancelled
    bool cancel = false;           // DELETE came: the job stops at its next step
    json result;                   // done: the /v1/images/generations reply
    HttpError error{0, ""};        // failed or cancelled: why
    int step = 0, steps = 0;       // finished: the last progress seen
    std::string preview;
    std::chrono::steady_clock::time_point finished;
    std::thread thread;
  };
  std::mutex jobs_mutex;
  std::map<std::string, std::shared_ptr<Job>> jobs;

  static bool finished(const Job& j) { return j.state != "queued" && j.state != "running"; }

  ~Impl() {
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

  Model& ready_model() {
    Model* m = model.load();
    if (!m)
      throw HttpError{503, "the model is still loading: GET /health answers 200 once it is ready",
                      "not_ready"};
    return *m;
  }

  // Who a generation is for: the route it came through (for /metrics), and how to tell that
  // nobody wants it any more: the client of a synchronous request closed its connection, or
  // its job was deleted.
  struct Ticket {
    std::string route;
    const ClientConnection* client = nullptr;
    std::shared_ptr<Job> job;
  };

  bool abandoned(const Ticket& t) {
    if (t.job) {
      const std::lock_guard lock(jobs_mutex);
      return t.job->cancel;
    }
    return t.client && t.client->gone();
  }

  static HttpError abandoned_error(const Ticket& t) {
    return t.job ? HttpError{503, "cancelled (DELETE /v1/jobs/" + t.job->id + ")", "cancelled"}
                 : HttpError{503, "cancelled: the client closed the connection", "cancelled"};
  }

  // A place in the queue, taken when constructed (429 when max_queue are waiting already),
  // then the turn to generate (take), held until destroyed. Turns go in the order the places
  // were taken.
  class Slot {
   public:
    explicit Slot(Impl& s) : s_(s) {
      const std::lock_guard lock(s_.mutex);
      if (s_.stopping) throw shutting_down();
      const int waiting = int(s_.line.size());
      if (waiting + (s_.running ? 1 : 0) > s_.options.max_queue)
        throw HttpError{429,
                        "busy: " + std::to_string(waiting) +
                            " requests are already waiting (--max-queue " +
                            std::to_string(s_.options.max_queue) + ")",
                        "queue_full"};
      place_ = s_.next_place++;
      s_.line.push_back(place_);
      queued_ = true;
    }
    // Waits for the turn (nobody running and this place first in line), looking every 100 ms
    // whether the requester is still there.
    void take(const Ticket& t) {
      std::unique_lock lock(s_.mutex);
      while ((s_.running || s_.line.front() != place_) && !s_.stopping) {
        s_.turn.wait_for(lock, std::chrono::milliseconds(100));
        lock.unlock();
        const bool gone = s_.abandoned(t);
        lock.lock();
        if (gone) throw abandoned_error(t);
      }
      if (s_.stopping) throw shutting_down();
      leave_line();
      s_.running = holding_ = true;
    }
    ~Slot() {
      {
        const std::lock_guard lock(s_.mutex);
        if (queued_) leave_line();
        if (holding_) s_.running = false;
      }
      s_.turn.notify_all();
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    void leave_line() {  // s_.mutex held
      queued_ = false;
      s_.line.erase(std::find(s_.line.begin(), s_.line.end(), place_));
    }
    Impl& s_;
    uint64_t place_ = 0;
    bool queued_ = false, holding_ = false;
  };

  struct Made {
    std::vector<std::string> png;  // base64 PNG files, with their metadata
    std::vector<uint64_t> seeds;
    std::vector<std::string> infotexts;
    GenerateResult first;
  };

  // What /sdapi/v1/progress and the jobs show of the running request: its phase and step,
  // and the step preview as a base64 PNG. Guarded by live_mutex.
  struct Live {
    bool active = false;
    std::string job;  // the job's id; empty for a synchronous request
    std::string phase;
    int image = 0, images = 0;  // 0-based image of the request, and how many
    int step = 0, steps = 0;    // denoising steps done, of steps
    std::string preview;        // base64 PNG of the last step's preview
    std::chrono::steady_clock::time_point started;

    // The fraction of the request's denoising done.
    double fraction() const {
      if (images == 0) return 0.0;
      return (image + (steps > 0 ? double(step) / steps : 0.0)) / images;
    }
  };
  std::mutex live_mutex;
  Live live;
  bool interrupted = false;  // /sdapi/v1/interrupt for the running request (guarded by mutex)

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
    void end(const std::string& phase, double seconds) override {
      s_.metrics.phase(phase, seconds);
    }
    // The requester went away and the generation was cancelled for it.
    bool abandoned() const { return abandoned_; }
    void look() {
      if (!abandoned_ && s_.abandoned(t_)) {
        abandoned_ = true;
        s_.cx.cancel();
      }
    }

   private:
    Impl& s_;
    const Ticket& t_;
    bool abandoned_ = false;
  };

  HttpError cancelled(const LiveProgress& progress, const Ticket& t) {
    const std::lock_guard lock(mutex);
    if (stopping) return shutting_down();
    if (progress.abandoned()) return abandoned_error(t);
    return {503, "interrupted (/sdapi/v1/interrupt)", "cancelled"};
  }

  bool should_stop() {
    const std::lock_guard lock(mutex);
    return stopping || interrupted;
  }

  // Waits for the slot's turn and runs the request's images through the stages. Input the
  // pipeline refuses in start() is the client's fault (400); later failures are ours (500);
  // cancellation (stop(), interrupt, the requester gone) is 503.
  Made generate(ImageRequest request, Slot& slot, const Ticket& t) {
    Model& m = ready_model();
    slot.take(t);
    if (t.job) {
      const std::lock_guard lock(jobs_mutex);
      t.job->state = "running";
    }
    {
      const std::lock_guard lock(mutex);
      interrupted = false;
    }
    {
      const std::lock_guard lock(live_mutex);
      live = Live{true, t.job ? t.job->id : "",          "queued", 0, request.count, 0, 0,
                  "",   std::chrono::steady_clock::now()};
    }
    struct Idle {  // the live view goes back to idle however this ends
      Impl& s;
      ~Idle() {
        const std::lock_guard lock(s.live_mutex);
        s.live.active = false;
      }
    } idle{*this};
    Made made;
    GenerateOptions& o = request.options;
    if (!o.seed) o.seed = random_seed();  // below 2^32: seed + i stays exact for every client
    const uint64_t first_seed = *o.seed;
    LiveProgress progress(*this, t);
    const StepHook preview = [this](const StepView& v) {
      const std::string b64 = base64_encode(png_bytes(v.preview()));
      const std::lock_guard lock(live_mutex);
      live.preview = b64;
    };
    // The images of the request denoised together (in groups when the memory budget does not
    // hold all of them): Session::generate_batch. Input that start() refuses is the client's
    // fault, so an error before the first group has started is a 400.
    std::vector<GenerateOptions> images(size_t(request.count), o);
    for (int i = 0; i < request.count; ++i) images[size_t(i)].seed = first_seed + uint64_t(i);
    bool running = false;
    auto began = std::chrono::steady_clock::now();
    size_t group_first = 0, group = 1;
    Session session(m, cx);
    try {
      session.generate_batch(
          images, progress,
          [&](size_t i, GenerateResult& r) {
            {
              const std::lock_guard lock(live_mutex);
              live.image = int(i);
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
                metrics.image_done(t.route, seconds / double(group));
            }
          },
          preview,
          [&](size_t first, size_t count) {
            running = true;
            group_first = first;
            group = count;
            began = std::chrono::steady_clock::now();
            {
              const std::lock_guard lock(live_mutex);
              live.image = int(first);
            }
            // start() clears the cancel flag: a stop, interrupt or departure before it counts.
            progress.look();
            if (should_stop() || progress.abandoned()) throw cancelled(progress, t);
          });
    } catch (const Cancelled&) {
      throw cancelled(progress, t);
    } catch (const Error& e) {
      if (!running) throw bad_request(e.what());
      throw HttpError{500, e.what()};
    }
    return made;
  }

  // A synchronous request: a place in the queue, then the generation, cancelled when the
  // client closes its connection.
  Made generate_now(ImageRequest r, const httplib::Request& req, const std::string& route) {
    ready_model();
    take_lora_tags(r.options, loras);
    Slot slot(*this);
    const ClientConnection client(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    return generate(std::move(r), slot, Ticket{route, &client, nullptr});
  }

  // A1111's progress: the fraction of the request's denoising done, the time left at that
  // rate, the state, and the latest step preview.
  json progress_reply() {
    const std::lock_guard lock(live_mutex);
    if (!live.active)
      return {{"progress", 0.0},
              {"eta_relative", 0.0},
              {"current_image", nullptr},
              {"state", {{"job_count", 0}, {"sampling_step", 0}, {"sampling_steps", 0}}}};
    const double fraction = live.fraction();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - live.started).count();
    const double eta = fraction > 0 ? elapsed / fraction - elapsed : 0.0;
    return {{"progress", fraction},
            {"eta_relative", eta},
            {"current_image", live.preview.empty() ? json(nullptr) : json(live.preview)},
            {"state",
             {{"job", live.phase},
              {"job_count", live.images},
              {"job_no", live.image},
              {"sampling_step", live.step},
              {"sampling_steps", live.steps}}}};
  }

  json interrupt() {
    bool active;
    {
      const std::lock_guard lock(live_mutex);
      active = live.active;
    }
    if (active) {
      {
        const std::lock_guard lock(mutex);
        interrupted = true;
      }
      cx.cancel();
    }
    return {{"interrupted", active}};
  }

  // --- jobs ----------------------------------------------------------------------------------

  // A job as GET /v1/jobs/{id} shows it (jobs_mutex held).
  json job_json(const Job& j, bool with_result) {
    json r = {{"id", j.id},       {"state", j.state},
              {"progress", 0.0},  {"step", j.step},
              {"steps", j.steps}, {"preview", j.preview.empty() ? json() : json(j.preview)}};
    if (j.state == "running") {
      const std::lock_guard lock(live_mutex);
      if (live.active && live.job == j.id) {
        r["progress"] = live.fraction();
        r["phase"] = live.phase;
        r["step"] = live.step;
        r["steps"] = live.steps;
        if (!live.preview.empty()) r["preview"] = live.preview;
      }
    }
    if (j.state == "done") {
      r["progress"] = 1.0;
      if (with_result) r["result"] = j.result;
    }
    if (j.error.status != 0) r["error"] = {{"message", j.error.message}, {"code", j.error.status}};
    if (j.cancel && !finished(j)) r["cancel_requested"] = true;
    return r;
  }

  // Takes the jobs finished longer than --job-ttl ago out of the table (jobs_mutex held); the
  // caller joins their threads after letting go of the lock.
  std::vector<std::shared_ptr<Job>> expire_jobs() {
    std::vector<std::shared_ptr<Job>> gone;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = jobs.begin(); it != jobs.end();) {
      const Job& j = *it->second;
      if (finished(j) &&
          std::chrono::duration<double>(now - j.finished).count() > options.job_ttl_seconds) {
        gone.push_back(it->second);
        it = jobs.erase(it);
      } else {
        ++it;
      }
    }
    return gone;
  }

  static void join(const std::vector<std::shared_ptr<Job>>& done) {
    for (const auto& job : done)
      if (job->thread.joinable()) job->thread.join();
  }

  std::shared_ptr<Job> find_job(const std::string& id) {
    std::vector<std::shared_ptr<Job>> expired;
    std::shared_ptr<Job> job;
    {
      const std::lock_guard lock(jobs_mutex);
      expired = expire_jobs();
      const auto it = jobs.find(id);
      if (it != jobs.end()) job = it->second;
    }
    join(expired);
    if (!job)
      throw HttpError{404, "no job \"" + id +
                               "\" (unknown, or forgotten: finished jobs are kept "
                               "for --job-ttl " +
                               std::to_string(int64_t(options.job_ttl_seconds)) + " s)"};
    return job;
  }

  int kept_jobs() {
    std::vector<std::shared_ptr<Job>> expired;
    size_t n;
    {
      const std::lock_guard lock(jobs_mutex);
      expired = expire_jobs();
      n = jobs.size();
    }
    join(expired);
    return int(n);
  }

  // POST /v1/jobs: the request is read and given its place in the queue now (400 and 429
  // come here), then runs on the job's thread.
  json submit_job(const httplib::Request& req, httplib::Response& res) {
    ready_model();
    ImageRequest r = read_openai_request(parse_json(req), options);
    take_lora_tags(r.options, loras);
    auto slot = std::make_unique<Slot>(*this);
    auto job = std::make_shared<Job>();
    job->id = new_job_id();
    std::vector<std::shared_ptr<Job>> dropped = {};
    json reply;
    {
      const std::lock_guard lock(jobs_mutex);
      dropped = expire_jobs();
      if (int(jobs.size()) >= options.max_jobs) {
        // Room for the new one: the job that finished first goes.
        auto oldest = jobs.end();
        for (auto it = jobs.begin(); it != jobs.end(); ++it)
          if (finished(*it->second) &&
              (oldest == jobs.end() || it->second->finished < oldest->second->finished))
            oldest = it;
        if (oldest == jobs.end())
          throw HttpError{429,
                          "busy: " + std::to_string(jobs.size()) +
                              " jobs are queued or running (--max-jobs " +
                              std::to_string(options.max_jobs) + ")",
                          "queue_full"};
        dropped.push_back(oldest->second);
        jobs.erase(oldest);
      }
      jobs[job->id] = job;
      job->thread = std::thread([this, job, slot = std::move(slot), r = std::move(r)]() mutable {
        run_job(job, std::move(slot), std::move(r));
      });
      reply = job_json(*job, false);
    }
    join(dropped);
    res.status = 202;
    return reply;
  }

  void run_job(const std::shared_ptr<Job>& job, std::unique_ptr<Slot> slot, ImageRequest r) {
    const std::string prompt = r.options.prompt;
    const std::string route = "/v1/jobs";
    json result;
    HttpError error{0, ""};
    try {
      result = openai_reply(generate(std::move(r), *slot, Ticket{route, nullptr, job}), prompt);
    } catch (const HttpError& e) {
      error = e;
    } catch (const std::bad_alloc&) {
      error = {500, "out of memory"};
    } catch (const std::exception& e) {
      error = {500, e.what()};
    }
    Live last;
    {
      const std::lock_guard lock(live_mutex);
      if (live.job == job->id) last = live;
    }
    slot.reset();  // the next request's turn
    if (error.status != 0) metrics.error(route, kind_of(error));
    const std::lock_guard lock(jobs_mutex);
    job->step = last.step;
    job->steps = last.steps;
    job->preview = last.preview;
    job->result = std::move(result);
    job->error = error;
    job->state = error.status == 0               ? "done"
                 : kind_of(error) == "cancelled" ? "cancelled"
                                                 : "failed";
    job->finished = std::chrono::steady_clock::now();
  }

  json delete_job(const std::string& id) {
    const std::shared_ptr<Job> job = find_job(id);
    std::unique_lock lock(jobs_mutex);
    if (!finished(*job)) {
      job->cancel = true;  // seen at its next step, or within 100 ms while it waits
      return job_json(*job, false);
    }
    json reply = job_json(*job, false);
    reply["deleted"] = true;
    const bool mine = jobs.erase(id) == 1;  // not already taken out by another request
    lock.unlock();
    if (mine) join({job});
    return reply;
  }

  // GET /v1/jobs/{id}/events: a "progress" event whenever what GET /v1/jobs/{id} shows has
  // changed (looked at every 100 ms), then the final state's event with the whole job.
  void job_events(const httplib::Request& req, httplib::Response& res) {
    const std::shared_ptr<Job> job = find_job(req.matches[1].str());
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, last = std::string()](size_t, httplib::DataSink& sink) mutable {
          std::string event, data;
          {
            const std::lock_guard lock(jobs_mutex);
            const bool end = finished(*job);
            event = end ? job->state : "progress";
            data = job_json(*job, end).dump();
          }
          if (event == "progress" && data == last) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            return sink.is_writable();
          }
          last = data;
          const std::string text = "event: " + event + "\ndata: " + data + "\n\n";
          if (!sink.write(text.data(), text.size())) return false;
          if (event != "progress") sink.done();
          return true;
        });
  }

  // --- routes --------------------------------------------------------------------------------

  // Compared in time that does not depend on where the first wrong byte is.
  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    const std::string expected = "Bearer " + options.api_key;
    const std::string given = req.get_header_value("Authorization");
    unsigned char diff = given.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i)
      diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
    return diff == 0;
  }

  json parse_json(const httplib::Request& req) const {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      throw bad_request("the request body must be a JSON object");
    return body;
  }

  // OpenAI: {"created": t, "data": [{"b64_json": ..., "revised_prompt": ...}]}; seed and
  // seed_str are extensions.
  static json openai_reply(const Made& made, const std::string& prompt) {
    json data = json::array();
    for (size_t i = 0; i < made.png.size(); ++i)
      data.push_back({{"b64_json", made.png[i]}, {"revised_prompt", prompt},
                      {"seed", made.seeds[i]}, {"seed_str", std::to_string(made.seeds[i])}});
    return {{"created", int64_t(std::time(nullptr))}, {"data", data}};
  }

  json openai_generations(const httplib::Request& req) {
    ImageRequest r = read_openai_request(parse_json(req), options);
    const std::string prompt = r.options.prompt;
    return openai_reply(generate_now(std::move(r), req, "/v1/images/generations"), prompt);
  }
  json openai_edits(const httplib::Request& req) {
    if (!req.is_multipart_form_data())
      throw bad_request("expected multipart/form-data (image, mask, prompt, ...), as the OpenAI "
                        "images API sends it");
    // The text fields as a JSON object (numbers and true/false as such), read like the JSON
    // APIs' fields.
    json body = json::object();
    for (const auto& [key, field] : req.files) {
      if (!field.filename.empty()) continue;  // an uploaded file
      const bool text = key == "prompt" || key == "negative_prompt" || key == "size" ||
                        key == "response_format" || key == "model";
      const json number = text ? json() : json::parse(field.content, nullptr, false);
      body[key] = number.is_number() || number.is_boolean() ? number : json(field.content);
    }
    ImageRequest r = read_openai_request(body, options);

    UploadDir uploads;
    std::vector<fs::path> images;
    for (const char* key : {"image", "image[]"}) {
      const auto [first, last] = req.files.equal_range(key);
      int i = 0;
      for (auto f = first; f != last; ++f)
        images.push_back(uploads.write(std::string(key) + std::to_string(i++), f->second.content));
    }
    if (images.empty()) throw bad_request("\"image\": at least one image file is required");
    if (req.has_file("mask")) {
      // Inpainting: the first image is repainted where the mask is white; the others are
      // references.
      r.options.mask = uploads.write("mask", req.get_file_value("mask").content);
      r.options.init_image = images.front();
      r.options.references.assign(images.begin() + 1, images.end());
      if (auto s = get<double>(body, "strength")) r.options.strength = *s;
    } else {
      if (body.contains("strength"))
        throw bad_request("\"strength\": only with a mask (editing with references keeps no "
                          "part of the image by strength)");
      r.options.references = images;
    }
    const std::string prompt = r.options.prompt;
    return openai_reply(generate_now(std::move(r), req, "/v1/images/edits"), prompt);
  }

  // A1111: {"images": [...], "parameters": request, "info": "<json text>"}
  json a1111(const httplib::Request& req, bool img2img) {
    const json body = parse_json(req);
    A1111Request a = read_a1111_request(body, options, img2img);
    ImageRequest& r = a.request;
    UploadDir uploads;
    if (img2img) {
      r.options.init_image = uploads.write("init_images", a.init_image);
      if (!a.mask.empty()) r.options.mask = uploads.write("mask", a.mask);
    }
    const Made made =
        generate_now(std::move(r), req, img2img ? "/sdapi/v1/img2img" : "/sdapi/v1/txt2img");
    const GenerateResult& first = made.first;
    json seed_strings = json::array();
    for (uint64_t seed : made.seeds) seed_strings.push_back(std::to_string(seed));
    json info = {{"prompt", body.value("prompt", "")},
                 {"negative_prompt", body.value("negative_prompt", "")},
                 {"seed", made.seeds.front()},
                 {"all_seeds", made.seeds},
                 {"seed_str", seed_strings.front()},  // extensions: the seeds as strings
                 {"all_seeds_str", seed_strings},
                 {"width", first.width},
                 {"height", first.height},
                 {"steps", first.steps},
                 {"cfg_scale", first.guidance},
                 {"sampler_name", "Euler"},
                 {"infotexts", made.infotexts}};
    if (first.strength) info["denoising_strength"] = *first.strength;
    json parameters = body;
    if (img2img) parameters.erase("init_images"), parameters.erase("mask");  // no echo of images
    return {{"images", made.png}, {"parameters", parameters}, {"info", info.dump()}};
  }

  // Runs a handler of `name` (its label in /metrics): the reply as JSON, or the error in the
  // API family's shape. A handler may take the response too (to set its status); one that
  // answers null has written the response itself.
  template <class Fn>
  httplib::Server::Handler route(bool openai, std::string name, Fn fn) {
    return [this, openai, name, fn](const httplib::Request& req, httplib::Response& res) {
      HttpError error{0, ""};
      try {
        if (!authorized(req))
          throw HttpError{401, "missing or wrong API key (Authorization: Bearer KEY)"};
        json reply;
        if constexpr (std::is_invocable_v<Fn, const httplib::Request&, httplib::Response&>)
          reply = fn(req, res);
        else
          reply = fn(req);
        if (!reply.is_null()) res.set_content(reply.dump(), "application/json");
        return;
      } catch (const HttpError& e) {
        error = e;
      } catch (const std::bad_alloc&) {
        error = {500, "out of memory"};
      } catch (const std::exception& e) {
        error = {500, e.what()};
      }
      metrics.error(name, kind_of(error));
      const int status = error.status;
      res.status = status;
      const json body =
          openai ? json{{"error", {{"message", error.message},
                                   {"type", status == 400 || status == 401
                                                ? "invalid_request_error"
                                                : "server_error"},
                                   {"code", status}}}}
                 : json{{"error", status_name(status)}, {"detail", error.message}};
      res.set_content(body.dump(), "application/json");
    };
  }

  json health(httplib::Response& res) {
    const Model* m = model.load();
    bool busy;
    int queue;
    {
      const std::lock_guard lock(mutex);
      busy = running;
      queue = int(line.size());
    }
    if (!m) res.status = 503;  // not ready: a load balancer sends nothing here yet
    json reply = {{"status", m ? "ok" : "loading"},
                  {"model", m ? json(m->name) : json(nullptr)},
                  {"busy", busy},
                  {"queue", queue}};
    if (m) {
      // What this model's requests may carry beyond a prompt (the page shows only these).
      const Capabilities c = capabilities(*m);
      reply["family"] = c.family;
      reply["accepts"] = {{"references", c.references},
                          {"init_image", c.image_to_image},
                          {"negative_prompt", c.guidance},
                          {"cfg_normalization", c.guidance_options},
                          {"cfg_truncation", c.guidance_options},
                          {"loras", c.loras}};
    }
    return reply;
  }

  std::string metrics_text() {
    Metrics::Gauges g;
    g.jobs = kept_jobs();
    {
      const std::lock_guard lock(mutex);
      g.queue = int(line.size());
      g.running = running;
    }
    g.ready = model.load() != nullptr;
    g.peak_rss = peak_rss_bytes();
    return metrics.render(g);
  }

  void install_routes() {
    http.set_payload_max_length(options.max_body_bytes);
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(kServerPage, "text/html; charset=utf-8");
    });
    // Open without the API key, for probes and scrapers.
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(health(res).dump(), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Post("/v1/images/generations",
              route(true, "/v1/images/generations",
                    [this](const httplib::Request& q) { return openai_generations(q); }));
    http.Post("/v1/images/edits",
              route(true, "/v1/images/edits",
                    [this](const httplib::Request& q) { return openai_edits(q); }));
    http.Post("/sdapi/v1/txt2img",
              route(false, "/sdapi/v1/txt2img",
                    [this](const httplib::Request& q) { return a1111(q, false); }));
    http.Post("/sdapi/v1/img2img",
              route(false, "/sdapi/v1/img2img",
                    [this](const httplib::Request& q) { return a1111(q, true); }));
    http.Get("/sdapi/v1/progress",
             route(false, "/sdapi/v1/progress",
                   [this](const httplib::Request&) { return progress_reply(); }));
    http.Get("/sdapi/v1/loras", route(false, "/sdapi/v1/loras", [this](const httplib::Request&) {
               json list = json::array();
               for (const auto& [name, _] : loras)
                 list.push_back({{"name", name}, {"alias", name}});
               return list;
             }));
    http.Post("/sdapi/v1/interrupt",
              route(false, "/sdapi/v1/interrupt",
                    [this](const httplib::Request&) { return interrupt(); }));
    http.Post("/v1/jobs",
              route(true, "/v1/jobs", [this](const httplib::Request& q, httplib::Response& r) {
                return submit_job(q, r);
              }));
    http.Get(R"(/v1/jobs/([0-9a-f]+))",
             route(true, "/v1/jobs/{id}", [this](const httplib::Request& q) {
               const std::shared_ptr<Job> job = find_job(q.matches[1].str());
               const std::lock_guard lock(jobs_mutex);
               return job_json(*job, true);
             }));
    http.Delete(R"(/v1/jobs/([0-9a-f]+))",
                route(true, "/v1/jobs/{id}", [this](const httplib::Request& q) {
                  return delete_job(q.matches[1].str());
                }));
    http.Get(R"(/v1/jobs/([0-9a-f]+)/events)",
             route(true, "/v1/jobs/{id}/events",
                   [this](const httplib::Request& q, httplib::Response& r) {
                     job_events(q, r);
                     return json();
                   }));
  }
};

Server::Server(Compute& cx, ServerOptions options)
    : impl_(std::make_unique<Impl>(cx, std::move(options))) {
  const ServerOptions& o = impl_->options;
  check(o.max_queue >= 0, "--max-queue: expected 0 or more, got ", o.max_queue);
  check(o.port >= 0 && o.port <= 65535, "--port: expected 0 to 65535, got ", o.port);
  check(o.max_jobs >= 1, "--max-jobs: expected 1 or more, got ", o.max_jobs);
  check(o.job_ttl_seconds > 0, "--job-ttl: expected seconds above 0, got ", o.job_ttl_seconds);
  impl_->install_routes();
}

Server::Server(Model& model, Compute& cx, ServerOptions options) : Server(cx, std::move(options)) {
  set_model(model);
}

Server::~Server() = default;

void Server::set_model(Model& model) { impl_->model.store(&model); }

int Server::bind() {
  Impl& s = *impl_;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
    check(s.port > 0, "cannot listen on ", s.options.host, " (any port)");
  } else {
    check(s.http.bind_to_port(s.options.host, s.options.port), "cannot listen on ", s.options.host,
          ":", s.options.port, " (in use, or not an address of this machine)");
    s.port = s.options.port;
  }
  return s.port;
}

void Server::run() {
  Impl& s = *impl_;
  {
    const std::lock_guard lock(s.mutex);
    if (s.stopping) return;
    s.serving = true;
  }
  s.http.listen_after_bind();
  s.serving = false;
}

void Server::stop() {
  Impl& s = *impl_;
  bool serving;
  {
    const std::lock_guard lock(s.mutex);
    s.stopping = true;
    serving = s.serving;
  }
  s.turn.notify_all();
  s.cx.cancel();
  // cpp-httplib's stop() does nothing before its listen loop has started: wait for it (run()
  // may have just been called).
  while (serving && s.serving && !s.http.is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.http.stop();
}

}  // namespace klein
