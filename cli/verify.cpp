// klein verify FILE: checks every checksum of a container and names what is bad.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "convert/inspect.h"
#include "core/error.h"

namespace klein::cli {
namespace {

struct VerifyArgs {
  std::string file;
  bool quiet = false;
};

void run_verify(const VerifyArgs& a) {
  auto progress = [&](size_t done, size_t total) {
    if (!a.quiet) std::fprintf(stderr, "\rchecking unit %zu/%zu", done, total);
  };
  const convert::VerifyOutcome v = convert::verify_model_container(a.file, progress);
  if (!a.quiet) std::fprintf(stderr, "\n");
  for (const auto& m : v.model) std::printf("BAD model: %s\n", m.c_str());
  for (const auto& p : v.data.problems)
    std::printf("BAD %s %s: %s\n", p.region.c_str(), p.name.c_str(), p.message.c_str());
  if (!v.ok())
    fail(a.file, ": ", v.data.problems.size() + v.model.size(), " problem(s) found (listed above)");
  std::printf("%s: ok (header, index, metadata, %zu units, %zu tensors, %.1f MB checked)\n",
              a.file.c_str(), v.data.units_checked, v.data.tensors_checked,
              double(v.data.bytes_checked) / 1e6);
}

}  // namespace

static Registration reg("verify", 30, [](CLI::App& app) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check every checksum of a klein container and name each bad unit or tensor");
  cmd->add_option("file", a->file, "the container file")->required();
  cmd->add_flag("-q,--quiet", a->quiet, "no progress on stderr");
  cmd->callback([a] { run_verify(*a); });
});

}  // namespace klein::cli
