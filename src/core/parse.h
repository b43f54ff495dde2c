#pragma once
// Numbers typed by users (command-line options, request fields), parsed strictly: the whole
// text must be the number, and anything else is an error naming the option and what was
// expected.
#include <cstdint>
#include <string_view>

namespace klein {

// A seed: decimal digits only, 0 to 2^64 - 1. "-1", "1e3", "0x10" and overflow are refused.
uint64_t parse_seed(std::string_view text, std::string_view what);

}  // namespace klein
