#pragma once
// A WeightStore over a klein container (docs/container.md): the file is mapped read-only and
// every unit is a set of views into the mapping, at whatever storage type and layout the
// conversion chose. A unit's bytes are checked against its XXH3 checksum every time its pages
// come in (paged) or once (resident); a corrupt unit is refused with an error naming it.
//
// Residency (weight_store.h): when paged (the default), the last reference to a unit going
// drops its pages from the process (madvise DONTNEED; they stay in the page cache while
// memory allows), and prefetch() reads the next unit ahead and checks it on the store's
// checking thread while the current one computes, so that the checks are not serial work of
// the steps. The check drops what it has hashed (the pages come in again from the page cache
// as the unit is used), so that resident memory follows what the network touches rather than
// the model. When resident, units stay mapped once paged in until release().
//
// Units must not outlive their store.
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "formats/container/reader.h"
#include "tokenizer/tokenizer.h"  // TokenizerBytes
#include "weights/model_source.h"
#include "weights/residency_tracker.h"
#include "weights/unit_lease.h"
#include "weights/weight_store.h"

namespace klein {

struct ContainerOptions {
  bool check_units = true;  // XXH3 of a unit at its first use and every time it is paged in
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
  // Asks the kernel to read the unit ahead and, when its pages are not checked, queues its
  // check for the checking thread. Allocates nothing after the store's first prefetch.
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
  // Checksum passes over units so far: run on the checking thread (read ahead) and on the
  // acquiring thread (not read ahead, or acquired before the checking thread reached it).
  struct Checks {
    int64_t background = 0, on_acquire = 0;
  };
  Checks checks() const;

 private:
  // Where a unit's checksum pass is: queued for the checking thread, or running (on that
  // thread or on an acquiring one that took it from the queue).
  enum class Check : uint8_t { Idle, Queued, Running };
  struct UnitState {
    const container::UnitEntry* entry = nullptr;
    std::string prefix;
    bool checked = false;  // since its pages last came in
    Check check = Check::Idle;
    bool in_queue = false;           // has an entry in queue_ (perhaps no longer Queued)
    uint32_t drops = 0;              // times its pages were dropped: a check that ran across
                                     // a drop does not count
    std::exception_ptr check_error;  // a failed background check, for the next acquire
    std::unique_ptr<WeightUnit> views;  // built at the first acquire, kept (views only)
    LeaseSlot slot;                     // where the live reference's lease is made
    std::weak_ptr<const WeightUnit> live;
    UnitRef kept;  // resident: the unit stays mapped until release()
  };
  class Unit;
  // Makes sure the unit's pages are checked before acquire hands them out: waits for a check
  // under way, runs a queued or missing one itself. Throws the check's error.
  void check_unit_locked(UnitState& s, std::unique_lock<std::mutex>& lock);
  // One checksum pass over the unit without the lock; records the outcome in s.
  void run_check_locked(UnitState& s, std::unique_lock<std::mutex>& lock);
  void checker_loop();
  // Drops the unit's pages from the process; they are checked again at the next page-in.
  void drop_pages(UnitState& s);
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
  // The checking thread, started by the first prefetch that queues a check, and its queue
  // (a ring of at most one entry per unit: a unit is queued only when Idle). Under mutex_.
  std::thread checker_;
  std::condition_variable check_queued_;  // the checking thread waits for work
  std::condition_variable check_ended_;   // acquires wait for a check under way
  std::vector<UnitState*> queue_;
  size_t queue_head_ = 0, queue_size_ = 0;
  bool stopping_ = false;
  Checks checks_;
};

// The bytes a tensor of this type, layout and shape takes in a container; throws naming the
// tensor when this build cannot read the type.
uint64_t stored_tensor_bytes(const std::string& name, DType type, uint8_t layout,
                             uint32_t block_size, const Shape& shape);

// The tokenizer files of a model given as paths, from where tokenizer_source says: a
// directory, a GGUF text encoder's metadata (as the files Qwen3 ships) or a container.
// `opened`: the model's weights as opened from the same paths, whose container (when the
// tokenizer is that container's) is not opened and parsed a second time.
TokenizerBytes read_tokenizer_files(const ModelPaths& paths, const WeightStore* opened = nullptr);

}  // namespace klein
