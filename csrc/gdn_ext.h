// The plugin's own Gated-DeltaNet ops (namespace _C_ascend_ext, suffix _ext):
//   npu_causal_conv1d_ext              the GDN layers' causal depthwise conv (all SoCs:
//                                      torch_npu's npu_fused_causal_conv1d is 950-only,
//                                      K = 3 only, no activation / bias)
//   npu_recurrent_gated_delta_rule_ext the recurrence where torch_npu documents none
//                                      (Ascend 950), prefill and decode alike
// Semantics: vllm_ascend_ext/ops/causal_conv1d.py and ops/gdn_ext.py (the Python
// references). These kernels are composites of ATen ops that never read tensor data on
// the host (per-token request ids by searchsorted, masks instead of branches), so the
// same code is the CPU kernel and, in a CANN build, the NPU (PrivateUse1) kernel.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace ascend_ext_gdn {

at::Tensor causal_conv1d_ext_kernel(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_states,
    const at::Tensor& query_start_loc, const at::Tensor& cache_indices,
    const at::Tensor& has_initial_state, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& num_accepted_tokens, bool silu, int64_t pad_slot_id);

at::Tensor causal_conv1d_ext_meta(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_states,
    const at::Tensor& query_start_loc, const at::Tensor& cache_indices,
    const at::Tensor& has_initial_state, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& num_accepted_tokens, bool silu, int64_t pad_slot_id);

at::Tensor recurrent_gdr_ext_kernel(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& state, const at::Tensor& beta, double scale,
    const at::Tensor& actual_seq_lengths, const at::Tensor& ssm_state_indices,
    const std::optional<at::Tensor>& num_accepted_tokens, const std::optional<at::Tensor>& g,
    const std::optional<at::Tensor>& has_initial_state, int64_t max_seq_len);

at::Tensor recurrent_gdr_ext_meta(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& state, const at::Tensor& beta, double scale,
    const at::Tensor& actual_seq_lengths, const at::Tensor& ssm_state_indices,
    const std::optional<at::Tensor>& num_accepted_tokens, const std::optional<at::Tensor>& g,
    const std::optional<at::Tensor>& has_initial_state, int64_t max_seq_len);

}  // namespace ascend_ext_gdn
