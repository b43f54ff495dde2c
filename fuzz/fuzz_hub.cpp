// libFuzzer target: what the Hugging Face Hub sends `klein pull` before any download: a page
// of the file-list API, its Link header, and model_index.json, which choose the files (and
// so the paths written under the download folder); and what a chat completions service answers
// a remote prompt upsampling (hub/chat.h).
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_support.h"
#include "hub/chat.h"
#include "hub/hub.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = klein::fuzz::split<3>(data, size);
  const klein::hub::Repo repo{"owner/name", "main"};
  (void)klein::hub::next_link(std::string(parts[1]));
  try {
    (void)klein::hub::chat_answer(std::string(parts[1]));
  } catch (const klein::Error&) {
  }
  try {
    const auto files = klein::hub::parse_file_list(std::string(parts[0]), repo);
    for (const auto& f : klein::hub::files_for_conversion(files, std::string(parts[2]), repo)) {
      // Every chosen file lands at DIR/<path>: one folder level at most, no way out.
      const std::string p = "/" + f.path + "/";
      if (p.find("/../") != std::string::npos || p.find("/./") != std::string::npos ||
          p.find("//") != std::string::npos)
        __builtin_trap();
    }
  } catch (const klein::Error&) {
  }
  return 0;
}
