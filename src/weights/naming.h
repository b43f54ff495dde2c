#pragma once
// Canonical tensor names and the mapping from the published checkpoint layouts to them.
// Canonical names use the diffusers/transformers spelling with a component prefix
// ("transformer.", "text_encoder.", "vae."); see weight_store.h for the units.
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace klein {

struct UnitOf {
  std::string unit;    // "transformer.double.3"
  std::string prefix;  // "transformer.transformer_blocks.3."
};
// The unit a canonical tensor of FLUX.2-klein belongs to, or nothing for tensors inference
// never reads (lm_head, BatchNorm's num_batches_tracked). For a model of any family, use
// unit_of(family, name) (family.h).
std::optional<UnitOf> unit_of(const std::string& canonical);
// The same for the components every family shares (text_encoder.*, vae.*): nothing for the
// transformer's names, which are the family's.
std::optional<UnitOf> component_unit_of(const std::string& canonical);
// FLUX.2-klein's transformer units (transformer.shared, .double.{i}, .single.{i}).
std::optional<UnitOf> klein_transformer_unit_of(const std::string& canonical);

// Where a canonical tensor's values come from in a source checkpoint.
struct TensorSource {
  std::string canonical;
  std::string source;          // tensor name in the source file
  int64_t row_begin = 0;       // rows [row_begin, row_end) of the source (fused QKV split)
  int64_t row_end = -1;        // -1: all rows
  bool swap_halves = false;    // BFL final layer stores shift|scale, diffusers scale|shift
  bool squeeze_1x1 = false;    // BFL VAE attention 1x1 convs become Linear [out, in]
  // llama.cpp's converter stores a llama-architecture model's q/k projections with each
  // head's rows reordered so that rotation pairs are adjacent: row 2i + j of a head is row
  // j * (head_dim / 2) + i of transformers'. This many heads are put back (0: none).
  int64_t rope_interleaved_heads = 0;
};

struct NamedShape {
  std::string name;
  Shape shape;
};

enum class Component { Transformer, TextEncoder, Vae };
const char* component_name(Component c);

// How a component's source names its tensors: the diffusers / transformers names (the
// diffusers directory, and single files saved from it), the original BFL names of the
// flux2 repository (single-file checkpoints, with or without a ComfyUI prefix), or another
// family's original names (Z-Image's, which ComfyUI's single files keep).
enum class Layout { Diffusers, Bfl, Original };
const char* layout_name(Layout l);
Layout detect_layout(Component c, const std::vector<NamedShape>& tensors);

// The shape the canonical tensor has, given the shape of its source tensor (a row range of
// a fused projection, a 1x1 convolution read as a Linear).
Shape canonical_shape(const TensorSource& t, const Shape& source_shape);

// Maps every tensor of one component's source file(s) to canonical names, recognising the
// diffusers, BFL and ComfyUI spellings (prefixes such as "model.diffusion_model." are
// stripped). Unknown tensors are an error naming them; `where` names the file.
std::vector<TensorSource> map_component(Component c, const std::vector<NamedShape>& tensors,
                                        const std::string& where);

// One transformer tensor in the given layout's spelling (prefixes stripped as above) to the
// canonical tensor(s) it becomes: LoRA modules are mapped like the weights they change.
std::vector<TensorSource> map_transformer_tensor(const NamedShape& tensor, Layout layout,
                                                const std::string& where);

// The klein transformer weights one LoRA module changes (ModelFamily::lora_targets): its
// diffusers/PEFT ("transformer.transformer_blocks.0.attn.to_q"), BFL / ai-toolkit
// ("diffusion_model.double_blocks.0.img_attn.qkv": to_q, to_k and to_v, B in thirds) and kohya
// ("lora_unet_double_blocks_0_img_attn_qkv") spellings (lora_names.cpp). `up` is B's shape.
std::vector<TensorSource> klein_lora_targets(const std::string& module, const Shape& up,
                                             const std::string& where);

}  // namespace klein
