// npu_mla_prolog_v3_k3 kernels. Math (per token t, head n):
//   c^Q   = RmsNorm(x @ W_dq, gamma_cq) * qc_qr_scale      rounded to weight_uk's dtype;
//           x @ W_dq is rounded to token_x's dtype first when that is bf16/fp16
//   q     = c^Q @ W_uq_qr -> [T, N, D]                    (no rope part)
//   query = round(q) @ W_uk[n]                             [T, N, Hckv]
//   c^KV  = RmsNorm(x @ W_dkv_kr, gamma_ckv) * kc_scale   written to kv_cache
// fp32 accumulation; outputs in weight_uk's dtype.
#include "mla_prolog_v3_k3.h"

#include <c10/util/Exception.h>

namespace ascend_ext_k3 {
namespace {

constexpr const char* kOp = "npu_mla_prolog_v3_k3";

struct Dims {
  int64_t tokens, hidden, n, d, hckv, hcq;
};

Dims check_k3(const at::Tensor& x, const at::Tensor& w_dq, const at::Tensor& w_uq,
              const at::Tensor& w_uk, const at::Tensor& w_dkv, const at::Tensor& g_cq,
              const at::Tensor& g_ckv, const at::Tensor& kv_cache,
              const std::optional<at::Tensor>& cache_index, std::string_view mode) {
  TORCH_CHECK(mode == "PA_BSND" || mode == "BSND", kOp, ": cache_mode must be PA_BSND or BSND, got ",
              std::string(mode));
  TORCH_CHECK(w_uk.dim() == 3, kOp, ": weight_uk must be [N, D, Hckv], got ", w_uk.sizes());
  Dims s{};
  s.hidden = x.size(-1);
  s.tokens = x.numel() / std::max<int64_t>(s.hidden, 1);
  s.n = w_uk.size(0);
  s.d = w_uk.size(1);
  s.hckv = w_uk.size(2);
  s.hcq = g_cq.size(-1);
  TORCH_CHECK(s.d == 96 || s.d == 128, kOp, ": nope head dim must be 96 or 128, got ", s.d);
  TORCH_CHECK(w_dq.dim() == 2 && w_dq.size(0) == s.hidden && w_dq.size(1) == s.hcq, kOp,
              ": weight_dq must be [", s.hidden, ", ", s.hcq, "] ([in, out]), got ", w_dq.sizes());
  TORCH_CHECK(w_uq.dim() == 2 && w_uq.size(0) == s.hcq && w_uq.size(1) == s.n * s.d, kOp,
              ": weight_uq_qr must be [", s.hcq, ", ", s.n * s.d, "] (no rope part), got ",
              w_uq.sizes());
  TORCH_CHECK(w_dkv.dim() == 2 && w_dkv.size(0) == s.hidden && w_dkv.size(1) == s.hckv, kOp,
              ": weight_dkv_kr must be [", s.hidden, ", ", s.hckv, "] (no rope part), got ",
              w_dkv.sizes());
  TORCH_CHECK(g_ckv.dim() == 1 && g_ckv.size(0) == s.hckv, kOp, ": rmsnorm_gamma_ckv must be [",
              s.hckv, "], got ", g_ckv.sizes());
  for (const auto* t : {&x, &w_dq, &w_uq, &w_uk, &w_dkv}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 || t->scalar_type() == at::kFloat, kOp,
                ": inputs must be bf16 or fp32, got ", t->scalar_type());
  }
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(2) == 1 && kv_cache.size(3) == s.hckv, kOp,
              ": kv_cache must be [*, *, 1, ", s.hckv, "], got ", kv_cache.sizes());
  if (mode == "PA_BSND") {
    TORCH_CHECK(cache_index.has_value(), kOp, ": cache_index (int64 slots) is required with PA_BSND");
  } else {
    TORCH_CHECK(x.dim() == 3, kOp, ": BSND needs token_x [B, S, He], got ", x.sizes());
    TORCH_CHECK(kv_cache.size(0) == x.size(0), kOp, ": BSND kv_cache batch ", kv_cache.size(0),
                " != token_x batch ", x.size(0));
  }
  if (cache_index.has_value()) {
    TORCH_CHECK(cache_index->scalar_type() == at::kLong, kOp, ": cache_index must be int64, got ",
                cache_index->scalar_type());
    TORCH_CHECK(cache_index->numel() == s.tokens, kOp, ": ", s.tokens, " tokens but ",
                cache_index->numel(), " cache indices");
  }
  return s;
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  return x * at::rsqrt(x.pow(2).mean({-1}, true) + eps) * gamma.to(at::kFloat);
}

void write_cache(const at::Tensor& kv_cache, const at::Tensor& rows,
                 const std::optional<at::Tensor>& cache_index, std::string_view mode,
                 const at::Tensor& x) {
  auto long_opts = at::TensorOptions().dtype(at::kLong).device(rows.device());
  at::Tensor first, second;
  at::Tensor src = rows;
  if (mode == "PA_BSND") {
    auto idx = cache_index->reshape({-1});
    auto keep = idx.ge(0);
    auto slots = idx.masked_select(keep);
    int64_t bs = kv_cache.size(1);
    first = at::floor_divide(slots, bs);
    second = at::remainder(slots, bs);
    src = rows.index({keep});
  } else {  // BSND: position within each batch row; default 0..S-1
    int64_t b = x.size(0), s = x.size(1);
    auto pos = cache_index.has_value() ? cache_index->reshape({b, s})
                                       : at::arange(s, long_opts).expand({b, s});
    auto batch = at::arange(b, long_opts).unsqueeze(1).expand({b, s});
    auto keep = pos.ge(0);
    first = batch.masked_select(keep);
    second = pos.masked_select(keep);
    src = rows.reshape({b, s, -1}).index({keep});
  }
  auto zero = at::zeros_like(first);
  // index_put_ writes through strided views of a larger cache row.
  kv_cache.index_put_({first, second, zero}, src.to(kv_cache.scalar_type()));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mla_prolog_v3_k3_kernel(
    const at::Tensor& token_x, const at::Tensor& weight_dq, const at::Tensor& weight_uq_qr,
    const at::Tensor& weight_uk, const at::Tensor& weight_dkv_kr,
    const at::Tensor& rmsnorm_gamma_cq, const at::Tensor& rmsnorm_gamma_ckv,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& cache_index,
    double rmsnorm_epsilon_cq, double rmsnorm_epsilon_ckv, std::string_view cache_mode,
    bool query_norm_flag, double qc_qr_scale, double kc_scale) {
  Dims s = check_k3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                    rmsnorm_gamma_ckv, kv_cache, cache_index, cache_mode);
  auto mid = weight_uk.scalar_type();
  auto x = token_x.reshape({s.tokens, s.hidden}).to(at::kFloat);
  auto cq_pre = at::matmul(x, weight_dq.to(at::kFloat));
  auto act = token_x.scalar_type();
  if (act == at::kBFloat16 || act == at::kHalf) {  // rounded to the activation dtype
    cq_pre = cq_pre.to(act).to(at::kFloat);
  }
  auto cq = (rms(cq_pre, rmsnorm_gamma_cq, rmsnorm_epsilon_cq) * qc_qr_scale).to(mid);
  auto q = at::matmul(cq.to(at::kFloat), weight_uq_qr.to(at::kFloat)).view({s.tokens, s.n, s.d});
  auto q_nope = q.to(mid).to(at::kFloat);
  // [N, T, D] x [N, D, Hckv] -> [N, T, Hckv] -> [T, N, Hckv]
  auto query = at::bmm(q_nope.transpose(0, 1), weight_uk.to(at::kFloat)).transpose(0, 1);
  auto kv = at::matmul(x, weight_dkv_kr.to(at::kFloat));
  auto ckv = rms(kv, rmsnorm_gamma_ckv, rmsnorm_epsilon_ckv) * kc_scale;
  write_cache(kv_cache, ckv, cache_index, cache_mode, token_x);
  auto query_norm = query_norm_flag ? cq : at::empty({0}, token_x.options().dtype(mid));
  return {query.to(mid).contiguous(), query_norm};
}

std::tuple<at::Tensor, at::Tensor> mla_prolog_v3_k3_meta(
    const at::Tensor& token_x, const at::Tensor& weight_dq, const at::Tensor& weight_uq_qr,
    const at::Tensor& weight_uk, const at::Tensor& weight_dkv_kr,
    const at::Tensor& rmsnorm_gamma_cq, const at::Tensor& rmsnorm_gamma_ckv,
    const at::Tensor& kv_cache, const std::optional<at::Tensor>& cache_index,
    double rmsnorm_epsilon_cq, double rmsnorm_epsilon_ckv, std::string_view cache_mode,
    bool query_norm_flag, double qc_qr_scale, double kc_scale) {
  Dims s = check_k3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                    rmsnorm_gamma_ckv, kv_cache, cache_index, cache_mode);
  auto opts = token_x.options().dtype(weight_uk.scalar_type());
  auto query = at::empty({s.tokens, s.n, s.hckv}, opts);
  auto query_norm = query_norm_flag ? at::empty({s.tokens, s.hcq}, opts) : at::empty({0}, opts);
  return {query, query_norm};
}

}  // namespace ascend_ext_k3
