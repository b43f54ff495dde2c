#pragma once
// The web page `klein serve` answers GET / with (HTML, CSS and script in one document).
namespace klein {

extern const char* const kServerPage;

}  // namespace klein
