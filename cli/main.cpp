// klein: the command-line front end. Each subcommand lives in its own file and registers
// itself here; this file only builds the CLI11 app and turns errors into exit codes.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/memory.h"
#include "core/version.h"
#include "weights/family.h"

int main(int argc, char** argv) {
  CLI::App app{"klein: " + klein::family_titles() + " image generation on the CPU"};
  app.set_version_flag("--version", std::string("klein ") + KLEIN_VERSION);
  app.require_subcommand(1);
  klein::cli::register_commands(app);
  klein::install_mapping_fault_handler();  // a model file truncated mid-run: a message, not SIGBUS
  klein::map_large_allocations();           // freed activations go back to the system
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const klein::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
