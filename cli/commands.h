#pragma once
// Subcommand registry. Each subcommand lives in its own cli/<name>.cpp and registers a
// function that adds it to the app:
//
//   static klein::cli::Registration reg("inspect", 20, [](CLI::App& app) { ... });
//
// `order` sorts the subcommands in --help.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace klein::cli {

using AddCommand = std::function<void(CLI::App&)>;

struct Registration {
  Registration(std::string name, int order, AddCommand add);
};

void register_commands(CLI::App& app);

// The exit status of a run that a check stopped: an image flagged by the safety classifier
// (klein safety, generate --safety) or a prompt by the prompt check (klein check-prompt,
// generate --check-prompt). Errors exit with 1.
constexpr int kExitFlagged = 2;

}  // namespace klein::cli
