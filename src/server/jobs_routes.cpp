// Asynchronous generations: POST /v1/jobs takes an /v1/images/generations body and answers at
// once; the job runs on a thread of its own through the same queue as the synchronous
// requests; GET /v1/jobs/{id} (and its /events stream) shows it, DELETE cancels or forgets it.
#include <algorithm>
#include <cstdio>

#include "core/random.h"
#include "server/impl.h"

namespace klein::serve {

using namespace requests;

namespace {

// 128 random bits in hex: a job's id, not guessable by another client.
std::string new_job_id() {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx",
                static_cast<unsigned long long>(os_random_u64()),
                static_cast<unsigned long long>(os_random_u64()));
  return text;
}

// A job as GET /v1/jobs/{id} shows it (jobs_mutex held).
json job_json(Impl& s, const Job& j, bool with_result) {
  json r = {{"id", j.id},       {"state", j.state},
            {"progress", 0.0},  {"step", j.step},
            {"steps", j.steps}, {"preview", j.preview.empty() ? json() : json(j.preview)}};
  if (j.state == "running") {
    const std::lock_guard lock(s.live_mutex);
    const Impl::Live& live = s.live;
    if (live.active && live.job == j.id) {
      r["progress"] = live.fraction();
      r["phase"] = live.phase;
      r["step"] = live.step;
      r["steps"] = live.steps;
      if (!live.preview.empty()) r["preview"] = live.preview;
    }
  }
  if (j.state == "queued") {
    // How many requests run or wait before it (synchronous ones and other jobs alike).
    const std::lock_guard lock(s.mutex);
    const auto at = std::find(s.line.begin(), s.line.end(), j.place);
    r["queue_position"] = int64_t(at - s.line.begin()) + (s.running ? 1 : 0);
  }
  if (j.state == "done") {
    r["progress"] = 1.0;
    if (with_result) r["result"] = j.result;
  }
  if (j.error.status != 0) r["error"] = {{"message", j.error.message}, {"code", j.error.status}};
  if (j.cancel && !j.finished()) r["cancel_requested"] = true;
  return r;
}

// Takes the jobs finished longer than --job-ttl ago out of the table (jobs_mutex held); the
// caller joins their threads after letting go of the lock.
std::vector<std::shared_ptr<Job>> expire_jobs(Impl& s) {
  std::vector<std::shared_ptr<Job>> gone;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = s.jobs.begin(); it != s.jobs.end();) {
    const Job& j = *it->second;
    if (j.finished() &&
        std::chrono::duration<double>(now - j.finished_at).count() > s.options.job_ttl_seconds) {
      gone.push_back(it->second);
      it = s.jobs.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

void join(const std::vector<std::shared_ptr<Job>>& done) {
  for (const auto& job : done)
    if (job->thread.joinable()) job->thread.join();
}

std::shared_ptr<Job> find_job(Impl& s, const std::string& id) {
  std::vector<std::shared_ptr<Job>> expired;
  std::shared_ptr<Job> job;
  {
    const std::lock_guard lock(s.jobs_mutex);
    expired = expire_jobs(s);
    const auto it = s.jobs.find(id);
    if (it != s.jobs.end()) job = it->second;
  }
  join(expired);
  if (!job)
    throw HttpError{404, "no job \"" + id +
                             "\" (unknown, or forgotten: finished jobs are kept "
                             "for --job-ttl " +
                             std::to_string(int64_t(s.options.job_ttl_seconds)) + " s)"};
  return job;
}

// The job's thread: the generation, then its outcome kept for GET /v1/jobs/{id}.
void run_job(Impl& s, const std::shared_ptr<Job>& job, std::unique_ptr<Slot> slot,
             ImageRequest r) {
  const std::string prompt = r.options.prompt;
  const std::string route = "/v1/jobs";
  json result;
  HttpError error{0, ""};
  try {
    result = openai_reply(generate(s, std::move(r), *slot, Ticket{route, nullptr, job}), prompt);
  } catch (...) {
    error = http_error(std::current_exception());
  }
  Impl::Live last;
  {
    const std::lock_guard lock(s.live_mutex);
    if (s.live.job == job->id) last = s.live;
  }
  slot.reset();  // the next request's turn
  if (error.status != 0) s.metrics.error(route, kind_of(error));
  const std::lock_guard lock(s.jobs_mutex);
  job->step = last.step;
  job->steps = last.steps;
  job->preview = last.preview;
  job->result = std::move(result);
  job->error = error;
  job->state = error.status == 0               ? "done"
               : kind_of(error) == "cancelled" ? "cancelled"
                                               : "failed";
  job->finished_at = std::chrono::steady_clock::now();
}

// POST /v1/jobs: the request is read and given its place in the queue now (400 and 429
// come here), then runs on the job's thread.
json submit_job(Impl& s, const httplib::Request& req, httplib::Response& res) {
  s.ready_model();
  ImageRequest r = read_openai_json_request(parse_json(req), s.options);
  // The files of the images given in the body live as long as the job's thread.
  std::shared_ptr<UploadDir> uploads = place_uploads(r);
  take_lora_tags(r.options, s.loras);
  auto slot = std::make_unique<Slot>(s);
  auto job = std::make_shared<Job>();
  job->id = new_job_id();
  job->place = slot->place();
  std::vector<std::shared_ptr<Job>> dropped = {};
  json reply;
  {
    const std::lock_guard lock(s.jobs_mutex);
    dropped = expire_jobs(s);
    if (int(s.jobs.size()) >= s.options.max_jobs) {
      // Room for the new one: the job that finished first goes.
      auto oldest = s.jobs.end();
      for (auto it = s.jobs.begin(); it != s.jobs.end(); ++it)
        if (it->second->finished() &&
            (oldest == s.jobs.end() || it->second->finished_at < oldest->second->finished_at))
          oldest = it;
      if (oldest == s.jobs.end())
        throw HttpError{429,
                        "busy: " + std::to_string(s.jobs.size()) +
                            " jobs are queued or running (--max-jobs " +
                            std::to_string(s.options.max_jobs) + ")",
                        "queue_full"};
      dropped.push_back(oldest->second);
      s.jobs.erase(oldest);
    }
    s.jobs[job->id] = job;
    job->thread = std::thread(
        [&s, job, slot = std::move(slot), r = std::move(r), uploads = std::move(uploads)]() mutable {
          run_job(s, job, std::move(slot), std::move(r));
          uploads.reset();
        });
    reply = job_json(s, *job, false);
  }
  join(dropped);
  res.status = 202;
  return reply;
}

json delete_job(Impl& s, const std::string& id) {
  const std::shared_ptr<Job> job = find_job(s, id);
  std::unique_lock lock(s.jobs_mutex);
  if (!job->finished()) {
    job->cancel = true;  // seen at its next step, or within 100 ms while it waits
    return job_json(s, *job, false);
  }
  json reply = job_json(s, *job, false);
  reply["deleted"] = true;
  const bool mine = s.jobs.erase(id) == 1;  // not already taken out by another request
  lock.unlock();
  if (mine) join({job});
  return reply;
}

// GET /v1/jobs/{id}/events: a "progress" event whenever what GET /v1/jobs/{id} shows has
// changed (looked at every 100 ms), then the final state's event with the whole job.
void job_events(Impl& s, const httplib::Request& req, httplib::Response& res) {
  const std::shared_ptr<Job> job = find_job(s, req.matches[1].str());
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [&s, job, last = std::string()](size_t, httplib::DataSink& sink) mutable {
        std::string event, data;
        {
          const std::lock_guard lock(s.jobs_mutex);
          const bool end = job->finished();
          event = end ? job->state : "progress";
          data = job_json(s, *job, end).dump();
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

}  // namespace

int kept_jobs(Impl& s) {
  std::vector<std::shared_ptr<Job>> expired;
  size_t n;
  {
    const std::lock_guard lock(s.jobs_mutex);
    expired = expire_jobs(s);
    n = s.jobs.size();
  }
  join(expired);
  return int(n);
}

void add_jobs_routes(httplib::Server& http, Impl& s) {
  http.Post("/v1/jobs", api_route(s, Api::OpenAI, "/v1/jobs",
                                  [&s](const httplib::Request& req, httplib::Response& res) {
                                    return submit_job(s, req, res);
                                  }));
  http.Get(R"(/v1/jobs/([0-9a-f]+))",
           api_route(s, Api::OpenAI, "/v1/jobs/{id}",
                     [&s](const httplib::Request& req, httplib::Response&) {
                       const std::shared_ptr<Job> job = find_job(s, req.matches[1].str());
                       const std::lock_guard lock(s.jobs_mutex);
                       return job_json(s, *job, true);
                     }));
  http.Delete(R"(/v1/jobs/([0-9a-f]+))",
              api_route(s, Api::OpenAI, "/v1/jobs/{id}",
                        [&s](const httplib::Request& req, httplib::Response&) {
                          return delete_job(s, req.matches[1].str());
                        }));
  http.Get(R"(/v1/jobs/([0-9a-f]+)/events)",
           api_route(s, Api::OpenAI, "/v1/jobs/{id}/events",
                     [&s](const httplib::Request& req, httplib::Response& res) {
                       job_events(s, req, res);
                       return json();
                     }));
}

}  // namespace klein::serve
