// Dispatcher of the emulation kernels (see emu_attention.h): layout checks, work items,
// and the vector path (AVX2 + FMA where the CPU has it and the build compiled it).
#include "emu_attention.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

namespace ascend_ext_emu {
namespace {

constexpr const char* kOp = "emu_fused_infer_attention_score";
constexpr int64_t kTileVectors = 32;  // query vectors (rows x heads of one KV head) per item

// ASCEND_EXT_EMU_ISA=default forces the portable path (tests compare the two).
bool use_avx2() {
#if defined(ASCEND_EXT_WITH_AVX2)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  const char* forced = std::getenv("ASCEND_EXT_EMU_ISA");
  return ok && !(forced != nullptr && std::string(forced) == "default");
#else
  return false;
#endif
}

// (block, slot, head) element strides of a K or V cache / packed tensor.
void kv_strides(const at::Tensor& t, bool paged, int64_t& sb, int64_t& ss, int64_t& sh,
                int64_t dim, const char* name) {
  TORCH_CHECK(t.stride(-1) == 1, kOp, ": ", name, " must have a contiguous last dimension");
  if (!paged) {  // [T_kv, KV_N, D]
    sb = 0, ss = t.stride(0), sh = t.stride(1);
  } else if (t.dim() == 3) {  // BnBsH [nb, bs, KV_N * D]: heads side by side in a row
    sb = t.stride(0), ss = t.stride(1), sh = dim;
  } else {  // BnNBsD [nb, KV_N, bs, D]
    sb = t.stride(0), sh = t.stride(1), ss = t.stride(2);
  }
}

}  // namespace

std::atomic<int64_t> g_emu_last_threads{0};

int64_t emu_last_threads() { return g_emu_last_threads.load(); }

std::string emu_vector_path() { return use_avx2() ? "avx2" : "default"; }

std::tuple<at::Tensor, at::Tensor> fia_emu_kernel(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& block_table, at::IntArrayRef cu_q,
    at::IntArrayRef kv_lens, at::OptionalIntArrayRef cu_kv,
    const std::optional<at::Tensor>& mask2d, int64_t num_kv_heads, int64_t sparse_mode,
    int64_t pre_tokens, int64_t next_tokens, double scale, int64_t block_size,
    bool softmax_lse_flag) {
  TORCH_CHECK(query.dim() == 3, kOp, ": query must be [T, N, D]");
  TORCH_CHECK(key.scalar_type() == query.scalar_type() && value.scalar_type() == query.scalar_type(),
              kOp, ": query, key and value must share a dtype");
  const bool paged = block_table.has_value();
  const int64_t T = query.size(0), N = query.size(1), D = query.size(2);
  const int64_t B = static_cast<int64_t>(kv_lens.size());
  TORCH_CHECK(static_cast<int64_t>(cu_q.size()) == B + 1 && cu_q[0] == 0 && cu_q[B] == T, kOp,
              ": cu_q must be [0, ..., T] with one entry per request plus one");
  TORCH_CHECK(num_kv_heads > 0 && N % num_kv_heads == 0, kOp, ": bad num_kv_heads");
  // Value head size (may differ from the key's, e.g. Dk 192 with Dv 128): packed
  // [T_kv, KV_N, Dv], BnBsH [nb, bs, KV_N * Dv], BnNBsD [nb, KV_N, bs, Dv].
  TORCH_CHECK(!paged || value.dim() == key.dim(), kOp,
              ": the value cache must have the key cache's layout");
  const int64_t DV = !paged ? value.size(2)
                     : value.dim() == 3 ? value.size(2) / num_kv_heads
                                        : value.size(3);
  TORCH_CHECK(!paged || value.dim() != 3 || value.size(2) == DV * num_kv_heads, kOp,
              ": a BnBsH value cache's rows must hold num_kv_heads * Dv elements");

  at::Tensor q = query.stride(-1) == 1 ? query : query.contiguous();
  at::Tensor out = at::empty({T, N, DV}, query.options());
  at::Tensor lse = softmax_lse_flag
                       ? at::empty({T, N, 1}, query.options().dtype(at::kFloat))
                       : at::empty({0}, query.options().dtype(at::kFloat));
  std::vector<int64_t> cu(cu_q.begin(), cu_q.end()), lens(kv_lens.begin(), kv_lens.end());
  std::vector<int64_t> starts;

  FiaArgs a;
  a.q = q.data_ptr(), a.q_st = q.stride(0), a.q_sh = q.stride(1);
  a.k = key.data_ptr(), a.v = value.data_ptr();
  kv_strides(key, paged, a.k_sb, a.k_ss, a.k_sh, D, "key");
  kv_strides(value, paged, a.v_sb, a.v_ss, a.v_sh, DV, "value");
  at::Tensor table;
  if (paged) {
    table = block_table->to(at::kInt).contiguous();
    TORCH_CHECK(table.dim() == 2 && table.size(0) >= B && table.size(1) > 0, kOp,
                ": block_table must be [>= B, max_blocks]");
    TORCH_CHECK(block_size > 0, kOp, ": block_size must be positive");
    a.table = table.data_ptr<int32_t>(), a.table_st = table.stride(0), a.table_w = table.size(1);
    a.block_size = block_size, a.num_planes = key.size(0);
  } else {
    TORCH_CHECK(cu_kv.has_value() && static_cast<int64_t>(cu_kv->size()) == B + 1, kOp,
                ": packed K/V need cu_kv with B + 1 entries");
    starts.assign(cu_kv->begin(), cu_kv->end() - 1);
    a.kv_start = starts.data();
  }
  at::Tensor mask;
  if (mask2d.has_value() && sparse_mode == 0) {
    mask = mask2d->to(at::kByte).contiguous();
    TORCH_CHECK(mask.dim() == 2, kOp, ": mask2d must be 2-D");
    a.mask = mask.data_ptr<uint8_t>(), a.mask_rows = mask.size(0), a.mask_cols = mask.size(1);
  }
  a.cu_q = cu.data(), a.kv_lens = lens.data();
  a.N = N, a.KVN = num_kv_heads, a.D = D, a.DV = DV;
  a.sparse_mode = sparse_mode, a.pre = pre_tokens, a.nxt = next_tokens;
  a.scale = static_cast<float>(scale);
  a.out = out.data_ptr();
  a.lse = softmax_lse_flag ? lse.data_ptr<float>() : nullptr;

  // Work items, largest first (the threads take them from a shared counter). An item
  // takes all KV heads (each page of the cache is then read front to back, once); with
  // few items per thread they are split per KV head.
  const int64_t G = N / num_kv_heads;
  const int64_t tile = std::max<int64_t>(1, kTileVectors / N);
  int64_t n_tiles = 0;
  for (int64_t b = 0; b < B; ++b) n_tiles += (cu[b + 1] - cu[b] + tile - 1) / tile;
  const bool per_head = n_tiles < 4 * at::get_num_threads() && num_kv_heads > 1;
  const int64_t rows_per = per_head ? std::max<int64_t>(1, kTileVectors / G) : tile;
  const int64_t head_step = per_head ? 1 : num_kv_heads;
  std::vector<FiaItem> items;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = cu[b + 1] - cu[b];
    for (int64_t r0 = 0; r0 < q_len; r0 += rows_per)
      for (int64_t h = 0; h < num_kv_heads; h += head_step)
        items.push_back({b, h, h + head_step, r0, std::min(q_len, r0 + rows_per)});
  }
  auto cost = [&](const FiaItem& it) {  // query vectors x keys
    return (it.r1 - it.r0) * (it.h1 - it.h0) * std::max<int64_t>(1, lens[it.b]);
  };
  std::stable_sort(items.begin(), items.end(),
                   [&](const FiaItem& x, const FiaItem& y) { return cost(x) > cost(y); });

  const int64_t used = use_avx2() ? AVX2::fia_run(a, items, query.scalar_type())
                                  : DEFAULT::fia_run(a, items, query.scalar_type());
  g_emu_last_threads.store(used);
  return {out, lse};
}

#if !defined(ASCEND_EXT_WITH_AVX2)
namespace AVX2 {  // not built (not x86-64): never called, use_avx2() is false
int64_t fia_run(const FiaArgs& a, const std::vector<FiaItem>& items, at::ScalarType dtype) {
  return DEFAULT::fia_run(a, items, dtype);
}
}  // namespace AVX2
#endif

}  // namespace ascend_ext_emu
