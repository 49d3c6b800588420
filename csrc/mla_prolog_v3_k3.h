// npu_mla_prolog_v3_k3: the MLA prolog for layers without a RoPE part
// (qk_rope_head_dim == 0). Semantics: docs/npu-ops.md section 2 with the RoPE
// inputs, outputs and the rope cache removed; see vllm_ascend_ext/ops/mla_prolog_k3.py.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>
#include <tuple>

namespace ascend_ext_k3 {

// Composite implementation (ATen ops only): the CPU kernel, and the NPU
// (PrivateUse1) kernel where the library is built with CANN.
std::tuple<at::Tensor, at::Tensor> mla_prolog_v3_k3_kernel(
    const at::Tensor& token_x, const at::Tensor& weight_dq, const at::Tensor& weight_uq_qr,
    const at::Tensor& weight_uk, const at::Tensor& weight_dkv_kr,
    const at::Tensor& rmsnorm_gamma_cq, const at::Tensor& rmsnorm_gamma_ckv,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& cache_index,
    double rmsnorm_epsilon_cq, double rmsnorm_epsilon_ckv, std::string_view cache_mode,
    bool query_norm_flag, double qc_qr_scale, double kc_scale);

// Shapes and dtypes only (meta tensors: graph capture, shape propagation).
std::tuple<at::Tensor, at::Tensor> mla_prolog_v3_k3_meta(
    const at::Tensor& token_x, const at::Tensor& weight_dq, const at::Tensor& weight_uq_qr,
    const at::Tensor& weight_uk, const at::Tensor& weight_dkv_kr,
    const at::Tensor& rmsnorm_gamma_cq, const at::Tensor& rmsnorm_gamma_ckv,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& cache_index,
    double rmsnorm_epsilon_cq, double rmsnorm_epsilon_ckv, std::string_view cache_mode,
    bool query_norm_flag, double qc_qr_scale, double kc_scale);

}  // namespace ascend_ext_k3
