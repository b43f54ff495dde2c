#pragma once
// Inside the tiny autoencoder: its tensors taken layer by layer from the file's (every one
// checked against taesd.py's shapes, and none left over), and the pieces its two halves share.
#include "models/taesd/taesd.h"

namespace klein::taesd {

constexpr int64_t kChannels = 64;       // every layer's width
constexpr int64_t kPoolChannels = 256;  // a GroupNorm pool's inner width (4 x 64)
constexpr int64_t kPoolGroups = 4;
constexpr float kPoolEps = 1e-5f;  // nn.GroupNorm's default

class Layers {
 public:
  explicit Layers(TinyWeights weights);
  const std::string& where() const { return where_; }
  const Shape* shape_of(const std::string& name) const;
  bool has(const std::string& name) const;
  // Takes "<name>.weight" [out, in, kernel, kernel] (and "<name>.bias" [out]) into convs.
  void conv(const std::string& name, int64_t out, int64_t in, int64_t kernel, bool bias);
  // Takes a Block's three convolutions (and its pool's tensors).
  void block(const std::string& name, bool pool);
  // Every tensor of the file was taken.
  void finish();

  std::map<std::string, ops::Conv2dWeights> convs;
  std::map<std::string, std::vector<float>> norms;  // "<block>.pool.1.weight" / ".bias"

 private:
  std::vector<float> take(const std::string& name, const Shape& shape);
  TinyWeights w_;
  std::string where_;
};

}  // namespace klein::taesd
