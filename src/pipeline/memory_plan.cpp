#include "pipeline/memory_plan.h"

#include <algorithm>
#include <unistd.h>

#include "core/error.h"
#include "core/memory.h"
#include "models/vae/vae.h"

namespace klein {

namespace {

// The program, its libraries, the tokenizer's tables, thread stacks and allocator slack.
// Measured: 35 MiB of RSS once the full-size model's container and tokenizer are open.
constexpr uint64_t kFixedBytes = uint64_t(96) << 20;

PhaseNeed text_encoder_need(const WeightStore& store, int64_t S) {
  const TextEncoderConfig& c = store.config().text_encoder;
  PhaseNeed p{"text encoder"};
  UnitSizes layers;
  for (int64_t l = 0; l < c.layers_needed(); ++l) layers.add(store.unit_bytes(text_layer_unit(l)));
  // Only the prompt's rows of the embedding table are read (when paged, even its checksum
  // pass drops what it read); resident, the checksum pass maps all of it.
  const uint64_t table = store.unit_bytes("text_encoder.embed");
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t row = c.vocab_size > 0 ? table / uint64_t(c.vocab_size) : table;
  const uint64_t rows = std::min(table, uint64_t(S) * (row + 2 * page));
  p.weights_paged = layers.two_largest() + rows;
  p.weights_resident = layers.total + table;
  p.weights_one_unit = layers.largest + rows;
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  // x, h, q, k, v, attn, gate, up; RoPE tables; the context it returns.
  p.activations = f32_bytes(S * (2 * c.hidden + 2 * q + 2 * kv + 2 * c.intermediate)) +
                  f32_bytes(S * c.head_dim) + f32_bytes(S * c.context_dim());
  return p;
}

}  // namespace

uint64_t MemoryEstimate::paged() const {
  uint64_t peak = 0;
  for (const auto& p : phases) peak = std::max(peak, p.paged());
  return fixed + peak;
}

uint64_t MemoryEstimate::resident() const {
  uint64_t peak = 0;
  for (const auto& p : phases) peak = std::max(peak, p.resident());
  return fixed + peak;
}

uint64_t MemoryEstimate::one_unit() const {
  uint64_t peak = 0;
  for (const auto& p : phases) peak = std::max(peak, p.one_unit());
  return fixed + peak;
}

MemoryEstimate estimate_memory(const WeightStore& store, const MemoryPlanInputs& in) {
  MemoryEstimate e;
  e.fixed = kFixedBytes + in.adapter_bytes;
  const VaeConfig& vae = store.config().vae;
  check(in.text_tokens > 0 && (!in.image || (in.context_width > 0 && in.denoise)),
        "memory plan: the family's inputs are missing (FamilyStages::memory_inputs)");
  const uint64_t context = f32_bytes((in.guided ? 2 : 1) * in.text_tokens * in.context_width);
  if (in.text_encoder) e.phases.push_back(text_encoder_need(store, in.text_tokens));
  if (!in.image) return e;
  if (!in.references.empty()) {
    PhaseNeed p{"vae encode"};
    p.weights_paged = p.weights_resident = p.weights_one_unit = store.unit_bytes("vae.encoder");
    for (const auto& [w, h] : in.references) {
      const vae::VaeMemoryEstimate m = vae::encode_memory(vae, h, w, in.vae_memory);
      p.activations = std::max<uint64_t>(p.activations, m.activation_bytes);
      p.scratch = std::max(p.scratch, m.scratch_bytes);
    }
    if (p.scratch > 0) p.scratch_dir = in.vae_memory.dir();
    p.activations += context;
    e.phases.push_back(p);
  }
  auto [setup, denoise] = in.denoise(store, in);
  e.phases.push_back(setup);
  e.phases.push_back(denoise);
  PhaseNeed d{"vae decode"};
  d.weights_paged = d.weights_resident = d.weights_one_unit = store.unit_bytes("vae.decoder");
  const vae::VaeMemoryEstimate m = vae::decode_memory(vae, in.height, in.width, in.vae_memory);
  d.activations = m.activation_bytes + f32_bytes(int64_t(3) * in.height * in.width);  // + image
  d.scratch = m.scratch_bytes;
  if (d.scratch > 0) d.scratch_dir = in.vae_memory.dir();
  e.phases.push_back(d);
  return e;
}

uint64_t default_memory_budget(uint64_t available) {
  if (available == 0) return 0;
  const uint64_t margin = std::max(available / 8, uint64_t(256) << 20);
  return available > margin ? available - margin : 0;
}

nlohmann::ordered_json MemoryPlan::to_json() const {
  nlohmann::ordered_json j;
  j["residency"] = residency_name(residency);
  j["read_ahead"] = read_ahead;
  j["budget_bytes"] = budget;
  j["budget_from"] = budget_given ? "--max-memory" : "available memory";
  j["available_bytes"] = available;
  j["need_resident_bytes"] = need.resident();
  j["need_paged_bytes"] = need.paged();
  j["need_one_unit_bytes"] = need.one_unit();
  j["fixed_bytes"] = need.fixed;
  for (const auto& p : need.phases) {
    nlohmann::ordered_json q;
    q["phase"] = p.phase;
    q["weights_paged_bytes"] = p.weights_paged;
    q["weights_resident_bytes"] = p.weights_resident;
    q["weights_one_unit_bytes"] = p.weights_one_unit;
    q["activation_bytes"] = p.activations;
    if (p.scratch > 0) {
      q["scratch_bytes"] = p.scratch;
      q["scratch_dir"] = p.scratch_dir;
    }
    j["phases"].push_back(q);
  }
  j["reason"] = reason;
  return j;
}

MemoryPlan plan_memory(const MemoryEstimate& need, std::optional<uint64_t> budget,
                       uint64_t available, std::optional<Residency> forced) {
  MemoryPlan plan;
  plan.need = need;
  plan.available = available;
  plan.budget_given = budget.has_value();
  plan.budget = budget ? *budget : default_memory_budget(available);
  const uint64_t resident = need.resident(), paged = need.paged(), one_unit = need.one_unit();
  const std::string of = plan.budget_given ? " of the --max-memory budget " : " of the budget ";
  const auto mib = [](uint64_t bytes) { return (bytes + (uint64_t(1) << 20) - 1) >> 20; };
  // Paged within a budget that holds one unit but not two: no read-ahead.
  const auto without_read_ahead = [&](const std::string& why) {
    plan.read_ahead = false;
    plan.reason = why + ", without read-ahead: reading the next unit while one computes would "
                  "need about " + format_bytes(paged) + of + format_bytes(plan.budget) +
                  ", so each unit is read when it is needed, about " + format_bytes(one_unit) +
                  " (slower when the weights are not in the page cache)";
  };
  if (forced) {
    plan.residency = *forced;
    const std::string mode = residency_name(*forced);
    const bool paging = *forced == Residency::Paged;
    if (paging && plan.budget != 0 && paged > plan.budget && one_unit <= plan.budget) {
      without_read_ahead(mode + " (--residency)");
      return plan;
    }
    // Paged and short even of one unit: read nothing ahead (the least memory there is).
    const bool short_of_two = paging && plan.budget != 0 && paged > plan.budget;
    const uint64_t needed = !paging ? resident : short_of_two ? one_unit : paged;
    check(!plan.budget_given || needed <= plan.budget, "--residency ", mode, " needs about ",
          format_bytes(needed), ", more than --max-memory ", format_bytes(plan.budget),
          "; give at least --max-memory ", mib(needed), "M");
    plan.read_ahead = !short_of_two;
    plan.reason = mode + (short_of_two ? ", without read-ahead" : "") +
                  " (--residency): needs about " + format_bytes(needed) + of +
                  format_bytes(plan.budget);
    if (plan.budget != 0 && needed > plan.budget) plan.reason += ", more than the budget";
    return plan;
  }
  // Paged unless asked otherwise: it costs a few per cent of the time (docs/SPEED.md) and
  // needs a fraction of the memory; the budget only has to hold it.
  plan.residency = Residency::Paged;
  if (!plan.budget_given && plan.budget == 0) {
    plan.reason = "paged (the default; the available memory is unknown): needs about " +
                  format_bytes(paged);
    return plan;
  }
  if (paged <= plan.budget) {
    plan.reason = "paged (the default): needs about " + format_bytes(paged) + of +
                  format_bytes(plan.budget) + "; --residency resident would keep each " +
                  "network's weights in memory, about " + format_bytes(resident);
    return plan;
  }
  if (one_unit <= plan.budget) {
    without_read_ahead("paged");
    return plan;
  }
  // The largest phase, to say where the memory goes.
  const PhaseNeed* worst = nullptr;
  for (const auto& p : need.phases)
    if (!worst || p.one_unit() > worst->one_unit()) worst = &p;
  const std::string where =
      worst ? " (" + worst->phase + ": " + format_bytes(worst->weights_one_unit) +
                  " of weights, " + format_bytes(worst->activations) + " of activations, plus " +
                  format_bytes(need.fixed) + " for the program)"
            : "";
  if (plan.budget_given)
    fail("--max-memory ", format_bytes(plan.budget), " is too small for this model at this size: "
         "even paging one unit at a time needs about ", format_bytes(one_unit), where,
         "; give at least --max-memory ", mib(one_unit), "M or generate a smaller image");
  plan.read_ahead = false;
  plan.reason = "paged, without read-ahead: the available memory (" + format_bytes(available) +
                ") is below what even paging one unit at a time needs, about " +
                format_bytes(one_unit) + where + "; the run may swap or be stopped by the system";
  return plan;
}

}  // namespace klein
