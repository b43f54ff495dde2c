#include "cli/commands.h"

#include <algorithm>
#include <vector>

namespace klein::cli {
namespace {

struct Entry {
  std::string name;
  int order;
  AddCommand add;
};

// Function-local so that registrations from other files' static initialisers are safe.
std::vector<Entry>& entries() {
  static std::vector<Entry> list;
  return list;
}

}  // namespace

Registration::Registration(std::string name, int order, AddCommand add) {
  entries().push_back({std::move(name), order, std::move(add)});
}

void register_commands(CLI::App& app) {
  auto list = entries();
  std::sort(list.begin(), list.end(),
            [](const Entry& a, const Entry& b) { return a.order < b.order; });
  for (auto& e : list) e.add(app);
}

}  // namespace klein::cli
