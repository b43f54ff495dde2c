#pragma once
// The inside of `klein serve` (server.h), shared by the files that serve its APIs:
//
//   impl.cpp            the core: the queue that gives generations their turn, the generation
//                       runner with its live progress, and the one mapping of exceptions to
//                       HTTP answers (api_route)
//   openai_routes.cpp   POST /v1/images/generations and /v1/images/edits
//   a1111_routes.cpp    /sdapi/v1/*
//   jobs_routes.cpp     /v1/jobs: asynchronous generations on a thread each
//   service_routes.cpp  the page, /health and /metrics
//   server.cpp          Server: checks the options, registers the routes, binds, runs, stops
//
// Each route file registers its routes with one function, given the state explicitly.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeline/prompt_check.h"
#include "server/connection.h"
#include "server/metrics.h"
#include "server/requests.h"
#include "server/server.h"

namespace klein {

struct Server::Impl {
  Compute& cx;
  ServerOptions options;
  httplib::Server http;
  int port = 0;
  std::atomic<Model*> model{nullptr};  // null while the model opens (set_model)
  Metrics metrics;
  // With options.check_prompt: made at the first request and kept, with the keys and values
  // of BFL's fixed text, for every later one (used by the generating request only).
  std::unique_ptr<PromptChecker> prompt_checker;

  // One generation at a time; the others wait in turn.
  std::mutex mutex;
  std::condition_variable turn;
  bool running = false;
  // The places taken in the queue (serve::Slot) by synchronous requests and jobs that wait,
  // by number, first come first.
  std::deque<uint64_t> line;
  uint64_t next_place = 0;
  // The requests waiting (under `mutex`): the line, less its first when nothing runs (between
  // two generations the next one is still in the line until it takes its turn; it is not
  // waiting behind anyone). At most --max-queue.
  int waiting() const { return int(line.size()) - (!running && !line.empty() ? 1 : 0); }
  bool stopping = false;
  std::atomic<bool> serving{false};  // inside run()'s listen (set under `mutex`)

  std::map<std::string, std::filesystem::path> loras;  // --lora-dir

  // An asynchronous job (POST /v1/jobs): its own thread runs it through the same queue as the
  // synchronous requests. Everything but `id` and `thread` is guarded by jobs_mutex.
  struct Job {
    std::string id;
    std::string state = "queued";      // queued, running, done, failed, cancelled
    bool cancel = false;               // DELETE came: the job stops at its next step
    nlohmann::json result;             // done: the /v1/images/generations reply
    requests::HttpError error{0, ""};  // failed or cancelled: why
    int step = 0, steps = 0;           // finished: the last progress seen
    std::string preview;
    uint64_t place = 0;                // its place in the queue (Slot::place)
    std::chrono::steady_clock::time_point finished_at;
    std::thread thread;

    bool finished() const { return state != "queued" && state != "running"; }
  };
  std::mutex jobs_mutex;
  std::map<std::string, std::shared_ptr<Job>> jobs;

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

  Impl(Compute& c, ServerOptions o);
  // Cancels the running generation, refuses the waiting ones and joins the jobs' threads.
  ~Impl();

  // The open model; 503 while it is still loading.
  Model& ready_model();
};

namespace serve {

using json = nlohmann::json;
using Impl = Server::Impl;
using Job = Server::Impl::Job;
using requests::HttpError;
using requests::ImageRequest;

// --- the queue -------------------------------------------------------------------------------

// Who a generation is for: the route it came through (for /metrics), and how to tell that
// nobody wants it any more: the client of a synchronous request closed its connection, or
// its job was deleted.
struct Ticket {
  std::string route;
  const ClientConnection* client = nullptr;
  std::shared_ptr<Job> job;
};

// A place in the queue, taken when constructed (429 when max_queue are waiting already),
// then the turn to generate (take), held until destroyed. Turns go in the order the places
// were taken.
class Slot {
 public:
  explicit Slot(Impl& s);
  // Waits for the turn (nobody running and this place first in line), looking every 100 ms
  // whether the requester is still there.
  void take(const Ticket& t);
  ~Slot();
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  uint64_t place() const { return place_; }

 private:
  void leave_line();  // s_.mutex held
  Impl& s_;
  uint64_t place_ = 0;
  bool queued_ = false, holding_ = false;
};

// --- the generation runner -------------------------------------------------------------------

struct Made {
  std::string upsampled_prompt;  // the prompt upsampling wrote (empty: the request's was used)
  std::vector<std::string> png;  // base64 PNG files, with their metadata
  std::vector<uint64_t> seeds;
  std::vector<std::string> infotexts;
  GenerateResult first;
};

// Waits for the slot's turn and runs the request's images through the stages. Input the
// pipeline refuses before the first image has started is the client's fault (400); later
// failures are ours (500); cancellation (stop(), interrupt, the requester gone) is 503.
Made generate(Impl& s, ImageRequest request, Slot& slot, const Ticket& t);

// A synchronous request: a place in the queue, then the generation, cancelled when the
// client closes its connection. `route` is its label in /metrics.
Made generate_now(Impl& s, ImageRequest r, const httplib::Request& req, const std::string& route);

// A per-request directory for uploaded images (the pipeline reads files), removed with it.
class UploadDir {
 public:
  UploadDir();
  ~UploadDir();
  UploadDir(const UploadDir&) = delete;
  UploadDir& operator=(const UploadDir&) = delete;

  // Writes the bytes as an image file named after the request field.
  std::filesystem::path write(const std::string& field, const std::string& bytes);

 private:
  std::filesystem::path dir_;
};

// The images a request carried in its body (the control image, references, init image and
// mask) written to files, the options pointing at them: into `dir`, or into a new directory
// (null when the request has none), which must outlive the generation.
void place_uploads(requests::ImageRequest& r, UploadDir& dir);
std::shared_ptr<UploadDir> place_uploads(requests::ImageRequest& r);

// --- errors and routes -----------------------------------------------------------------------

// The one translation of an exception into an HTTP answer: an HttpError as thrown, anything
// else a 500 with its message. Exceptions that are no std::exception are thrown on.
HttpError http_error(const std::exception_ptr& thrown);
// The label of an error in /metrics.
std::string kind_of(const HttpError& e);

// The shape of the error body: OpenAI's {"error": {"message", "type", "code"}} or A1111's
// {"error": "<status name>", "detail"}.
enum class Api { OpenAI, A1111 };

// A route's work: the reply as JSON, or null when it has written the response itself. It may
// set the response's status.
using Handler = std::function<json(const httplib::Request&, httplib::Response&)>;

// A handler of `name` (its label in /metrics) behind the API key: the reply as JSON, or the
// error (counted in /metrics) in the API's shape.
httplib::Server::Handler api_route(Impl& s, Api api, std::string name, Handler fn);

// The request body as a JSON object; 400 otherwise.
json parse_json(const httplib::Request& req);

// OpenAI's reply to a generation (/v1/images/generations, /v1/images/edits, a finished job).
json openai_reply(const Made& made, const std::string& prompt);

// The jobs kept (any state), forgetting those past --job-ttl first: for /metrics.
int kept_jobs(Impl& s);

// Each API's routes.
void add_openai_routes(httplib::Server& http, Impl& s);
void add_a1111_routes(httplib::Server& http, Impl& s);
void add_jobs_routes(httplib::Server& http, Impl& s);
void add_service_routes(httplib::Server& http, Impl& s);

}  // namespace serve
}  // namespace klein
