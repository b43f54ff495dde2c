// Server: the options checked, the routes of every API registered (each in a file of its own,
// around the core of impl.cpp), and the socket's life: bind, run, stop.
#include "server/server.h"

#include <chrono>
#include <thread>

#include "core/error.h"
#include "server/impl.h"

namespace klein {

Server::Server(Compute& cx, ServerOptions options)
    : impl_(std::make_unique<Impl>(cx, std::move(options))) {
  Impl& s = *impl_;
  const ServerOptions& o = s.options;
  check(o.max_queue >= 0, "--max-queue: expected 0 or more, got ", o.max_queue);
  check(o.port >= 0 && o.port <= 65535, "--port: expected 0 to 65535, got ", o.port);
  check(o.max_jobs >= 1, "--max-jobs: expected 1 or more, got ", o.max_jobs);
  check(o.job_ttl_seconds > 0, "--job-ttl: expected seconds above 0, got ", o.job_ttl_seconds);
  s.http.set_payload_max_length(o.max_body_bytes);
  serve::add_service_routes(s.http, s);
  serve::add_openai_routes(s.http, s);
  serve::add_a1111_routes(s.http, s);
  serve::add_jobs_routes(s.http, s);
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
