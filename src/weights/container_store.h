#pragma once
// A WeightStore over a klein container (docs/container.md): the file is mapped read-only and
// every unit is a set of views into the mapping, at whatever storage type and layout the
// conversion chose. A unit's bytes are checked against its XXH3 checksum the first time it is
// acquired (or prefetched) in this process; a corrupt unit is refused with an error naming
// it. When the last reference to a unit goes, its pages are dropped from the process
// (madvise DONTNEED; they stay in the page cache while memory allows), so that resident
// memory follows the units in use rather than the model.
//
// Units must not outlive their store.
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "formats/container/reader.h"
#include "weights/model_source.h"
#include "weights/weight_store.h"

namespace klein {

struct ContainerOptions {
  bool check_on_first_acquire = true;  // XXH3 of a unit the first time it is paged in
  bool drop_on_release = true;         // drop a unit's pages when its last reference goes
};

// The contents of a model's tokenizer files (absent ones are nullopt); klein::TokenizerFiles
// can view them.
struct TokenizerBytes {
  std::string origin;  // where they came from, for error messages
  std::optional<std::string> vocab_json;
  std::optional<std::string> merges_txt;
  std::optional<std::string> tokenizer_config_json;
  std::optional<std::string> tokenizer_json;
};

class ContainerStore final : public WeightStore {
 public:
  // Opens and checks the container: header, index and metadata checksums and structure,
  // the configuration, every expected tensor present with its shape and a storage size that
  // matches its type. Tensor data is read later, unit by unit.
  explicit ContainerStore(const std::filesystem::path& path, ContainerOptions options = {});
  ~ContainerStore() override;

  UnitRef acquire(const std::string& unit) override;
  // Asks the kernel to read the unit ahead and checks its checksum on a background thread.
  void prefetch(const std::string& unit) override;
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override;  // in file order
  const ModelConfig& config() const override { return config_; }
  // "klein-container:" + the header checksum, which covers the index and through it the
  // checksum of every unit.
  std::string identity() const override;

  const container::ContainerFile& file() const { return file_; }
  TokenizerBytes tokenizer_files() const;

 private:
  struct UnitState {
    const container::UnitEntry* entry = nullptr;
    std::string prefix;
    bool checked = false;
    std::shared_future<void> checking;  // a prefetch's background check
    std::weak_ptr<const WeightUnit> live;
  };
  void check_unit_locked(UnitState& s, std::unique_lock<std::mutex>& lock);

  container::ContainerFile file_;
  ContainerOptions options_;
  ModelConfig config_;
  std::map<std::string, UnitState> units_;
  std::vector<std::string> order_;
  std::mutex mutex_;
};

// The bytes a tensor of this type, layout and shape takes in a container; throws naming the
// tensor when this build cannot read the type.
uint64_t stored_tensor_bytes(const std::string& name, DType type, uint8_t layout,
                             uint32_t block_size, const Shape& shape);

// The tokenizer files of a model given as paths: from the container when -m is a
// container, else from the tokenizer directory (find_tokenizer_dir).
TokenizerBytes read_tokenizer_files(const ModelPaths& paths);

}  // namespace klein
