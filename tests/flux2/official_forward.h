#pragma once
// One transformer forward on the inputs an official forward was given, as the golden sets
// store them: <prefix>encoder_hidden_states.npy [1, T, width], <prefix>hidden_states.npy
// [1, N_img + N_ref, channels] (the reference tokens are the rows after the target's) and
// <prefix>timestep.npy. Shared by the klein-tiny and klein-tiny-9b transformer tests.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/npy.h"
#include "models/flux2/positions.h"
#include "models/flux2/transformer.h"

namespace klein::testing {

// [rows, width] from a .npy of shape [..., width].
inline Tensor load_rows(const std::filesystem::path& path) {
  NpyArray a = read_npy(path);
  Tensor t = a.to_tensor();
  const Shape& s = a.shape;
  t.reshape({numel(s) / s.back(), s.back()});
  return t;
}

// The target rows' velocity of the forward whose inputs are at `prefix` + name + ".npy".
inline std::vector<float> official_forward(flux2::Transformer& model, const std::string& prefix,
                                           const flux2::TokenLayout& layout, Compute& cx,
                                           const flux2::Observer& observe = {}) {
  using namespace flux2;
  const Tensor context = load_rows(prefix + "encoder_hidden_states.npy");
  const Tensor hidden = load_rows(prefix + "hidden_states.npy");
  const float timestep = read_npy(prefix + "timestep.npy").to_f32()[0];
  const int64_t n_img = layout.target_tokens();

  std::vector<Tensor> ref_tokens;
  int64_t row = n_img;
  for (const LatentGrid& g : layout.references) {
    Tensor t({g.tokens(), hidden.dim(1)});
    std::memcpy(t.data(), hidden.row(row), size_t(t.numel()) * sizeof(float));
    row += g.tokens();
    ref_tokens.push_back(std::move(t));
  }
  EXPECT_EQ(row, hidden.dim(0)) << prefix << "hidden_states.npy has rows beyond the layout's";
  std::vector<ReferenceTokens> refs;
  for (size_t i = 0; i < ref_tokens.size(); ++i)
    refs.push_back({&ref_tokens[i], layout.references[i]});

  const RopeTable rope(joint_position_ids(layout), model.config().rope_axes,
                       model.config().rope_theta);
  const Tensor text = model.embed_text(context, cx);
  EXPECT_EQ(text.dim(0), layout.text_tokens);
  const Tensor embedded_refs = model.embed_references(refs, cx);
  Activations act(model.config(), layout);
  Modulation mod(model.config());
  model.modulate(timestep, mod, cx);
  std::vector<float> velocity(size_t(n_img * model.config().out_channels));
  model.forward(hidden.data(), text, &embedded_refs, mod, rope, act, velocity.data(), cx, observe);
  return velocity;
}

}  // namespace klein::testing
