// The plugin's custom-op library: namespace _C_ascend_ext, never a torch_npu/CANN name.
//
// TORCH_LIBRARY (not FRAGMENT) owns the namespace: a second library defining it, or
// a second definition of an op, fails loudly at load time instead of replacing it.
// Every op name carries its own suffix (npu_mla_prolog_v3_k3, not npu_mla_prolog_v3):
// vllm-ascend PR 16924 shows what a custom build under CANN's name breaks.
#include <torch/library.h>

#include "emu_attention.h"
#include "emu_layer_ops.h"
#include "gdn_ext.h"
#include "mla_prolog_v3_k3.h"

TORCH_LIBRARY(_C_ascend_ext, m) {
  m.def(
      "npu_mla_prolog_v3_k3(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, "
      "Tensor weight_uk, Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, "
      "Tensor rmsnorm_gamma_ckv, Tensor(a!) kv_cache, *, Tensor? cache_index=None, "
      "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, "
      "str cache_mode=\"PA_BSND\", bool query_norm_flag=False, float qc_qr_scale=1.0, "
      "float kc_scale=1.0) -> (Tensor query, Tensor query_norm)");
  m.def(
      "npu_causal_conv1d_ext(Tensor x, Tensor weight, Tensor(a!) conv_states, "
      "Tensor query_start_loc, Tensor cache_indices, Tensor has_initial_state, *, "
      "Tensor? bias=None, Tensor? num_accepted_tokens=None, bool silu=True, "
      "int pad_slot_id=-1) -> Tensor");
  m.def(
      "npu_recurrent_gated_delta_rule_ext(Tensor query, Tensor key, Tensor value, "
      "Tensor(a!) state, *, Tensor beta, float scale, Tensor actual_seq_lengths, "
      "Tensor ssm_state_indices, Tensor? num_accepted_tokens=None, Tensor? g=None, "
      "Tensor? has_initial_state=None, int max_seq_len=8) -> Tensor");
  // Emulation kernels (CPU only): the compiled form of a Python reference.
  m.def(
      "emu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, "
      "Tensor? block_table, int[] cu_q, int[] kv_lens, int[]? cu_kv, Tensor? mask2d, *, "
      "int num_kv_heads, int sparse_mode, int pre_tokens, int next_tokens, float scale, "
      "int block_size, bool softmax_lse_flag) -> (Tensor, Tensor)");
  m.def(
      "emu_recurrent_gated_delta_rule(Tensor query, Tensor key, Tensor value, Tensor(a!) state, "
      "Tensor beta, Tensor? g, float scale, int[] starts, int[] lens, int[] slots, "
      "int[] init_slots) -> Tensor");
  m.def(
      "emu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, "
      "Tensor(b!) value_cache, Tensor slot_mapping) -> ()");
  m.def("emu_rms_norm(Tensor x, Tensor gamma, float epsilon) -> (Tensor, Tensor)");
  m.def("emu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon) -> (Tensor, Tensor, Tensor)");
  m.def(
      "emu_rope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, "
      "bool neox) -> (Tensor, Tensor)");
  m.def("emu_swiglu(Tensor x) -> Tensor");
  m.def("emu_last_threads() -> int", &ascend_ext_emu::emu_last_threads);
  m.def("emu_vector_path() -> str", &ascend_ext_emu::emu_vector_path);
}

// The plugin's ops are composites of ATen ops (the GDN ones never read tensor data on the
// host; the K3 prolog's cache write uses boolean indexing): one registration serves every
// device whose ATen kernels exist (CPU here; on an NPU torch_npu's), whether or not this
// library was built where CANN was installed.
TORCH_LIBRARY_IMPL(_C_ascend_ext, CompositeExplicitAutograd, m) {
  m.impl("npu_mla_prolog_v3_k3", &ascend_ext_k3::mla_prolog_v3_k3_kernel);
  m.impl("npu_causal_conv1d_ext", &ascend_ext_gdn::causal_conv1d_ext_kernel);
  m.impl("npu_recurrent_gated_delta_rule_ext", &ascend_ext_gdn::recurrent_gdr_ext_kernel);
}

// Emulation kernels: the compiled form of a Python reference, CPU only.
TORCH_LIBRARY_IMPL(_C_ascend_ext, CPU, m) {
  m.impl("emu_fused_infer_attention_score", &ascend_ext_emu::fia_emu_kernel);
  m.impl("emu_recurrent_gated_delta_rule", &ascend_ext_emu::gdr_emu_kernel);
  m.impl("emu_scatter_pa_kv_cache", &ascend_ext_emu::scatter_kv_emu_kernel);
  m.impl("emu_rms_norm", &ascend_ext_emu::rms_norm_emu_kernel);
  m.impl("emu_add_rms_norm", &ascend_ext_emu::add_rms_norm_emu_kernel);
  m.impl("emu_rope", &ascend_ext_emu::rope_emu_kernel);
  m.impl("emu_swiglu", &ascend_ext_emu::swiglu_emu_kernel);
}

// Shapes without data (torch.compile, contract mode): explicit, ahead of the composite.
TORCH_LIBRARY_IMPL(_C_ascend_ext, Meta, m) {
  m.impl("npu_mla_prolog_v3_k3", &ascend_ext_k3::mla_prolog_v3_k3_meta);
  m.impl("npu_causal_conv1d_ext", &ascend_ext_gdn::causal_conv1d_ext_meta);
  m.impl("npu_recurrent_gated_delta_rule_ext", &ascend_ext_gdn::recurrent_gdr_ext_meta);
  // the layer-op emulation kernels run inside a compiled model's trace
  m.impl("emu_rms_norm", &ascend_ext_emu::rms_norm_emu_meta);
  m.impl("emu_add_rms_norm", &ascend_ext_emu::add_rms_norm_emu_meta);
  m.impl("emu_rope", &ascend_ext_emu::rope_emu_meta);
  m.impl("emu_swiglu", &ascend_ext_emu::swiglu_emu_meta);
}

#ifdef ASCEND_EXT_WITH_NPU
// Built only where CANN is found (setup.py): a fused Ascend C kernel would register its
// PrivateUse1 implementation here, ahead of the composite.
#endif
