"""The FLUX.2 transformer's module names: diffusers' spelling -> BFL's (the original
checkpoints, ComfyUI and ai-toolkit), as diffusers' FLUX.2 single-file conversion maps them.
Weights keep their ".weight"; BFL's q/k norms end in ".scale". A BFL qkv is diffusers' to_q,
to_k and to_v (add_q/k/v_proj for the text stream) stacked, and norm_out.linear (scale|shift)
is final_layer.adaLN_modulation.1 with its halves swapped (shift|scale): the scripts handle
those two themselves.
"""

# Modules outside the blocks.
SHARED = {
    "x_embedder": "img_in", "context_embedder": "txt_in",
    "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
    "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
    "single_stream_modulation.linear": "single_stream_modulation.lin",
    "proj_out": "final_layer.linear", "norm_out.linear": "final_layer.adaLN_modulation.1",
}
# transformer_blocks.N.<tail> -> double_blocks.N.<tail>
DOUBLE = {
    "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
    "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
    "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2",
}
DOUBLE_NORMS = {
    "attn.norm_q": "img_attn.norm.query_norm", "attn.norm_k": "img_attn.norm.key_norm",
    "attn.norm_added_q": "txt_attn.norm.query_norm", "attn.norm_added_k": "txt_attn.norm.key_norm",
}
# single_transformer_blocks.N.<tail> -> single_blocks.N.<tail>
SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
SINGLE_NORMS = {"attn.norm_q": "norm.query_norm", "attn.norm_k": "norm.key_norm"}
