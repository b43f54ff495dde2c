#include "core/parse.h"

#include <charconv>
#include <string>

#include "core/error.h"

namespace klein {

uint64_t parse_seed(std::string_view text, std::string_view what) {
  uint64_t value = 0;
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!digits || ec != std::errc() || end != text.data() + text.size())
    fail(what, ": expected a whole number from 0 to 18446744073709551615, got '", text, "'");
  return value;
}

}  // namespace klein
