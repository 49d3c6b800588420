// Compiled CPU kernels of the emulation (namespace _C_ascend_ext, prefix emu_):
//   emu_fused_infer_attention_score   the CPU kernel behind the reference of torch_npu's
//                                     npu_fused_infer_attention_score (TND; paged BnBsH /
//                                     BnNBsD or packed K/V; sparse_mode 0/2/3/4; GQA; LSE)
//   emu_recurrent_gated_delta_rule    the CPU kernel behind the reference of torch_npu's
//                                     npu_recurrent_gated_delta_rule (csrc/emu_gdn.cpp)
//   emu_scatter_pa_kv_cache           the CPU kernel behind the reference of torch_npu's
//                                     npu_scatter_pa_kv_cache, ND mode (csrc/emu_kv_cache.cpp)
// Semantics: vllm_ascend_ext/ops/fia.py, ops/gdn_recurrent.py, ops/kv_cache.py (the Python reference, the readable truth; the
// argument checks stay in Python, ops/fia_checks.py, and run before this kernel). These
// are emulation kernels: registered for CPU only, never an NPU operator.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ascend_ext_emu {

// One attention call in plain pointers and element strides (the dispatcher fills it).
struct FiaArgs {
  const void* q = nullptr;  // [T, N, D], last dim contiguous
  int64_t q_st = 0, q_sh = 0;
  const void* k = nullptr;  // key position (block, slot, head) -> element offset
  const void* v = nullptr;
  int64_t k_sb = 0, k_ss = 0, k_sh = 0;
  int64_t v_sb = 0, v_ss = 0, v_sh = 0;
  int64_t num_planes = 0;      // paged: valid block ids are [0, num_planes)
  const int32_t* table = nullptr;  // paged: [B, max_blocks] block ids; null: packed K/V
  int64_t table_st = 0, table_w = 0, block_size = 0;
  const int64_t* cu_q = nullptr;     // [B + 1]
  const int64_t* kv_lens = nullptr;  // [B]
  const int64_t* kv_start = nullptr; // packed K/V: [B] first row of each request
  int64_t N = 0, KVN = 0, D = 0, DV = 0;
  const uint8_t* mask = nullptr;  // sparse_mode 0 with an explicit mask (nonzero = masked)
  int64_t mask_rows = 0, mask_cols = 0;
  int64_t sparse_mode = 0, pre = 0, nxt = 0;
  float scale = 1.f;
  void* out = nullptr;    // [T, N, DV] contiguous, query dtype
  float* lse = nullptr;   // [T, N] fp32 or null
};

// A unit of work: rows [r0, r1) of request b, KV heads [h0, h1) (all their query heads).
struct FiaItem {
  int64_t b, h0, h1, r0, r1;
};

namespace DEFAULT {
int64_t fia_run(const FiaArgs& a, const std::vector<FiaItem>& items, at::ScalarType dtype);
}
namespace AVX2 {
int64_t fia_run(const FiaArgs& a, const std::vector<FiaItem>& items, at::ScalarType dtype);
}

std::tuple<at::Tensor, at::Tensor> fia_emu_kernel(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& block_table, at::IntArrayRef cu_q,
    at::IntArrayRef kv_lens, at::OptionalIntArrayRef cu_kv,
    const std::optional<at::Tensor>& mask2d, int64_t num_kv_heads, int64_t sparse_mode,
    int64_t pre_tokens, int64_t next_tokens, double scale, int64_t block_size,
    bool softmax_lse_flag);

at::Tensor gdr_emu_kernel(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& state, const at::Tensor& beta,
                          const std::optional<at::Tensor>& g, double scale, at::IntArrayRef starts,
                          at::IntArrayRef lens, at::IntArrayRef slots, at::IntArrayRef init_slots);

void scatter_kv_emu_kernel(const at::Tensor& key, const at::Tensor& value,
                           const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& slot_mapping);

// Threads the last emu_ kernel call ran its parallel region on (set by each kernel: the
// torch thread setting, whatever the machine's load), and which vector path the attention
// kernel takes.
extern std::atomic<int64_t> g_emu_last_threads;
int64_t emu_last_threads();
std::string emu_vector_path();

}  // namespace ascend_ext_emu
