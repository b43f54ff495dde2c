#pragma once
// Policy search: a per-tensor precision policy for an error or size budget, from what the
// report measured, written in the format `klein convert --policy` reads (convert/policy.h).
//
// The error model is first order and stated here so that its predictions can be judged:
//   - every tensor t at storage type T has a weight error n_t(T) (NMSE), measured by
//     quantizing the reference values with the converter's quantizers;
//   - a group g (a transformer unit; the text encoder) perturbs the velocity by V_g, measured
//     by the isolated probes with a measured model's weights for g alone, and V_g is taken
//     to be proportional to the sum of its tensors' weight errors: V_g = c_g Σ_{t∈g} n_t;
//   - image errors add: image MSE = k Σ_g V_g + (the VAE's own image MSE), with k calibrated
//     so that the prediction for the measured model equals its measured image MSE.
// So every tensor has a sensitivity s_t = k c_g (image MSE per unit of weight NMSE) and a
// policy's predicted image MSE is Σ_t s_t n_t(T_t). Groups the measured model left
// unquantized (nothing to calibrate c_g on) take the median c of the groups that were.
//
// The search starts every tensor the built-in policy would quantize at its lowest allowed
// type (q4; q8 for the token embeddings) and upgrades greedily (q4 -> q8 -> bf16), best
// predicted error reduction per added byte first, until the PSNR goal is met, never past
// the size budget. Tensors the defaults keep at a float type stay there and are not listed.
//
// Errors do not add linearly far from the operating point (a deep text encoder saturates),
// so a proposal can be verified: `measure` converts it and runs the same end-to-end
// comparison; if the measured PSNR falls short, the sensitivities are measured again at the
// proposal (a new operating point) and the greedy continues from there.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "convert/report/e2e.h"
#include "convert/report/weights.h"

namespace klein::report {

struct PolicyGoal {
  std::optional<double> min_psnr_db;  // image PSNR against the reference
  std::optional<uint64_t> max_bytes;  // container file size
};

// How the container's file size follows its tensors: units start at multiples of the
// alignment; everything else (header, index, metadata, tokenizer) stays as in the candidate.
struct SizeModel {
  uint64_t file_bytes = 0;
  uint64_t alignment = 1;
  std::map<std::string, uint64_t> unit_bytes;  // stored bytes of each unit of the candidate
};

struct PolicyChoice {
  std::string name;
  std::string unit;
  std::string group;
  DType minimum = DType::Q4;    // the lowest type the search may choose
  DType candidate = DType::Q4;  // what the measured candidate holds
  DType type = DType::Q4;       // the proposal
  double nmse = 0;              // weight NMSE at the proposed type
  uint64_t bytes = 0;           // at the proposed type
  double sensitivity = 0;       // s_t: image MSE per unit of weight NMSE
};

// One proposal and, when verified, what its conversion measured.
struct PolicyRound {
  uint64_t predicted_file_bytes = 0;
  double predicted_psnr_db = 0;
  std::optional<uint64_t> measured_file_bytes;
  std::optional<double> measured_psnr_db;
  std::map<std::string, size_t> types;  // listed tensors per type
};

struct PolicyProposal {
  PolicyGoal goal;
  bool met = false;      // by the measurement when verified, else by the prediction
  bool verified = false;
  std::vector<PolicyChoice> tensors;  // the tensors the policy lists, by name
  uint64_t predicted_tensor_bytes = 0, predicted_file_bytes = 0;
  double predicted_image_mse = 0, predicted_psnr_db = 0;
  std::optional<uint64_t> measured_file_bytes;
  std::optional<double> measured_psnr_db;
  uint64_t candidate_file_bytes = 0;
  double candidate_image_mse = 0, candidate_psnr_db = 0;  // measured (mean over the cases)
  double calibration = 0;  // k of the last calibration
  std::vector<PolicyRound> rounds;
  std::string text;  // the policy file
};

// What verifying a policy measured: the end-to-end comparison of its conversion (with the
// isolated probes) and the converted file's size.
struct Measurement {
  E2eResult e2e;
  uint64_t file_bytes = 0;
};
using MeasureFn = std::function<Measurement(const std::string& policy_text)>;

// `weights` must have been measured with alternatives and `e2e` with isolated probes.
// Verifies up to `verify_rounds` proposals with `measure` (none when 0 or `measure` is
// empty). Throws when there is nothing to calibrate against.
PolicyProposal search_policy(const WeightComparison& weights, const E2eResult& e2e,
                             const PolicyGoal& goal, const SizeModel& size,
                             int verify_rounds = 0, const MeasureFn& measure = {});

// "2.5GB", "800MB", "123456" -> bytes (decimal units, as sizes are quoted); throws naming `what`.
uint64_t parse_size(const std::string& text, const std::string& what);
// Image MSE of pixel values in [0, 1] <-> PSNR.
double psnr_from_mse(double mse);

}  // namespace klein::report
