#include "core/random.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#if defined(__linux__)
#include <sys/random.h>
#endif

#include "core/error.h"

namespace klein {

uint64_t os_random_u64() {
  uint64_t value = 0;
#if defined(__linux__)
  // Up to 256 bytes are never returned short once the kernel's pool is ready; EINTR can still
  // come before that.
  for (;;) {
    const ssize_t got = getrandom(&value, sizeof value, 0);
    if (got == ssize_t(sizeof value)) return value;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno != ENOSYS) fail("random bits: getrandom failed: ", std::strerror(errno));
    break;  // an old kernel without the call: read the device instead
  }
#endif
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  check(f != nullptr, "random bits: cannot open /dev/urandom: ", std::strerror(errno));
  const size_t got = std::fread(&value, sizeof value, 1, f);
  std::fclose(f);
  check(got == 1, "random bits: cannot read 8 bytes from /dev/urandom");
  return value;
}

}  // namespace klein
