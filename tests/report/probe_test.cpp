// The networks one at a time that klein report probes (FamilyStages::probe_forward and
// decode_latents, pipeline/stages.h) are the generation's own, for each family: at every
// step of an unguided generation the probe's forward on that step's inputs gives the
// velocity the Euler update used, and the decoder alone on the final latents gives the
// generation's decoder output, bit for bit; every block of the list shows its output.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "pipeline/model_tokenizer.h"
#include "pipeline/stages.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

struct Family {
  const char* name;
  const char* dir;  // under the test data, beside klein-tiny
  size_t blocks;
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

Tensor copy_of(const Tensor& t) {
  Tensor c(t.shape());
  std::memcpy(c.data(), t.data(), size_t(t.numel()) * sizeof(float));
  return c;
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)) == 0;
}

class ProbeForward : public ::testing::TestWithParam<Family> {};

TEST_P(ProbeForward, IsTheGenerationsForward) {
  ModelPaths paths;
  paths.model = testing::tiny_dir().parent_path() / GetParam().dir / "model";
  auto store = open_model(paths);
  const Tokenizer tokenizer = load_model_tokenizer(paths);
  const FamilyStages& stages = stages_for(store->config());
  Compute cx(2);
  Progress quiet;
  Session session(*store, tokenizer, cx);
  const GenerateOptions options{.prompt = "a red fox in fresh snow",
                                .width = 64,
                                .height = 48,
                                .steps = 3,
                                .seed = 7,
                                .plan_memory = false,
                                .precision = Precision::Exact};
  Generation g = session.start(options, quiet);
  ASSERT_FALSE(g.guided) << "the probe is the conditional forward: an unguided run";
  session.encode_prompt(g, quiet);
  const Tensor context = copy_of(g.context);
  session.prepare_latents(g, quiet);
  struct Step {
    Tensor latents_in, velocity;
    float timestep;
  };
  std::vector<Step> steps;
  session.denoise(g, quiet, [&](const StepView& s) {
    steps.push_back({copy_of(s.latents_in), copy_of(s.velocity), s.timestep});
  });
  const Tensor final_latents = copy_of(g.latents);
  session.decode(g, quiet);
  ASSERT_EQ(steps.size(), 3u);

  const std::vector<TransformerBlock> blocks = stages.transformer_blocks(store->config());
  ASSERT_EQ(blocks.size(), GetParam().blocks);
  for (const auto& b : blocks) EXPECT_TRUE(store->has_unit(b.unit)) << b.unit;
  for (size_t i = 0; i < steps.size(); ++i) {
    const ProbeInputs in{&steps[i].latents_in, &context, steps[i].timestep, g.grid};
    std::vector<int64_t> values(blocks.size(), 0);
    const Tensor v = stages.probe_forward(
        *store, in, cx, [&](size_t block, int64_t offset, const float*, int64_t count) {
          ASSERT_LT(block, blocks.size());
          EXPECT_EQ(offset, values[block]) << "in order, without gaps";
          values[block] += count;
        });
    EXPECT_TRUE(same_values(v, steps[i].velocity)) << "step " << i;
    for (size_t b = 0; b < blocks.size(); ++b) EXPECT_GT(values[b], 0) << blocks[b].name;
  }
  EXPECT_TRUE(same_values(stages.decode_latents(*store, final_latents, g.grid, cx), g.decoded));
}

INSTANTIATE_TEST_SUITE_P(Families, ProbeForward,
                         ::testing::Values(Family{"klein", "klein-tiny", 4},
                                           Family{"zimage", "zimage-tiny", 6}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace klein
