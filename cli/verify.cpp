// klein verify FILE: checks every checksum of a container and names what is bad.
#include <unistd.h>

#include <algorithm>
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
  // On a terminal one line rewritten in place; into a file or pipe a line per tenth of the
  // units (and the last).
  const bool terminal = ::isatty(::fileno(stderr)) == 1;
  size_t last_tenth = 0;
  auto progress = [&](size_t done, size_t total) {
    if (a.quiet) return;
    if (terminal) {
      std::fprintf(stderr, "\rchecking unit %zu/%zu", done, total);
      return;
    }
    const size_t tenth = 10 * done / std::max<size_t>(total, 1);
    if (tenth == last_tenth && done != total) return;
    last_tenth = tenth;
    std::fprintf(stderr, "checking unit %zu/%zu\n", done, total);
  };
  const convert::VerifyOutcome v = convert::verify_model_container(a.file, progress);
  if (!a.quiet && terminal) std::fprintf(stderr, "\n");
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

static Registration verify_command("verify", 30, [](CLI::App& app) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check every checksum of a klein container and name each bad unit or tensor");
  cmd->add_option("file", a->file, "the container file")->required();
  cmd->add_flag("-q,--quiet", a->quiet, "no progress on stderr");
  cmd->callback([a] { run_verify(*a); });
});

}  // namespace klein::cli
