#pragma once
// What differs between the build trees a test program can belong to, answered at run time by
// klein_testing, which each tree compiles for itself: the test programs' own objects are the
// same in every tree (the sanitizer tree links the Release tree's: tests/CMakeLists.txt,
// KLEIN_TEST_OBJECTS_FROM), so their code cannot ask the preprocessor.

namespace klein::testing {

// The klein CLI of this tree.
const char* klein_binary();

// Whether this tree's engine is built with AddressSanitizer and UBSan.
bool sanitized();

}  // namespace klein::testing
