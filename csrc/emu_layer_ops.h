// Compiled CPU kernels of the emulation for torch_npu's layer operators (csrc/emu_layer_ops.cpp):
// emu_rms_norm, emu_add_rms_norm, emu_rope, emu_swiglu, each with a Meta kernel.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace ascend_ext_emu {

std::tuple<at::Tensor, at::Tensor> rms_norm_emu_kernel(const at::Tensor& x, const at::Tensor& gamma,
                                                       double epsilon);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_emu_kernel(
    const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& gamma, double epsilon);
std::tuple<at::Tensor, at::Tensor> rope_emu_kernel(const at::Tensor& positions, const at::Tensor& query,
                                                   const at::Tensor& key, const at::Tensor& cos_sin_cache,
                                                   int64_t head_size, bool neox);
at::Tensor swiglu_emu_kernel(const at::Tensor& x);

std::tuple<at::Tensor, at::Tensor> rms_norm_emu_meta(const at::Tensor& x, const at::Tensor& gamma, double epsilon);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_emu_meta(const at::Tensor& x1, const at::Tensor& x2,
                                                                     const at::Tensor& gamma, double epsilon);
std::tuple<at::Tensor, at::Tensor> rope_emu_meta(const at::Tensor& positions, const at::Tensor& query,
                                                 const at::Tensor& key, const at::Tensor& cos_sin_cache,
                                                 int64_t head_size, bool neox);
at::Tensor swiglu_emu_meta(const at::Tensor& x);

}  // namespace ascend_ext_emu
