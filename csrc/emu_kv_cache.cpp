// emu_scatter_pa_kv_cache: the CPU kernel behind the reference of torch_npu's
// npu_scatter_pa_kv_cache in ND ("Norm") mode (vllm_ascend_ext/ops/kv_cache.py, the
// readable truth; its argument checks run in Python first). Emulation only: CPU.
//
// Token t's row (KV_N x D elements) goes to block slot // block_size, row slot %
// block_size, of a cache [num_blocks, block_size, KV_N, D] whose token rows are
// contiguous and whose blocks may be strided (the backend's K/V plane views of vLLM's
// pages). Every slot is checked first: one outside the cache writes nothing.
#include "emu_attention.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace ascend_ext_emu {
namespace {

constexpr const char* kScatter = "emu_scatter_pa_kv_cache";

template <typename I>
void check_slots(const I* slots, int64_t n, int64_t rows) {
  for (int64_t t = 0; t < n; ++t)
    TORCH_CHECK(slots[t] >= 0 && slots[t] < rows, "slots must lie in [0, ", rows - 1,
                "] (no padding slots), got slot_mapping[", t, "] = ", static_cast<int64_t>(slots[t]));
}

bool rows_contiguous(const at::Tensor& t) {  // [.., KV_N, D] rows of KV_N * D elements
  return t.stride(-1) == 1 && t.stride(-2) == t.size(-1);
}

template <typename I>
void copy_rows(const at::Tensor& src, const at::Tensor& cache, const I* slots) {
  const int64_t n = src.size(0), bs = cache.size(1);
  const int64_t bytes = src.size(1) * src.size(2) * src.element_size();
  const int64_t s_src = src.stride(0) * src.element_size();
  const int64_t s_blk = cache.stride(0) * cache.element_size();
  const int64_t s_row = cache.stride(1) * cache.element_size();
  const char* sp = static_cast<const char*>(src.data_ptr());
  char* cp = static_cast<char*>(cache.data_ptr());
  at::parallel_for(0, n, 256, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = slots[t];
      std::memcpy(cp + (s / bs) * s_blk + (s % bs) * s_row, sp + t * s_src, bytes);
    }
  });
}

template <typename I>
void scatter(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
             const at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  const at::Tensor sl = slot_mapping.contiguous();
  const I* slots = sl.data_ptr<I>();
  const int64_t n = sl.numel();
  check_slots(slots, n, key_cache.size(0) * key_cache.size(1));
  check_slots(slots, n, value_cache.size(0) * value_cache.size(1));
  copy_rows(key, key_cache, slots);
  copy_rows(value, value_cache, slots);
}

}  // namespace

void scatter_kv_emu_kernel(const at::Tensor& key, const at::Tensor& value,
                           const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && key_cache.dim() == 4 && value_cache.dim() == 4 &&
                  slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) &&
                  value.size(0) == key.size(0),
              kScatter, ": key/value [T, KV_N, D], caches [num_blocks, block_size, KV_N, D], "
              "slot_mapping [T]");
  TORCH_CHECK(key_cache.size(2) * key_cache.size(3) == key.size(1) * key.size(2) &&
                  value_cache.size(2) * value_cache.size(3) == value.size(1) * value.size(2) &&
                  key_cache.scalar_type() == key.scalar_type() &&
                  value_cache.scalar_type() == value.scalar_type(),
              kScatter, ": cache rows must match the token rows in size and dtype");
  TORCH_CHECK(rows_contiguous(key) && rows_contiguous(value) && rows_contiguous(key_cache) &&
                  rows_contiguous(value_cache) && key_cache.stride(1) == key.size(1) * key.size(2) &&
                  value_cache.stride(1) == value.size(1) * value.size(2),
              kScatter, ": token rows must be contiguous in the inputs and the caches");
  if (slot_mapping.scalar_type() == at::kInt) {
    scatter<int32_t>(key, value, key_cache, value_cache, slot_mapping);
  } else {
    TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, kScatter, ": slot_mapping int32 or int64");
    scatter<int64_t>(key, value, key_cache, value_cache, slot_mapping);
  }
}

}  // namespace ascend_ext_emu
