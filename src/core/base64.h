#pragma once
// Base64 (RFC 4648, standard alphabet, '=' padding), for images carried in JSON and HTML.
#include <optional>
#include <string>
#include <string_view>

namespace klein {

std::string base64_encode(std::string_view bytes);
// The bytes, or none when the text is not base64. Whitespace (line breaks) is skipped; the
// padding may be missing.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace klein
