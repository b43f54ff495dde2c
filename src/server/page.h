#pragma once
// The studio page `klein serve` answers GET / with: src/server/studio.html (HTML, CSS and
// script in one document), compiled in by CMake (src/server/page.cpp.in).
namespace klein {

extern const char* const kServerPage;

}  // namespace klein
