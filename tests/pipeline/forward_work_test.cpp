// flux2::forward_work against the weights themselves: every matrix of the tiny model's
// transformer, times the rows the forward runs it on, summed; and attention from the layout.
#include <gtest/gtest.h>

#include <string>

#include "models/flux2/positions.h"
#include "models/flux2/transformer.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein {
namespace {

TEST(ForwardWork, CountsEveryTransformerMatrixOnItsRows) {
  auto store = open_model(testing::tiny_model());
  const TransformerConfig& c = store->config().transformer;
  flux2::TokenLayout layout;
  layout.target = {4, 3};
  const double T = double(layout.text_tokens), N = double(layout.target_tokens()), S = T + N;

  double linear = 0, blocks = 0;
  for (const std::string& name : store->units()) {
    if (!name.starts_with("transformer.")) continue;
    const bool shared = name == "transformer.shared",
               single = name.starts_with("transformer.single.");
    if (!shared) ++blocks;
    auto unit = store->acquire(name);
    for (const Weight& w : unit->weights()) {
      if (w.shape.size() != 2) continue;  // norms, biases
      const std::string n = w.name;
      const double macs = double(w.shape[0]) * double(w.shape[1]);
      double rows;
      if (shared) {
        if (n.find("context_embedder") != std::string::npos) continue;  // once per prompt
        const bool image =
            n.find("x_embedder") != std::string::npos || n.find("proj_out") != std::string::npos;
        rows = image ? N : 1;  // the embedders and modulations run on one row
      } else if (single) {
        rows = S;
      } else {  // a double block: the text stream's own weights on the text rows
        const bool text =
            n.find("add_") != std::string::npos || n.find("ff_context") != std::string::npos;
        rows = text ? T : N;
      }
      linear += macs * rows;
    }
  }
  ASSERT_EQ(blocks, double(c.num_double_blocks + c.num_single_blocks));
  const ops::ForwardWork w = flux2::forward_work(c, layout);
  EXPECT_DOUBLE_EQ(w.linear_macs, linear);
  EXPECT_DOUBLE_EQ(w.attention_macs, blocks * 2 * S * S * double(c.inner_dim()));
  // Cached reference keys lengthen every attention, not the projections.
  const ops::ForwardWork cached = flux2::forward_work(c, layout, 100);
  EXPECT_DOUBLE_EQ(cached.linear_macs, w.linear_macs);
  EXPECT_DOUBLE_EQ(cached.attention_macs, blocks * 2 * S * (S + 100) * double(c.inner_dim()));
}

}  // namespace
}  // namespace klein
