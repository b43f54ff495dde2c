#pragma once
// FP8 checkpoints: the tensors that travel with fp8 weights (scales, input scales, markers),
// recognised, checked and taken out of the weights before the name mapping sees them, and
// the decoding of an fp8 weight to float32. The conventions are in docs/IMPORT.md:
//
//   ComfyUI "scaled fp8"   a marker tensor "scaled_fp8" (any prefix; its dtype names the fp8
//                          format), "<layer>.scale_weight" per fp8 weight, optional
//                          "<layer>.scale_input"
//   weight_scale spelling  "<layer>.weight_scale", optional "<layer>.input_scale", and
//                          ComfyUI's per-layer "<layer>.comfy_quant" (U8 bytes of a JSON object
//                          whose "format" is "float8_e4m3fn" or "float8_e5m2")
//   plain fp8              F8_E4M3 / F8_E5M2 weights without any scale (scale 1)
//
// A weight's value is decode(code) x scale, the product rounded once to float32; the scale is
// one number for the tensor ([] or [1]) or one per row ([rows] or [rows, 1]). Input scales
// quantize activations on fp8 hardware and say nothing about the weight's value: they are
// consumed and not used.
#include <map>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "weights/weight_store.h"

namespace klein {

struct Fp8Tensors {
  std::map<std::string, std::string> scale_of;  // weight's source name -> its scale tensor
  std::vector<std::string> companions;           // every scale, input scale and marker
};

// Finds and checks the fp8 companions of one component's files (`where` names them): every
// scale belongs to an fp8 weight and has a float type, a valid shape and finite values; a
// "scaled_fp8" marker means every fp8 weight has a scale. Throws naming file and tensor.
Fp8Tensors find_fp8_tensors(const SafetensorsSet& files, const std::string& where);

// The values of a scale tensor (F32, F16 or BF16) as float32: exact, as every such value is one.
std::vector<float> fp8_scale_values(const TensorView& scale);

// Float32 values of rows [r0, r1) of an fp8 tensor of `cols` columns whose codes start at
// `codes`: code x scale, the product rounded once to float32, with one scale for the tensor
// (scale_count 1), one per row (scale[r]) or none (scale null: 1). Refuses NaN and infinities
// (naming `name`, the row and the column).
void decode_fp8_rows(DType type, const std::byte* codes, int64_t r0, int64_t r1, int64_t cols,
                     const float* scale, int64_t scale_count, const std::string& name, float* out);

}  // namespace klein
