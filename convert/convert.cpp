#include "convert/convert.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "convert/arrival.h"
#include "convert/policy.h"
#include "convert/storage.h"
#include "core/error.h"
#include "core/files.h"
#include "core/threadpool.h"
#include "core/version.h"
#include "formats/container/writer.h"
#include "formats/gguf_types.h"
#include "formats/xxh3.h"
#include "ops/low_rank.h"
#include "quant/matmul.h"
#include "quant/types.h"
#include "tokenizer/tokenizer.h"
#include "weights/container_store.h"
#include "weights/extra_component.h"
#include "weights/family.h"
#include "weights/fp8.h"
#include "weights/naming.h"
#include "weights/safety_model.h"
#include "weights/source_store.h"

namespace klein::convert {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Float32 elements converted per slice: bounds the conversion buffers (this many floats
// plus their packed bytes) whatever the tensor size.
constexpr int64_t kSliceElements = int64_t(8) << 20;

void check_cancel(const ConvertOptions& o) {
  if (o.cancel && o.cancel->load())
    fail("conversion interrupted; ", o.output.string(), " not written");
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --- what is kept, in which order -----------------------------------------------------

// "text_encoder.layer.12" -> 12, else -1.
int64_t text_layer_of(const std::string& unit) {
  const std::string p = "text_encoder.layer.";
  if (unit.rfind(p, 0) != 0) return -1;
  return std::stoll(unit.substr(p.size()));
}

int64_t trailing_index(const std::string& unit) {
  return std::stoll(unit.substr(unit.rfind('.') + 1));
}

// File order of the units: every text-encoder layer, every double block, every single
// block, the transformer's shared tensors, the token embedding table, the VAE encoder, the
// VAE decoder, the latent statistics.
std::pair<int, int64_t> unit_rank(const std::string& u) {
  if (text_layer_of(u) >= 0) return {0, text_layer_of(u)};
  if (u.rfind("transformer.double.", 0) == 0) return {1, trailing_index(u)};
  if (u.rfind("transformer.single.", 0) == 0) return {2, trailing_index(u)};
  if (u == "transformer.shared") return {3, 0};
  if (u == "text_encoder.embed") return {4, 0};
  if (u == "vae.encoder") return {5, 0};
  if (u == "vae.decoder") return {6, 0};
  if (u == "vae.latent_stats") return {7, 0};
  if (u.rfind("controlnet.", 0) == 0) return {9, 0};  // the networks beside the model, last
  if (u.rfind("safety.", 0) == 0) return {10, 0};
  if (u.rfind("tiny_vae.", 0) == 0) return {11, 0};
  return {8, 0};
}

// Why inference never reads a unit, or "" when it does.
std::string unit_drop_reason(const std::string& unit, const TextEncoderConfig& e) {
  if (unit == "text_encoder.norm")
    return "final norm of the text encoder: the pipeline reads hidden states before it";
  if (unit == "text_encoder.lm_head")
    return "language-model head (Qwen3-8B stores it, Qwen3-4B ties it to the token "
           "embedding): image generation reads hidden states, never logits";
  const int64_t layer = text_layer_of(unit);
  if (layer >= e.layers_needed())
    return "text encoder layer " + std::to_string(layer) + ": the pipeline reads hidden states " +
           "up to layer " + std::to_string(e.layers_needed()) + " (1-based) only";
  return "";
}

std::string tensor_drop_reason(const std::string& canonical) {
  if (canonical.rfind("text_encoder.lm_head.", 0) == 0)
    return "language-model head (Qwen3-4B ties it to the token embedding, Qwen3-8B stores it): "
           "the pipeline reads hidden states, never logits";
  if (canonical.find("num_batches_tracked") != std::string::npos)
    return "BatchNorm batch counter: not used at inference";
  return "never read by inference";
}

// --- the conversion record -------------------------------------------------------------

struct SourceFile {
  std::string name;
  fs::path path;
};

std::string display_name(const fs::path& p, const fs::path& model_dir) {
  if (!model_dir.empty()) {
    std::error_code ec;
    const fs::path rel = fs::relative(p, model_dir, ec);
    if (!ec && !rel.empty() && rel.native().rfind("..", 0) != 0) return rel.generic_string();
  }
  return p.filename().string();
}

std::vector<SourceFile> source_files(const ConvertOptions& o, const WeightStore& store) {
  std::vector<SourceFile> out;
  const fs::path dir =
      o.source.model.empty() || !fs::is_directory(o.source.model) ? fs::path() : o.source.model;
  auto add = [&](const fs::path& p) {
    for (const auto& f : out)
      if (fs::equivalent(f.path, p)) return;
    out.push_back({display_name(p, dir), p});
  };
  if (!dir.empty()) {
    // The configuration files of a diffusers directory (the tokenizer is recorded apart).
    std::vector<fs::path> configs;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file() || e.path().extension() != ".json") continue;
      const fs::path rel = fs::relative(e.path(), dir);
      if (*rel.begin() == "tokenizer" || std::distance(rel.begin(), rel.end()) > 2) continue;
      configs.push_back(e.path());
    }
    std::sort(configs.begin(), configs.end());
    for (const auto& p : configs) add(p);
  }
  for (const auto& f : store.origin().files) add(f);
  return out;
}

// XXH3 of a whole file through a read-only mapping of its own, in order; gives up (returning
// "") when `stop()` says so. No copy: the pages the conversion has faulted in are hashed where
// they lie in the page cache (read() cost a copy of every source byte, ~10 % of a Q4
// convert's time), and each piece is dropped from this process once hashed, so the resident
// size does not grow with the file.
std::string hash_file(const fs::path& path, uint64_t& bytes, const std::function<bool()>& stop) {
  const MappedFile file(path);
  constexpr size_t kPiece = size_t(8) << 20;
  if (file.size() > 0) ::madvise(const_cast<std::byte*>(file.data()), file.size(), MADV_SEQUENTIAL);
  xxh3::Hasher hasher;
  bytes = 0;
  for (size_t at = 0; at < file.size(); at += kPiece) {
    if (stop()) return {};
    const size_t n = std::min(kPiece, file.size() - at);
    hasher.update(file.data() + at, n);
    ::madvise(const_cast<std::byte*>(file.data() + at), n, MADV_DONTNEED);
    bytes += n;
  }
  return stop() ? std::string() : container::hex64(hasher.digest());
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  // Reproducible builds: a fixed date when asked for one.
  if (const char* epoch = std::getenv("SOURCE_DATE_EPOCH")) t = std::time_t(std::atoll(epoch));
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// --- source pages ------------------------------------------------------------------------

// The mapped source files, so that pages already converted can be dropped from the process
// (they stay in the page cache): only ranges inside these mappings are ever dropped.
class SourcePages {
 public:
  explicit SourcePages(const WeightStore& store) : maps_(store.origin().mappings) {}
  void drop(const void* data, size_t n) const {
    const auto* p = static_cast<const std::byte*>(data);
    for (const auto& [base, size] : maps_) {
      if (p < base || p + n > base + size) continue;
      const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
      uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
      uintptr_t end = (reinterpret_cast<uintptr_t>(p + n) + page - 1) / page * page;
      begin = std::max(begin, reinterpret_cast<uintptr_t>(base) / page * page);
      end = std::min(end, (reinterpret_cast<uintptr_t>(base + size) + page - 1) / page * page);
      if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
      return;
    }
  }

 private:
  std::vector<std::pair<const std::byte*, size_t>> maps_;
};

// --- one tensor --------------------------------------------------------------------------

struct Planned {
  const Weight* source;
  StorageFormat format;
  uint64_t size;
};

// Float32 values of rows [r0, r1) of a source tensor.
void read_rows(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t cols = w.cols();
  if (w.dtype == DType::GGML) {  // GGUF blocks, decoded as gguf-py decodes them
    const size_t row_bytes = w.rows() > 0 ? w.nbytes / size_t(w.rows()) : 0;
    for (int64_t r = r0; r < r1; ++r)
      gguf::decode_row(gguf::TensorType(w.layout), static_cast<const std::byte*>(w.data) + size_t(r) * row_bytes,
                       out + (r - r0) * cols, cols);
    return;
  }
  if (dtype_is_fp8(w.dtype)) {  // codes x scale, as the checkpoint defines them
    decode_fp8_rows(w.dtype, static_cast<const std::byte*>(w.data), r0, r1, cols, w.scale,
                    w.scale_count, w.origin.empty() ? w.name : w.origin, out);
    return;
  }
  if (dtype_is_float(w.dtype) && w.layout == 0) {
    const size_t row_bytes = size_t(cols) * dtype_size(w.dtype);
    to_f32(w.dtype, static_cast<const std::byte*>(w.data) + size_t(r0) * row_bytes, out,
           size_t(r1 - r0) * size_t(cols));
    return;
  }
  StorageFormat f = storage_format(w.dtype);
  f.layout = w.layout;
  unpack_rows(w.data, w.nbytes, f, w.rows(), cols, r0, r1, out);
}

// Index of the first NaN or Inf among n stored float values (any alignment), or n.
size_t first_non_finite(DType t, const std::byte* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::F32) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      if ((v & 0x7f800000u) == 0x7f800000u) return i;
    } else {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      const uint16_t exp = t == DType::BF16 ? 0x7f80 : 0x7c00;
      if ((v & exp) == exp) return i;
    }
  }
  return n;
}

[[noreturn]] void fail_non_finite(const Weight& w, size_t index) {
  const int64_t cols = std::max<int64_t>(w.cols(), 1);
  fail("tensor ", w.name, " holds NaN or Inf (row ", int64_t(index) / cols, ", column ",
       int64_t(index) % cols, "): the checkpoint is damaged; it would make a flat or noisy image");
}

void check_f16_range(const Weight& w, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(v[i]) && std::fabs(v[i]) > 65504.0f)
      fail("tensor ", w.name, " holds the value ", v[i], ", beyond the range of F16 (65504);",
           " store it as bf16 or f32 (a policy line \"", w.name, " bf16\")");
}

class TensorConverter {
 public:
  TensorConverter(container::ContainerWriter& out, ThreadPool& pool, const SourcePages& pages,
                  const ConvertOptions& o, const Adapters& adapters)
      : out_(out), pool_(pool), pages_(pages), o_(o), adapters_(adapters) {}

  uint64_t source_bytes = 0;

  void convert(const Planned& p) {
    const Weight& w = *p.source;
    container::TensorEntry e;
    e.name = w.name;
    e.type = p.format.type;
    e.layout = p.format.layout;
    e.block_size = p.format.block_size;
    e.shape = w.shape;
    e.size = p.size;
    out_.begin_tensor(e);
    if (o_.arrival) {
      o_.arrival->wait(w.data, w.nbytes, o_.cancel);
      check_cancel(o_);
    }
    const int64_t rows = w.rows(), cols = w.cols();
    const std::span<const LoraUpdate> updates = adapters_.on(w.name);
    if (quant::is_quantized(w.dtype) && w.dtype == p.format.type && w.layout == 0 && updates.empty()) {
      // The same blocks (GGUF Q8_0 is our Q8): dealt into the kernels' layout as they are,
      // no value requantized.
      const int64_t g = p.format.row_granularity;
      const int64_t slice_rows = std::max(g, kSliceElements / std::max<int64_t>(cols, 1) / g * g);
      const size_t src_row_bytes = rows > 0 ? w.nbytes / size_t(rows) : 0;
      packed_.resize(storage_size(p.format, std::min(slice_rows, rows), cols));
      for (int64_t r0 = 0; r0 < rows; r0 += slice_rows) {
        check_cancel(o_);
        const int64_t r1 = std::min(rows, r0 + slice_rows);
        const auto* src = static_cast<const std::byte*>(w.data) + size_t(r0) * src_row_bytes;
        quant::pack_blocks(src, r1 - r0, cols, w.dtype, quant::Layout(p.format.layout), packed_.data());
        out_.write(packed_.data(), storage_size(p.format, r1 - r0, cols));
        pages_.drop(src, size_t(r1 - r0) * src_row_bytes);
      }
    } else if (w.dtype == p.format.type && w.layout == 0 && p.format.layout == 0 && updates.empty()) {
      // Same plain type: the bytes as they are (bit-exact, NaN payloads included).
      const size_t slice = size_t(kSliceElements) * dtype_size(w.dtype);
      for (size_t at = 0; at < w.nbytes; at += slice) {
        check_cancel(o_);
        const size_t n = std::min(slice, w.nbytes - at);
        const auto* bytes = static_cast<const std::byte*>(w.data) + at;
        if (dtype_is_float(w.dtype)) {
          const size_t elem = dtype_size(w.dtype), bad = first_non_finite(w.dtype, bytes, n / elem);
          if (bad < n / elem) fail_non_finite(w, at / elem + bad);
        }
        out_.write(bytes, n);
        pages_.drop(static_cast<const std::byte*>(w.data) + at, n);
      }
    } else {
      const int64_t g = p.format.row_granularity;
      int64_t slice_rows = std::max<int64_t>(1, kSliceElements / std::max<int64_t>(cols, 1));
      slice_rows = std::max(g, slice_rows / g * g);
      floats_.resize(size_t(std::min(slice_rows, rows)) * size_t(cols));
      packed_.resize(storage_size(p.format, std::min(slice_rows, rows), cols));
      const size_t src_row_bytes = rows > 0 ? w.nbytes / size_t(rows) : 0;
      for (int64_t r0 = 0; r0 < rows; r0 += slice_rows) {
        check_cancel(o_);
        const int64_t r1 = std::min(rows, r0 + slice_rows);
        // Rows are handed out to the threads in pieces that start on the granularity.
        const int64_t groups = (r1 - r0 + g - 1) / g;
        pool_.parallel_for(groups, [&](int64_t gb, int64_t ge, int) {
          const int64_t a = r0 + gb * g, b = std::min(r1, r0 + ge * g);
          float* f = floats_.data() + size_t(a - r0) * size_t(cols);
          read_rows(w, a, b, f);
          const size_t values = size_t(b - a) * size_t(cols);
          if (const size_t bad = first_non_finite(DType::F32, reinterpret_cast<std::byte*>(f), values);
              bad < values)
            fail_non_finite(w, size_t(a) * size_t(cols) + bad);
          for (const LoraUpdate& u : updates)  // merged LoRAs: W[a:b] += s · B[a:b] · A
            ops::merge_low_rank(u.down.data(), u.up.row(a), b - a, cols, u.down.dim(0), u.scale, f);
          if (p.format.type == DType::F16) check_f16_range(w, f, size_t(b - a) * size_t(cols));
          pack_rows(f, b - a, cols, p.format,
                    packed_.data() + storage_size(p.format, a - r0, cols));
        });
        out_.write(packed_.data(), storage_size(p.format, r1 - r0, cols));
        if ((dtype_is_float(w.dtype) || dtype_is_fp8(w.dtype)) && w.layout == 0)
          pages_.drop(static_cast<const std::byte*>(w.data) + size_t(r0) * src_row_bytes,
                      size_t(r1 - r0) * src_row_bytes);
      }
    }
    source_bytes += w.nbytes;
    out_.end_tensor();
    if (o_.arrival) o_.arrival->consumed(w.data, w.nbytes);
  }

 private:
  container::ContainerWriter& out_;
  ThreadPool& pool_;
  const SourcePages& pages_;
  const ConvertOptions& o_;
  const Adapters& adapters_;
  std::vector<float> floats_;
  std::vector<std::byte> packed_;
};

// The tokenizer files are stored as they are; they must load first, so that a container is
// never written with a tokenizer that fails only when it is used (the error names the files).
void check_tokenizer(const TokenizerBytes& bytes) { (void)Tokenizer(bytes.files()); }

}  // namespace

ConvertSummary convert_model(const ConvertOptions& o) {
  check(!o.output.empty(), "no output file given (-o FILE)");
  check(!fs::is_directory(o.output), "output ", o.output.string(),
        " is a directory; give a file name");
  const PrecisionPolicy policy =
      o.policy_text.empty() ? PrecisionPolicy()
                            : PrecisionPolicy::with_user_rules(o.policy_text, o.policy_origin);
  if (!o.keep) (void)storage_format(o.target);  // fails early for a type this build cannot write
  auto note = [&](const std::string& s) {
    if (o.stage) o.stage(s);
  };

  note("opening the source model");
  const std::unique_ptr<WeightStore> opened = o.store ? nullptr : open_model(o.source);
  WeightStore* const store = o.store ? o.store : opened.get();
  // fp8 weights as stored: read_rows decodes each slice (a unit in float32 would be ~1 GB).
  if (auto* source = dynamic_cast<SourceStore*>(store)) source->set_decode_fp8(false);
  const StoreOrigin origin = store->origin();
  if (o.arrival) {
    o.arrival->attach(origin);
    // fp8 scales are read when a unit is acquired: such sources are converted once they
    // have arrived whole.
    if (!origin.stored_types.empty()) {
      o.arrival->planned();
      for (const auto& [base, size] : origin.mappings) o.arrival->wait(base, size, o.cancel);
      check_cancel(o);
    }
  }
  const ModelConfig& config = store->config();
  check(config.undecided_variant.empty(), config.undecided_variant);
  const TokenizerBytes tokenizer = read_tokenizer_files(o.source, store);
  check_tokenizer(tokenizer);
  json merged_loras = json::array();
  if (!o.loras.empty()) note("reading " + std::to_string(o.loras.size()) + " LoRA file(s)");
  const Adapters adapters = Adapters::load(o.loras, config);
  for (const LoraFile& f : o.loras) {
    uint64_t bytes = 0;
    merged_loras.push_back({{"file", f.path.filename().string()},
                            {"scale", f.scale},
                            {"xxh3", hash_file(f.path, bytes, [] { return false; })}});
  }

  // Networks stored beside the model (weights/extra_component.h): new ones (their units
  // replace a container source's of the same key), and a container source's others, carried
  // over with their units.
  std::vector<ExtraComponent> extras;
  if (!o.safety_model.empty()) {
    note("opening the safety classifier " + o.safety_model.string());
    extras.push_back(safety_component(open_safety_model(o.safety_model)));
  }
  if (!o.controlnet.empty()) {
    note("opening the control model " + o.controlnet.string());
    extras.push_back(model_family(config).open_control_model(o.controlnet, config));
  }
  for (const auto& open : o.extra_components) extras.push_back(open(config));
  json extra_meta = json::object();
  auto new_extra = [&](const std::string& unit) -> const ExtraComponent* {
    for (const ExtraComponent& e : extras)
      if (in_extra_component(unit, e.key)) return &e;
    return nullptr;
  };
  for (const ExtraComponent& e : extras) extra_meta[e.key] = e.metadata;
  if (const nlohmann::json* meta = origin.container_metadata)
    for (const char* key : kExtraComponentKeys)
      if (meta->contains(key) && !extra_meta.contains(key)) extra_meta[key] = (*meta)[key];
  // The store a unit is read from.
  auto source_of = [&](const std::string& u) -> WeightStore& {
    const ExtraComponent* e = new_extra(u);
    return e ? *e->store : *store;
  };

  // What goes in, in which order, and what is dropped.
  json dropped = json::array();
  std::vector<std::string> units;
  for (const ExtraComponent& e : extras)
    for (const auto& u : e.store->units()) units.push_back(u);
  for (const auto& u : store->units()) {
    if (new_extra(u)) continue;  // replaced by the new network of its key
    const std::string why = o.keep_llm ? "" : unit_drop_reason(u, config.text_encoder);
    if (why.empty()) {
      units.push_back(u);
      continue;
    }
    const UnitRef ref = store->describe(u);  // views only: nothing is read
    for (const auto& w : ref->weights()) dropped.push_back({{"tensor", w.name}, {"reason", why}});
  }
  for (const auto& t : origin.unused_tensors)
    dropped.push_back({{"tensor", t}, {"reason", tensor_drop_reason(t)}});
  if (const nlohmann::json* meta = origin.container_metadata)
    if (meta->contains("conversion") && (*meta)["conversion"].contains("dropped"))
      for (const auto& d : (*meta)["conversion"]["dropped"]) dropped.push_back(d);
  std::stable_sort(units.begin(), units.end(), [](const std::string& a, const std::string& b) {
    return unit_rank(a) < unit_rank(b);
  });

  // The record of where the weights came from: the source files are hashed on a second
  // thread while the units are converted (both read the same files, through the page cache),
  // and the metadata that records them is written after the units.
  std::atomic<bool> stop_hashing{false};
  std::vector<SourceFile> hashed_files = source_files(o, *store);
  for (const ExtraComponent& e : extras)
    for (const auto& f : e.store->origin().files)
      hashed_files.push_back({e.key + "/" + f.filename().string(), f});
  std::future<json> hashing = std::async(std::launch::async, [&, files = hashed_files] {
    const Clock::time_point start = Clock::now();
    json sources = json::array();
    const std::function<bool()> stop = [&] {
      return stop_hashing.load() || (o.cancel && o.cancel->load());
    };
    for (const auto& f : files) {
      uint64_t bytes = 0;
      std::string h;
      // A file still arriving is hashed by its downloader as the bytes pass.
      if (auto known = o.arrival ? o.arrival->source_xxh3(f.path, stop) : std::nullopt)
        std::tie(h, bytes) = *known;
      else
        h = hash_file(f.path, bytes, stop);
      sources.push_back({{"file", f.name}, {"bytes", bytes}, {"xxh3", h}});
    }
    return json{{"sources", sources}, {"seconds", since(start)}};
  });
  // Leaving early (an error, a cancellation) stops the hashing before waiting for it.
  struct StopHashing {
    std::atomic<bool>& flag;
    ~StopHashing() { flag = true; }
  } stop_on_exit{stop_hashing};

  json tok = json::object();
  json tokenizer_sources = json::array();
  auto add_tokenizer = [&](const char* name, const std::optional<std::string>& text) {
    if (!text) return;
    tok[name] = *text;
    tokenizer_sources.push_back(
        {{"file", std::string("tokenizer/") + name},
         {"bytes", text->size()},
         {"xxh3", container::hex64(container::xxh3(text->data(), text->size()))}});
  };
  add_tokenizer("vocab.json", tokenizer.vocab_json);
  add_tokenizer("merges.txt", tokenizer.merges_txt);
  add_tokenizer("tokenizer_config.json", tokenizer.tokenizer_config_json);
  add_tokenizer("tokenizer.json", tokenizer.tokenizer_json);
  try {
    (void)tok.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception& e) {
    fail("the tokenizer files of ", tokenizer.origin, " are not valid UTF-8 text: ", e.what());
  }

  // Storage types, decided before anything is written.
  json fallbacks = json::array();
  std::map<std::string, std::vector<Planned>> plans;
  const std::map<std::string, DType>& stored_types = origin.stored_types;
  for (const auto& u : units) {
    UnitRef ref = source_of(u).describe(u);
    std::vector<const Weight*> ws;
    for (const auto& w : ref->weights()) ws.push_back(&w);
    std::sort(ws.begin(), ws.end(),
              [](const Weight* a, const Weight* b) { return a->name < b->name; });
    auto& plan = plans[u];
    for (const Weight* w : ws) {
      check(quant::is_storage_type(w->dtype) || w->dtype == DType::GGML || dtype_is_fp8(w->dtype), "tensor ", w->name, " is of type ",
            dtype_name(w->dtype), "; expected a weight storage type");
      DType target = o.target;
      if (o.keep && w->dtype == DType::GGML) {
        target = keep_precision_ggml(w->layout, w->name);
      } else if (o.keep) {
        auto it = stored_types.find(w->name);
        target = keep_precision(it != stored_types.end() ? it->second : w->dtype, w->name);
      }
      const auto choice = policy.choose(w->name, w->shape, target);
      DType type = choice.type;
      std::string why;
      if (!can_store(type, w->shape, &why)) {
        check(choice.rule == nullptr || choice.rule->at_least,
              choice.rule ? choice.rule->origin : "", ": rule \"",
              choice.rule ? choice.rule->text : "", "\" asks for ", storage_type_name(type),
              " for tensor ", w->name, " ", shape_str(w->shape), ", but ", why);
        fallbacks.push_back({{"tensor", w->name},
                             {"wanted", storage_type_name(type)},
                             {"stored", "bf16"},
                             {"reason", why}});
        type = DType::BF16;
      }
      const StorageFormat f = storage_format(type);
      plan.push_back({nullptr, f, storage_size(f, w->rows(), w->cols())});
      if (o.arrival) o.arrival->need(w->data, w->nbytes);
    }
  }
  if (o.arrival) o.arrival->planned();

  container::ContainerWriter out(o.output, o.alignment);
  if (o.on_temp_file) o.on_temp_file(out.temp_path());
  if (o.arrival) o.arrival->set_output(out.temp_path());
  note("writing " + o.output.string() + " (source files hashed alongside)");
  ThreadPool pool(o.threads);
  const SourcePages pages(*store);
  TensorConverter conv(out, pool, pages, o, adapters);
  ConvertSummary summary;
  const Clock::time_point t0 = Clock::now();
  // (Sources still arriving are not read ahead: the bytes are not there yet.)
  if (!units.empty() && !o.arrival) source_of(units[0]).prefetch(units[0]);
  for (size_t i = 0; i < units.size(); ++i) {
    check_cancel(o);
    // The kernel reads the next unit's source while this one is converted (a cold page cache
    // otherwise stalls the packing threads on every fault).
    if (i + 1 < units.size() && !o.arrival) source_of(units[i + 1]).prefetch(units[i + 1]);
    UnitRef ref = source_of(units[i]).acquire(units[i]);
    std::vector<const Weight*> ws;
    for (const auto& w : ref->weights()) ws.push_back(&w);
    std::sort(ws.begin(), ws.end(),
              [](const Weight* a, const Weight* b) { return a->name < b->name; });
    auto& plan = plans[units[i]];
    out.begin_unit(units[i]);
    for (size_t k = 0; k < ws.size(); ++k) {
      plan[k].source = ws[k];
      conv.convert(plan[k]);
      auto& totals = summary.by_type[storage_type_name(plan[k].format.type)];
      ++totals.tensors;
      totals.parameters += uint64_t(ws[k]->numel());
      totals.bytes += plan[k].size;
      ++summary.tensors;
    }
    out.end_unit();
    if (o.progress)
      o.progress(
          {i + 1, units.size(), units[i], conv.source_bytes, out.bytes_written(), since(t0)});
  }
  check_cancel(o);

  note("waiting for the source checksums");
  const json hashed = hashing.get();
  check_cancel(o);
  json sources = hashed["sources"];
  for (const auto& t : tokenizer_sources) sources.push_back(t);
  json meta = {
      {"format", "klein-container"},
      {"config", to_json(config)},
      {"tokenizer", tok},
      {"conversion",
       {{"program", "klein"},
        {"version", KLEIN_VERSION},
        {"date", utc_now()},
        {"target_type", o.keep ? std::string("keep") : storage_type_name(o.target)},
        {"policy_file", o.policy_origin.empty() ? json(nullptr) : json(o.policy_origin)},
        {"policy", policy.text()},
        {"alignment", o.alignment},
        {"sources", sources},
        {"dropped", dropped},
        {"fallbacks", fallbacks},
        {"merged_loras", merged_loras}}},
  };
  for (const auto& [key, value] : extra_meta.items()) meta[key] = value;
  out.write_metadata(meta.dump(-1, ' ', false, json::error_handler_t::strict));
  out.commit();
  summary.output = o.output;
  summary.file_bytes = fs::file_size(o.output);
  summary.units = units.size();
  summary.dropped = dropped.size();
  summary.hash_seconds = hashed["seconds"].get<double>();
  summary.convert_seconds = since(t0);
  return summary;
}

}  // namespace klein::convert
