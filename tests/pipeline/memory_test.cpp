// Memory: the --max-memory parser, the residency decision, the estimate, what a paged store
// keeps resident during a generation, and that paged and resident runs give the same image.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"
#include "formats/image/image.h"
#include "pipeline/memory_plan.h"
#include "pipeline/model_tokenizer.h"
#include "pipeline/pipeline.h"
#include "pipeline/stages.h"
#include "support/testing.h"
#include "support/tiny_container.h"
#include "weights/container_store.h"
#include "weights/model_source.h"

namespace klein {
namespace {

using testing::error_of;

namespace fs = std::filesystem;

constexpr uint64_t MiB = uint64_t(1) << 20;
constexpr uint64_t GiB = uint64_t(1) << 30;

// --- the size parser -----------------------------------------------------------------------

TEST(MemorySize, AcceptsTheUsualSpellings) {
  EXPECT_EQ(parse_memory_size("800M", "--max-memory"), 800 * MiB);
  EXPECT_EQ(parse_memory_size("800m", "--max-memory"), 800 * MiB);
  EXPECT_EQ(parse_memory_size("800MB", "--max-memory"), 800 * MiB);
  EXPECT_EQ(parse_memory_size("800MiB", "--max-memory"), 800 * MiB);
  EXPECT_EQ(parse_memory_size("1.5G", "--max-memory"), 3 * GiB / 2);
  EXPECT_EQ(parse_memory_size("2GiB", "--max-memory"), 2 * GiB);
  EXPECT_EQ(parse_memory_size("2 GiB", "--max-memory"), 2 * GiB);
  EXPECT_EQ(parse_memory_size("512k", "--max-memory"), 512 * uint64_t(1024));
  EXPECT_EQ(parse_memory_size("1T", "--max-memory"), 1024 * GiB);
  EXPECT_EQ(parse_memory_size("4096", "--max-memory"), 4096u);
  EXPECT_EQ(parse_memory_size("4096B", "--max-memory"), 4096u);
  EXPECT_EQ(parse_memory_size(".5G", "--max-memory"), GiB / 2);
}

TEST(MemorySize, RejectsWhatIsNotASize) {
  for (const char* bad : {"", "G", "abc", "-1G", "1.5.5G", "10Q", "2GiBs", "0", "0M", "1e9",
                          "99999999999T"}) {
    const std::string msg = error_of([&] { parse_memory_size(bad, "--max-memory"); });
    EXPECT_NE(msg.find("--max-memory"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("800M"), std::string::npos) << bad << ": " << msg;  // the accepted forms
  }
}

TEST(MemorySize, Formats) {
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(640 * 1024), "640 KiB");
  EXPECT_EQ(format_bytes(812 * MiB), "812 MiB");
  EXPECT_EQ(format_bytes(3 * GiB / 2), "1.50 GiB");
}

// --- the decision --------------------------------------------------------------------------

// fixed 100 MiB; the denoising phase needs 500 MiB paged, 3 GiB resident; one unit at a time
// the decoder's phase is the largest, 400 MiB.
MemoryEstimate example_need() {
  MemoryEstimate e;
  e.fixed = 100 * MiB;
  e.phases.push_back({"text encoder", 200 * MiB, 2 * GiB, 100 * MiB, 120 * MiB});
  e.phases.push_back({"denoise", 300 * MiB, 3 * GiB - 200 * MiB, 200 * MiB, 150 * MiB});
  e.phases.push_back({"vae decode", 100 * MiB, 100 * MiB, 300 * MiB, 100 * MiB});
  return e;
}

TEST(MemoryPlan, NeedIsTheLargestPhasePlusTheFixedPart) {
  const MemoryEstimate e = example_need();
  EXPECT_EQ(e.paged(), 100 * MiB + 500 * MiB);
  EXPECT_EQ(e.resident(), 100 * MiB + 3 * GiB);
  EXPECT_EQ(e.one_unit(), 100 * MiB + 400 * MiB);
}

TEST(MemoryPlan, PagedByDefaultEvenWhenEverythingFits) {
  for (uint64_t budget : {600 * MiB, GiB, 3 * GiB, 100 * MiB + 3 * GiB, 64 * GiB}) {
    const MemoryPlan p = plan_memory(example_need(), budget, 0);
    EXPECT_EQ(p.residency, Residency::Paged) << budget;
    EXPECT_TRUE(p.budget_given);
    EXPECT_EQ(p.budget, budget);
    EXPECT_NE(p.reason.find("paged (the default)"), std::string::npos) << p.reason;
    // The reason says what resident would cost.
    EXPECT_NE(p.reason.find("--residency resident"), std::string::npos) << p.reason;
  }
}

TEST(MemoryPlan, PagingReadsAheadOnlyWhenTheBudgetHoldsTwoUnits) {
  EXPECT_TRUE(plan_memory(example_need(), 600 * MiB, 0).read_ahead);
  // Between one unit at a time (500 MiB) and two (600 MiB): paged, nothing read ahead.
  for (uint64_t budget : {500 * MiB, 599 * MiB}) {
    const MemoryPlan p = plan_memory(example_need(), budget, 0);
    EXPECT_EQ(p.residency, Residency::Paged) << budget;
    EXPECT_FALSE(p.read_ahead) << budget;
    EXPECT_NE(p.reason.find("without read-ahead"), std::string::npos) << p.reason;
    EXPECT_NE(p.reason.find("600 MiB"), std::string::npos) << p.reason;  // what read-ahead needs
    EXPECT_NE(p.reason.find("500 MiB"), std::string::npos) << p.reason;  // what it runs in
  }
  // Forcing paged within such a budget does the same; resident is still refused.
  const MemoryPlan forced = plan_memory(example_need(), 550 * MiB, 0, Residency::Paged);
  EXPECT_FALSE(forced.read_ahead);
  EXPECT_NE(forced.reason.find("--residency"), std::string::npos) << forced.reason;
  EXPECT_TRUE(plan_memory(example_need(), GiB, 0, Residency::Paged).read_ahead);
  EXPECT_FALSE(plan_memory(example_need(), std::nullopt, 550 * MiB + 256 * MiB).read_ahead);
  EXPECT_TRUE(plan_memory(example_need(), std::nullopt, 16 * GiB).read_ahead);
}

TEST(MemoryPlan, GivenBudgetBelowOneUnitAtATimeIsRefusedNamingBothSizes) {
  const std::string msg = error_of([] { plan_memory(example_need(), 499 * MiB, 0); });
  EXPECT_NE(msg.find("--max-memory 499 MiB is too small"), std::string::npos) << msg;
  EXPECT_NE(msg.find("one unit at a time needs about 500 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vae decode"), std::string::npos) << msg;  // where the memory goes
  EXPECT_NE(msg.find("--max-memory 500M"), std::string::npos) << msg;
  const std::string forced =
      error_of([] { plan_memory(example_need(), 499 * MiB, 0, Residency::Paged); });
  EXPECT_NE(forced.find("--max-memory 500M"), std::string::npos) << forced;
}

TEST(MemoryPlan, DefaultBudgetComesFromTheAvailableMemory) {
  EXPECT_EQ(default_memory_budget(0), 0u);
  EXPECT_EQ(default_memory_budget(16 * GiB), 14 * GiB);           // an eighth kept back
  EXPECT_EQ(default_memory_budget(1 * GiB), 768 * MiB);           // at least 256 MiB
  EXPECT_EQ(default_memory_budget(100 * MiB), 0u);
  EXPECT_EQ(plan_memory(example_need(), std::nullopt, 16 * GiB).residency, Residency::Paged);
  EXPECT_EQ(plan_memory(example_need(), std::nullopt, 16 * GiB).budget, 14 * GiB);
  EXPECT_EQ(plan_memory(example_need(), std::nullopt, 2 * GiB).residency, Residency::Paged);
  // Short of memory without a budget from the user: paged anyway, and the reason says so.
  const MemoryPlan p = plan_memory(example_need(), std::nullopt, 512 * MiB);
  EXPECT_EQ(p.residency, Residency::Paged);
  EXPECT_FALSE(p.budget_given);
  EXPECT_FALSE(p.read_ahead);
  EXPECT_NE(p.reason.find("below what even paging one unit at a time needs"), std::string::npos)
      << p.reason;
  // Unknown available memory: paged.
  EXPECT_EQ(plan_memory(example_need(), std::nullopt, 0).residency, Residency::Paged);
}

TEST(MemoryPlan, ForcedResidencyIsCheckedAgainstAGivenBudget) {
  EXPECT_EQ(plan_memory(example_need(), 8 * GiB, 0, Residency::Paged).residency, Residency::Paged);
  EXPECT_EQ(plan_memory(example_need(), std::nullopt, 0, Residency::Resident).residency,
            Residency::Resident);
  const std::string msg =
      error_of([] { plan_memory(example_need(), GiB, 0, Residency::Resident); });
  EXPECT_NE(msg.find("--residency resident needs about"), std::string::npos) << msg;
}

// --- the tiny model as a container -----------------------------------------------------------

fs::path tiny_container() { return testing::shared_tiny_container("q8"); }

const Tokenizer& tiny_tokenizer() {
  static const Tokenizer tokenizer = [] {
    ModelPaths paths;
    paths.model = tiny_container();
    return load_model_tokenizer(paths);
  }();
  return tokenizer;
}

TEST(MemoryEstimate, FollowsTheUnitsAndTheImageSize) {
  ContainerStore store(tiny_container());
  MemoryPlanInputs small = stages_for(store.config()).memory_inputs(store.config());
  small.width = small.height = 64;
  MemoryPlanInputs large = small;
  large.width = large.height = 512;
  const MemoryEstimate a = estimate_memory(store, small), b = estimate_memory(store, large);
  ASSERT_EQ(a.phases.size(), 4u);
  EXPECT_EQ(a.phases[0].phase, "text encoder");
  EXPECT_EQ(a.phases[1].phase, "denoise set-up");
  EXPECT_EQ(a.phases[2].phase, "denoise");
  EXPECT_EQ(a.phases[3].phase, "vae decode");
  uint64_t transformer = 0, largest_block = 0;
  for (const auto& u : store.units())
    if (u.rfind("transformer.", 0) == 0) {
      transformer += store.unit_bytes(u);
      if (u != "transformer.shared") largest_block = std::max(largest_block, store.unit_bytes(u));
    }
  const uint64_t shared = store.unit_bytes("transformer.shared");
  // The set-up holds the shared unit with the first block read ahead, not the blocks'
  // activations.
  EXPECT_EQ(a.phases[1].weights_paged, shared + store.unit_bytes("transformer.double.0"));
  EXPECT_EQ(a.phases[1].weights_one_unit, shared);
  EXPECT_LT(a.phases[1].activations, a.phases[2].activations);
  EXPECT_EQ(a.phases[2].weights_resident, transformer);
  EXPECT_EQ(a.phases[2].weights_paged, 2 * largest_block);  // two double blocks, the largest
  EXPECT_EQ(a.phases[2].weights_one_unit, largest_block);
  EXPECT_LT(a.phases[2].weights_paged, a.phases[2].weights_resident);
  EXPECT_EQ(a.phases[3].weights_paged, store.unit_bytes("vae.decoder"));
  EXPECT_LE(a.paged(), a.resident());
  EXPECT_LE(a.one_unit(), a.paged());
  // Larger images need more activation memory, the same weights.
  EXPECT_GT(b.phases[2].activations, a.phases[2].activations);
  EXPECT_GT(b.phases[3].activations, a.phases[3].activations);
  EXPECT_EQ(b.phases[2].weights_paged, a.phases[2].weights_paged);
  // References add an encoding phase.
  MemoryPlanInputs edit = small;
  edit.references = {{64, 64}};
  EXPECT_EQ(estimate_memory(store, edit).phases[1].phase, "vae encode");
}

// Records which units are resident, as the store reports them.
struct ResidencyLog {
  std::mutex mutex;
  std::set<std::string> resident;
  std::map<std::string, int> loads;  // times a unit became resident
  size_t max_blocks = 0;             // transformer block units resident at once
  int prefetches = 0;                // read-ahead events
  size_t max_transformer = 0;        // transformer units (blocks + shared) at once
  bool shared_with_late_block = false;  // shared resident together with a block past the first two
  bool text_with_transformer = false;
  bool vae_with_transformer = false;
  bool vae_before_denoise_end = false;
  bool denoise_done = false;

  static bool is_block(const std::string& u) {
    return u.rfind("transformer.double.", 0) == 0 || u.rfind("transformer.single.", 0) == 0;
  }
  void on_event(const std::string& unit, UnitEvent event) {
    std::lock_guard lock(mutex);
    prefetches += event == UnitEvent::Prefetch;
    if (event == UnitEvent::Drop) {
      resident.erase(unit);
      return;
    }
    if (resident.insert(unit).second) ++loads[unit];
    size_t blocks = 0, transformer = 0;
    bool text = false, vae = false, late_block = false;
    for (const auto& u : resident) {
      if (is_block(u)) {
        ++blocks;
        late_block |= u != "transformer.double.0" && u != "transformer.double.1";
      }
      transformer += u.rfind("transformer.", 0) == 0;
      text |= u.rfind("text_encoder.", 0) == 0;
      vae |= u.rfind("vae.", 0) == 0 && u != "vae.latent_stats";
    }
    max_blocks = std::max(max_blocks, blocks);
    max_transformer = std::max(max_transformer, transformer);
    shared_with_late_block |= late_block && resident.count("transformer.shared");
    text_with_transformer |= text && transformer > 0;
    vae_with_transformer |= vae && transformer > 0;
    vae_before_denoise_end |= unit == "vae.decoder" && !denoise_done;
  }
};

// Records when the denoising phase ends, for the log above.
class PhaseWatch final : public Progress {
 public:
  explicit PhaseWatch(ResidencyLog& log) : log_(log) {}
  void end(const std::string& phase, double) override {
    if (phase == "denoise") {
      std::lock_guard lock(log_.mutex);
      log_.denoise_done = true;
    }
  }

 private:
  ResidencyLog& log_;
};

GenerateOptions tiny_options(Residency residency) {
  GenerateOptions o;
  o.prompt = "a small red cube";
  o.width = 64;
  o.height = 48;
  o.seed = 11;
  o.residency = residency;
  return o;
}

// A 3-step generation on the tiny container at the given residency, logging every unit event.
GenerateResult logged_generation(ContainerStore& store, ResidencyLog& log, Residency residency) {
  store.set_observer([&](const std::string& u, UnitEvent e) { log.on_event(u, e); });
  const Tokenizer& tokenizer = tiny_tokenizer();
  Compute cx(2);
  Session pipeline(store, tokenizer, cx);
  PhaseWatch progress(log);
  GenerateOptions o = tiny_options(residency);
  o.steps = 3;
  GenerateResult r = pipeline.generate(o, progress);
  store.set_observer({});
  return r;
}

TEST(Paging, PagedGenerationHoldsAboutTwoUnitsAndReleasesEachNetwork) {
  ContainerStore store(tiny_container());
  ResidencyLog log;
  const GenerateResult r = logged_generation(store, log, Residency::Paged);

  ASSERT_TRUE(r.memory);
  EXPECT_EQ(r.memory->residency, Residency::Paged);
  EXPECT_EQ(store.residency(), Residency::Paged);
  EXPECT_LE(log.max_blocks, 2u);             // one computing, the next read ahead
  EXPECT_LE(log.max_transformer, 3u);        // + shared while the first block is read ahead
  EXPECT_FALSE(log.shared_with_late_block);  // shared is released before the blocks run
  EXPECT_EQ(log.loads["transformer.shared"], 1);  // once per generation, all steps' modulation
  EXPECT_EQ(log.loads["transformer.double.1"], 3);  // once per step: paged
  EXPECT_FALSE(log.text_with_transformer);   // the text encoder is gone before denoising
  EXPECT_FALSE(log.vae_with_transformer);
  EXPECT_FALSE(log.vae_before_denoise_end);  // the decoder comes in only when it runs
  EXPECT_EQ(log.loads["vae.decoder"], 1);
  EXPECT_TRUE(log.resident.empty() ||
              (log.resident.size() == 1 && log.resident.count("vae.latent_stats")))
      << *log.resident.begin();
  EXPECT_EQ(r.step_seconds.size(), 3u);
  EXPECT_GE(r.weights.peak_units, 2u);
  EXPECT_LE(r.weights.peak_units, 3u);
}

TEST(Paging, WithoutReadAheadOneBlockIsResidentAtATimeAndTheImageIsTheSame) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  Compute cx(2);
  Progress quiet;
  std::vector<uint8_t> images[2];
  ResidencyLog logs[2];
  for (int i = 0; i < 2; ++i) {
    ContainerStore store(tiny_container());
    store.set_observer([&](const std::string& u, UnitEvent e) { logs[i].on_event(u, e); });
    store.set_residency(Residency::Paged);
    store.set_read_ahead(i == 0);
    GenerateOptions o = tiny_options(Residency::Paged);
    o.plan_memory = false;  // keep the setting above
    Session pipeline(store, tokenizer, cx);
    images[i] = pipeline.generate(o, quiet).image.rgb;
    store.set_observer({});
  }
  EXPECT_GT(logs[0].prefetches, 0);
  EXPECT_EQ(logs[0].max_blocks, 2u);
  EXPECT_EQ(logs[1].prefetches, 0);
  EXPECT_EQ(logs[1].max_blocks, 1u);
  EXPECT_EQ(images[0], images[1]);
}

TEST(Paging, ResidentGenerationLoadsEachUnitOnceAndReleasesAtTheEnd) {
  ContainerStore store(tiny_container());
  ResidencyLog log;
  const GenerateResult r = logged_generation(store, log, Residency::Resident);
  EXPECT_EQ(r.memory->residency, Residency::Resident);
  EXPECT_EQ(log.loads["transformer.double.1"], 1);
  EXPECT_EQ(log.loads["transformer.single.1"], 1);
  EXPECT_FALSE(log.text_with_transformer);  // each network is released when it is done
  EXPECT_FALSE(log.vae_with_transformer);
  EXPECT_EQ(store.residency_stats().units, 0u);
}

TEST(Paging, PagedAndResidentGiveTheSameImage) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  Compute cx(2);
  Progress quiet;
  std::vector<uint8_t> images[2];
  for (int i = 0; i < 2; ++i) {
    ContainerStore store(tiny_container());
    Session pipeline(store, tokenizer, cx);
    images[i] = pipeline.generate(tiny_options(i ? Residency::Resident : Residency::Paged), quiet)
                    .image.rgb;
  }
  EXPECT_EQ(images[0], images[1]);
  // The same on the safetensors.
  std::vector<uint8_t> source[2];
  for (int i = 0; i < 2; ++i) {
    auto store = open_model(testing::tiny_model());
    Session pipeline(*store, tokenizer, cx);
    source[i] = pipeline.generate(tiny_options(i ? Residency::Resident : Residency::Paged), quiet)
                    .image.rgb;
  }
  EXPECT_EQ(source[0], source[1]);
}

TEST(Paging, SafetensorsStorePagesToo) {
  auto store = open_model(testing::tiny_model());
  store->set_residency(Residency::Paged);
  ResidencyLog log;
  store->set_observer([&](const std::string& u, UnitEvent e) { log.on_event(u, e); });
  ModelPaths paths;
  paths.model = testing::tiny_model();
  const Tokenizer tokenizer = load_model_tokenizer(paths);
  Compute cx(2);
  Session pipeline(*store, tokenizer, cx);
  PhaseWatch progress(log);
  pipeline.generate(tiny_options(Residency::Paged), progress);
  store->set_observer({});
  EXPECT_LE(log.max_blocks, 2u);
  EXPECT_FALSE(log.text_with_transformer);
  EXPECT_EQ(log.loads["transformer.shared"], 1);
  EXPECT_GT(store->unit_bytes("transformer.double.0"), 0u);
}

// The VAE decode banded through the pipeline (every tensor past the latent resolution in a
// scratch file) gives the image of the whole-image decode, and the estimate follows the plan.
TEST(BandedVae, ThroughThePipelineGivesTheSameImage) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  Compute cx(2);
  Progress quiet;
  ContainerStore store(tiny_container());
  Session pipeline(store, tokenizer, cx);
  GenerateOptions whole = tiny_options(Residency::Paged);
  const GenerateResult a = pipeline.generate(whole, quiet);
  GenerateOptions banded = whole;
  banded.vae_memory.whole_limit = 0;
  banded.vae_memory.plane_limit = 0;
  banded.vae_memory.band_rows = 1;
  banded.vae_memory.scratch_dir = testing::temp_dir("banded-pipeline").string();
  const GenerateResult b = pipeline.generate(banded, quiet);
  EXPECT_EQ(a.image.rgb, b.image.rgb);
  ASSERT_TRUE(a.memory && b.memory);
  EXPECT_NE(a.memory->need.phases.back().activations, b.memory->need.phases.back().activations);
  // Inpainting with a reference: the init image and the reference are encoded banded too.
  const fs::path edit_dir = testing::tiny_dir().parent_path() / "klein-tiny-edit" / "vectors" /
                            "inpaint" / "inpaint_ref_s08_h64_w80";
  GenerateOptions edit = whole;
  edit.width = edit.height = 0;
  edit.init_image = edit_dir / "init.png";
  edit.mask = edit_dir / "mask.png";
  edit.references = {edit_dir / "ref.png"};
  GenerateOptions edit_banded = edit;
  edit_banded.vae_memory = banded.vae_memory;
  const GenerateResult c = pipeline.generate(edit, quiet);
  const GenerateResult d = pipeline.generate(edit_banded, quiet);
  EXPECT_EQ(c.image.rgb, d.image.rgb);
  ASSERT_TRUE(d.memory);
  EXPECT_EQ(d.memory->need.phases[1].phase, "vae encode");
  EXPECT_GT(d.memory->need.phases[1].scratch, 0u);
  // The encode stage makes its planes under the given directory (gone: it names it).
  {
    Generation g = pipeline.start(edit_banded, quiet);
    pipeline.encode_prompt(g, quiet);
    std::filesystem::remove_all(banded.vae_memory.scratch_dir);
    const std::string error = error_of([&] { pipeline.prepare_latents(g, quiet); });
    EXPECT_NE(error.find(banded.vae_memory.scratch_dir), std::string::npos) << error;
    std::filesystem::create_directories(banded.vae_memory.scratch_dir);
  }
  // The decode stage makes its planes under the given directory: gone after the check, the
  // decode names it.
  Generation g = pipeline.start(banded, quiet);
  pipeline.encode_prompt(g, quiet);
  pipeline.prepare_latents(g, quiet);
  pipeline.denoise(g, quiet);
  std::filesystem::remove_all(banded.vae_memory.scratch_dir);
  const std::string error = error_of([&] { pipeline.decode(g, quiet); });
  EXPECT_NE(error.find(banded.vae_memory.scratch_dir), std::string::npos) << error;
}

// Records the phases that started.
class PhaseList final : public Progress {
 public:
  void begin(const std::string& phase, int) override { phases.push_back(phase); }
  std::vector<std::string> phases;
};

// A scratch directory that cannot be used is found before any network runs, not at the
// decode after the denoising.
TEST(BandedVae, UnusableScratchDirectoryFailsBeforeAnyWork) {
  const Tokenizer& tokenizer = tiny_tokenizer();
  Compute cx(2);
  ContainerStore store(tiny_container());
  Session pipeline(store, tokenizer, cx);
  GenerateOptions o = tiny_options(Residency::Paged);
  o.vae_memory.whole_limit = 0;
  o.vae_memory.plane_limit = 0;
  o.vae_memory.scratch_dir = "/nonexistent/klein-scratch";
  PhaseList progress;
  const std::string error = error_of([&] { pipeline.generate(o, progress); });
  EXPECT_NE(error.find("/nonexistent/klein-scratch"), std::string::npos) << error;
  EXPECT_NE(error.find("TMPDIR"), std::string::npos) << error;
  EXPECT_TRUE(progress.phases.empty()) << progress.phases.front();
  // In memory (no plane past plane_limit) no directory is needed.
  o.vae_memory.plane_limit = size_t(1) << 40;
  PhaseList fine;
  EXPECT_FALSE(pipeline.generate(o, fine).image.rgb.empty());
}

// --- the CLI -------------------------------------------------------------------------------

TEST(MemoryCli, TooSmallABudgetFailsEarlyWithTheNeededSize) {
  const fs::path out = testing::temp_dir("cli-budget");
  std::string log;
  const std::string base = "generate -m " + tiny_container().string() +
                           " -p x -W 64 -H 64 --seed 1 --no-cache -o " + (out / "a.png").string();
  EXPECT_NE(testing::run_klein(base + " --max-memory 20M", &log), 0);
  EXPECT_NE(log.find("--max-memory 20 MiB is too small"), std::string::npos) << log;
  EXPECT_NE(log.find("needs about"), std::string::npos) << log;
  EXPECT_EQ(log.find("text encoder:"), std::string::npos) << log;  // nothing ran
  EXPECT_NE(testing::run_klein(base + " --max-memory 12Q", &log), 0);
  EXPECT_NE(log.find("--max-memory 12Q: unknown unit"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein(base + " --residency sometimes", &log), 0);
  EXPECT_TRUE(fs::is_empty(out));
}

TEST(MemoryCli, VerboseAndJsonReportTheDecisionTimesAndPeaks) {
  const fs::path out = testing::temp_dir("cli-report");
  std::string log;
  const std::string base = "generate -m " + tiny_container().string() +
                           " -p x -W 64 -H 64 --seed 1 --no-cache --threads 2 -o " +
                           (out / "a.png").string();
  ASSERT_EQ(testing::run_klein(base + " --max-memory 4G --verbose", &log), 0) << log;
  // Paged by default, even with memory to spare.
  EXPECT_NE(log.find("memory: paged (the default)"), std::string::npos) << log;
  EXPECT_NE(log.find("step 4"), std::string::npos) << log;
  EXPECT_NE(log.find("peak RSS"), std::string::npos) << log;

  ASSERT_EQ(testing::run_klein(base + " --residency paged --json", &log), 0) << log;
  nlohmann::json memory, result;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.value("event", "") == "memory") memory = j;
    if (j.value("event", "") == "result") result = j;
  }
  ASSERT_TRUE(memory.is_object()) << log;
  ASSERT_TRUE(result.is_object()) << log;
  EXPECT_EQ(memory["residency"], "paged");
  EXPECT_EQ(memory["read_ahead"], true);
  EXPECT_GT(memory["need_paged_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(memory["need_one_unit_bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(memory["need_one_unit_bytes"].get<uint64_t>(),
            memory["need_paged_bytes"].get<uint64_t>());
  EXPECT_EQ(result["residency"], "paged");
  EXPECT_EQ(result["step_seconds"].size(), 4u);
  EXPECT_EQ(result["threads"], 2);
  for (const char* phase : {"load", "text encoder", "denoise", "vae decode"}) {
    EXPECT_TRUE(result["timings"].contains(phase)) << phase;
    EXPECT_GT(result["phase_peak_rss_bytes"][phase].get<uint64_t>(), 0u) << phase;
  }
  EXPECT_GT(result["peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(result["weights_peak_units"].get<int>(), 3);
}

TEST(MemoryCli, DryRunPrintsTheEstimateAndRunsNothing) {
  const fs::path out = testing::temp_dir("cli-dry");
  std::string log;
  ASSERT_EQ(testing::run_klein("generate -m " + tiny_container().string() +
                                   " -p x -W 512 -H 512 --max-memory 2G --dry-run",
                               &log),
            0)
      << log;
  EXPECT_NE(log.find("memory: paged (the default)"), std::string::npos) << log;
  ASSERT_EQ(testing::run_klein("generate -m " + tiny_container().string() +
                                   " -p x -W 512 -H 512 --residency resident --dry-run",
                               &log),
            0)
      << log;
  EXPECT_NE(log.find("memory: resident (--residency)"), std::string::npos) << log;
  EXPECT_NE(log.find("vae decode"), std::string::npos) << log;
  EXPECT_EQ(log.find("text encoder:"), std::string::npos) << log;  // nothing ran
  ASSERT_EQ(testing::run_klein("generate -m " + tiny_container().string() +
                                   " -p x -W 512 -H 512 --residency paged --dry-run --json",
                               &log),
            0)
      << log;
  EXPECT_NE(log.find("\"event\":\"memory\""), std::string::npos) << log;
  EXPECT_EQ(log.find("\"event\":\"begin\""), std::string::npos) << log;
  EXPECT_EQ(log.find("scratch"), std::string::npos) << log;  // 512x512: decoded whole
  EXPECT_NE(testing::run_klein("generate -m " + tiny_container().string() + " -p x", &log), 0);
  EXPECT_NE(log.find("-o/--output is required"), std::string::npos) << log;
  // At 8192x8192 the decode runs banded: the plan says how much scratch it writes, and where.
  const fs::path scratch = testing::temp_dir("cli-dry-scratch");
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string saved = tmpdir ? tmpdir : "";
  ::setenv("TMPDIR", scratch.c_str(), 1);
  const int status = testing::run_klein(
      "generate -m " + tiny_container().string() + " -p x -W 8192 -H 8192 --dry-run -v", &log);
  if (tmpdir)
    ::setenv("TMPDIR", saved.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("scratch files"), std::string::npos) << log;
  EXPECT_NE(log.find("on disk in " + scratch.string()), std::string::npos) << log;
}

TEST(MemoryCli, EncodeTextTakesTheBudgetToo) {
  const fs::path out = testing::temp_dir("cli-encode");
  std::string log;
  const std::string base = "encode-text -m " + tiny_container().string() +
                           " -p x --no-cache -o " + (out / "c.npy").string();
  EXPECT_NE(testing::run_klein(base + " --max-memory 1M", &log), 0);
  EXPECT_NE(log.find("--max-memory 1 MiB is too small"), std::string::npos) << log;
  ASSERT_EQ(testing::run_klein(base + " --max-memory 1G --residency paged -v", &log), 0) << log;
  EXPECT_NE(log.find("memory: paged"), std::string::npos) << log;
}

}  // namespace
}  // namespace klein
