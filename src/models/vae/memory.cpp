// Activation memory of the VAE, walked layer by layer as decoder.cpp and encoder.cpp allocate:
// a ResNet holds its input and one intermediate (conv2 writes into one of them), an up- or
// downsampler its input and output, the mid-block attention its input, the normalised token
// copy and Q, K, V. Convolutions add their band buffers and float32 weights.
#include <algorithm>

#include "models/vae/vae.h"

namespace klein::vae {

namespace {

// Band buffers of one convolution (ops/conv2d.cpp keeps them to a few tens of MiB), the
// float32 weights of the convolutions alive at once (conv1 and conv2 of the widest ResNet),
// and the fast convolutions' Winograd form of one layer's weights (36 points instead of 9
// taps; its transformed chunks, at most 8 MiB, fit in the band allowance).
size_t conv_overhead(int64_t widest) {
  const size_t bands = size_t(64) << 20;
  const size_t weights = size_t(2 * widest * widest * 9) * sizeof(float);
  const size_t winograd = size_t(36 * widest * widest) * sizeof(float);
  return bands + weights + winograd;
}

size_t attention_floats(int64_t channels, int64_t pixels) { return size_t(5 * channels * pixels); }

size_t whole_decode_bytes(const VaeConfig& c, int64_t height, int64_t width) {
  const std::vector<int64_t>& channels = c.decoder_channels();
  const int64_t levels = int64_t(channels.size());
  const int64_t down = int64_t(1) << (levels - 1);
  int64_t pixels = std::max<int64_t>(1, height / down) * std::max<int64_t>(1, width / down);
  const int64_t top = channels.back();
  size_t peak = size_t((c.latent_channels + top) * pixels);  // conv_in
  peak = std::max(peak, size_t(2 * top * pixels));           // mid-block ResNets
  if (c.mid_block_attention) peak = std::max(peak, attention_floats(top, pixels));
  int64_t in = top;
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t out = channels[size_t(levels - 1 - i)];
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      peak = std::max(peak, size_t((in + out) * pixels));
      in = out;
    }
    if (i + 1 < levels) {
      peak = std::max(peak, size_t(out * pixels * 5));  // input + the 2x upsampled output
      pixels *= 4;
    }
  }
  peak = std::max(peak, size_t((channels.front() + c.out_channels) * pixels));  // conv_out
  return peak * sizeof(float) + conv_overhead(top);
}

// Banded (decoder.cpp): the latent-resolution part as above (conv_in, the mid block), then
// at most three planes in memory at once (a ResNet's input, intermediate and output) of at
// most plane_limit each, and the band tensors: a band's input, output and residual rows of
// about VaeMemory::band_bytes each, with the convolution's own buffers.
size_t banded_decode_bytes(const VaeConfig& c, int64_t height, int64_t width, const VaeMemory& m) {
  const std::vector<int64_t>& channels = c.decoder_channels();
  const int64_t down = int64_t(1) << (channels.size() - 1);
  const int64_t pixels = std::max<int64_t>(1, height / down) * std::max<int64_t>(1, width / down);
  const int64_t top = channels.back();
  size_t latent_part = size_t(std::max(c.latent_channels + top, 2 * top) * pixels);
  if (c.mid_block_attention) latent_part = std::max(latent_part, attention_floats(top, pixels));
  size_t widest_plane = 0;
  for (size_t i = 0; i < channels.size(); ++i) {
    const int64_t level_pixels = pixels << (2 * i);
    widest_plane = std::max(
        widest_plane, size_t(channels[channels.size() - 1 - i] * level_pixels) * sizeof(float));
  }
  const size_t planes = 3 * std::min(widest_plane, m.plane_limit);
  const size_t bands = 3 * m.band_bytes;
  return std::max(latent_part * sizeof(float), planes + bands) + conv_overhead(top);
}

// The planes banded_up_blocks (decoder.cpp) holds at once, counting those larger than
// plane_limit: a ResNet's input, intermediate and (when the channel count changes) output; an
// upsampler's input and output.
uint64_t banded_decode_scratch(const VaeConfig& c, int64_t height, int64_t width,
                               const VaeMemory& m) {
  const std::vector<int64_t>& channels = c.decoder_channels();
  const int64_t levels = int64_t(channels.size());
  const int64_t down = int64_t(1) << (levels - 1);
  int64_t pixels = std::max<int64_t>(1, height / down) * std::max<int64_t>(1, width / down);
  auto file = [&](int64_t planes_channels) {
    const uint64_t bytes = uint64_t(planes_channels * pixels) * sizeof(float);
    return bytes > m.plane_limit ? bytes : 0;
  };
  uint64_t peak = 0;
  int64_t in = channels.back();
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t out = channels[size_t(levels - 1 - i)];
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      peak = std::max(peak, file(in) + file(out) + (in == out ? 0 : file(out)));
      in = out;
    }
    if (i + 1 < levels) {
      const uint64_t input = file(out);
      pixels *= 4;
      peak = std::max(peak, input + file(out));
    }
  }
  return peak;
}

size_t whole_encode_bytes(const VaeConfig& c, int64_t height, int64_t width) {
  const std::vector<int64_t>& channels = c.block_out_channels;
  const int64_t levels = int64_t(channels.size());
  int64_t pixels = height * width;
  size_t peak = size_t((c.in_channels + channels.front()) * pixels);  // pixels + conv_in
  int64_t in = channels.front();
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t out = channels[size_t(i)];
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      peak = std::max(peak, size_t((in + out) * pixels));
      in = out;
    }
    if (i + 1 < levels) {
      peak = std::max(peak, size_t(out * pixels + out * pixels / 4));
      pixels /= 4;
    }
  }
  const int64_t top = channels.back();
  peak = std::max(peak, size_t(2 * top * pixels));
  if (c.mid_block_attention) peak = std::max(peak, attention_floats(top, pixels));
  return peak * sizeof(float) + conv_overhead(top);
}

// Banded (encoder.cpp, bands.h): the pixels' copy, three planes in memory of at most
// plane_limit each and three bands of about band_bytes, or the deepest level's part (the mid
// block) in memory.
size_t banded_encode_bytes(const VaeConfig& c, int64_t height, int64_t width, const VaeMemory& m) {
  const std::vector<int64_t>& channels = c.block_out_channels;
  const int64_t down = int64_t(1) << (channels.size() - 1);
  const int64_t pixels = std::max<int64_t>(1, height / down) * std::max<int64_t>(1, width / down);
  const int64_t top = channels.back();
  size_t deepest = size_t(2 * top * pixels);
  if (c.mid_block_attention) deepest = std::max(deepest, attention_floats(top, pixels));
  size_t widest_plane = 0;
  for (size_t i = 0; i < channels.size(); ++i)
    widest_plane =
        std::max(widest_plane, size_t(channels[i] * ((height * width) >> (2 * i))) * sizeof(float));
  const size_t image = size_t(c.in_channels * height * width) * sizeof(float);
  const size_t banded = image + 3 * std::min(widest_plane, m.plane_limit) + 3 * m.band_bytes;
  return std::max(deepest * sizeof(float), banded) + conv_overhead(top);
}

uint64_t banded_encode_scratch(const VaeConfig& c, int64_t height, int64_t width,
                               const VaeMemory& m) {
  const std::vector<int64_t>& channels = c.block_out_channels;
  int64_t pixels = height * width;
  auto file = [&](int64_t planes_channels, int64_t at) {
    const uint64_t bytes = uint64_t(planes_channels * at) * sizeof(float);
    return bytes > m.plane_limit ? bytes : 0;
  };
  uint64_t peak = file(channels.front(), pixels);  // conv_in's output
  int64_t in = channels.front();
  for (size_t i = 0; i < channels.size(); ++i) {
    const int64_t out = channels[i];
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      peak = std::max(peak,
                      file(in, pixels) + file(out, pixels) + (in == out ? 0 : file(out, pixels)));
      in = out;
    }
    if (i + 1 < channels.size()) {
      peak = std::max(peak, file(out, pixels) + file(out, pixels / 4));
      pixels /= 4;
    }
  }
  return peak;
}

// Either direction: the whole-image form unless its activations pass whole_limit, else bands
// (banded and scratch computed only then).
template <class Banded, class Scratch>
VaeMemoryEstimate estimate(size_t whole_bytes, const VaeMemory& m, Banded banded_bytes,
                           Scratch banded_scratch) {
  VaeMemoryEstimate e;
  e.banded = whole_bytes > m.whole_limit;
  e.activation_bytes = e.banded ? banded_bytes() : whole_bytes;
  e.scratch_bytes = e.banded ? banded_scratch() : 0;
  return e;
}

}  // namespace

VaeMemoryEstimate decode_memory(const VaeConfig& c, int64_t height, int64_t width,
                                const VaeMemory& m) {
  return estimate(
      whole_decode_bytes(c, height, width), m,
      [&] { return banded_decode_bytes(c, height, width, m); },
      [&] { return banded_decode_scratch(c, height, width, m); });
}

VaeMemoryEstimate encode_memory(const VaeConfig& c, int64_t height, int64_t width,
                                const VaeMemory& m) {
  VaeMemoryEstimate e = estimate(
      whole_encode_bytes(c, height, width), m,
      [&] { return banded_encode_bytes(c, height, width, m); },
      [&] { return banded_encode_scratch(c, height, width, m); });
  // The pipeline keeps the reference pixels [3, H, W] while encoding.
  e.activation_bytes += size_t(c.in_channels * height * width) * sizeof(float);
  return e;
}

void check_scratch(const VaeConfig& c, const std::vector<std::pair<int64_t, int64_t>>& encodes,
                   int64_t height, int64_t width, const VaeMemory& m) {
  uint64_t bytes = decode_memory(c, height, width, m).scratch_bytes;
  for (const auto& [h, w] : encodes)
    bytes = std::max(bytes, encode_memory(c, h, w, m).scratch_bytes);
  if (bytes > 0) check_scratch_space(m.dir(), bytes);
}

}  // namespace klein::vae
