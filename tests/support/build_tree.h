#pragma once
// What differs between the build trees a test program can belong to (Release, sanitizers,
// cross builds), answered at run time by klein_testing, the one file each tree compiles with
// its own definitions: the test programs' sources are compiled alike in every tree and share
// klein_testing's precompiled header, which GCC refuses where a definition differs.

namespace klein::testing {

// The klein CLI of this tree.
const char* klein_binary();

// Whether this tree's engine is built with AddressSanitizer and UBSan.
bool sanitized();

}  // namespace klein::testing
