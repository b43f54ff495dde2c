#pragma once
// Errors that reach the user. Every failure caused by input (a file, a tensor, an option)
// is thrown as klein::Error with a message that names what was wrong and what was expected;
// the CLI catches it, prints it and exits non-zero. Library code never exits or aborts.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace klein {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds a message from any streamable parts: fail("tensor ", name, ": expected ", n).
template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(out.str());
}

template <class... Parts>
void check(bool ok, Parts&&... parts) {
  if (!ok) fail(std::forward<Parts>(parts)...);
}

}  // namespace klein
