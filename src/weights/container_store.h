#pragma once
// A WeightStore over a klein container (docs/container.md): the file is mapped read-only and
// every unit is a set of views into the mapping, at whatever storage type and layout the
// conversion chose. A unit's bytes are checked against its XXH3 checksum the first time it is
// acquired (or prefetched) in this process; a corrupt unit is refused with an error naming
// it.
//
// Residency (weight_store.h): when paged (the default), the last reference to a unit going
// drops its pages from the process (madvise DONTNEED; they stay in the page cache while
// memory allows), prefetch() reads the next unit ahead on a background thread, and the
// checksum pass drops what it has hashed, so that resident memory follows the units in use
// rather than the model. When resident, units stay mapped once paged in until release().
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
#include "tokenizer/tokenizer.h"  // TokenizerBytes
#include "weights/model_source.h"
#include "weights/residency_tracker.h"
#include "weights/unit_lease.h"
#include "weights/weight_store.h"

namespace klein {

struct ContainerOptions {
  bool check_on_first_acquire = true;  // XXH3 of a unit every time it is paged in
  Residency residency = Residency::Paged;
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
  bool has_quantized(const std::string& prefix) const override;

  void set_residency(Residency r) override;
  Residency residency() const override;
  uint64_t unit_bytes(const std::string& unit) const override;
  void release(const std::string& prefix) override;
  StoreOrigin origin() const override;

  const container::ContainerFile& file() const { return file_; }
  TokenizerBytes tokenizer_files() const;

 private:
  struct UnitState {
    const container::UnitEntry* entry = nullptr;
    std::string prefix;
    bool checked = false;               // since its pages last came in
    bool checked_before = false;        // at some earlier page-in
    std::shared_future<void> checking;  // a prefetch's background check (the first one)
    std::unique_ptr<WeightUnit> views;  // built at the first acquire, kept (views only)
    LeaseSlot slot;                     // where the live reference's lease is made
    std::weak_ptr<const WeightUnit> live;
    UnitRef kept;  // resident: the unit stays mapped until release()
  };
  class Unit;
  void check_unit_locked(UnitState& s, std::unique_lock<std::mutex>& lock);
  void drop_pages(const container::UnitEntry& e) const;
  // A unit object went (its last reference); drops its pages unless a newer one is live.
  void unit_gone(const std::string& name);
  // Takes the kept references of the units starting with `prefix` (all when empty), and
  // forgets read-ahead units under it; the caller destroys the references without the lock.
  std::vector<UnitRef> take_kept_locked(const std::string& prefix);

  container::ContainerFile file_;
  ContainerOptions options_;
  ModelConfig config_;
  std::map<std::string, UnitState> units_;
  std::vector<std::string> order_;
};

// The bytes a tensor of this type, layout and shape takes in a container; throws naming the
// tensor when this build cannot read the type.
uint64_t stored_tensor_bytes(const std::string& name, DType type, uint8_t layout,
                             uint32_t block_size, const Shape& shape);

// The tokenizer files of a model given as paths, from where tokenizer_source says: a
// directory, a GGUF text encoder's metadata (as the files Qwen3 ships) or a container.
TokenizerBytes read_tokenizer_files(const ModelPaths& paths);

}  // namespace klein
