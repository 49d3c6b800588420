// emu_recurrent_gated_delta_rule: the CPU kernel behind the reference of torch_npu's
// npu_recurrent_gated_delta_rule (vllm_ascend_ext/ops/gdn_recurrent.py, the readable truth;
// its argument checks and host plan run in Python first). Emulation only: CPU.
//
// One item per (request, value head), in parallel (at::parallel_for): the request's
// initial state row block (Dv x Dk, fp32) from its initial slot, then per token
//   S = exp(g) S;  S += beta (v - S k) k^T;  o = S (scale q)
// row by row (rows of S are independent), storing S in the state dtype at the token's
// slot. Requests never share a slot (the builder's precondition, as for the reference).
#include "emu_attention.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <vector>

namespace ascend_ext_emu {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr const char* kGdr = "emu_recurrent_gated_delta_rule";

template <typename S>
void load_rows(const S* src, int64_t s_row, int64_t rows, int64_t n, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) dst[i * n + j] = static_cast<float>(src[i * s_row + j]);
}

template <typename S>
void store_rows(const float* src, int64_t rows, int64_t n, S* dst, int64_t s_row) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) dst[i * s_row + j] = static_cast<S>(src[i * n + j]);
}

// row *= a, returns dot(row, k)
inline float scale_dot(float* row, float a, const float* k, int64_t n) {
  const int64_t w = Vec::size();
  Vec acc(0.f), va(a);
  int64_t j = 0;
  for (; j + w <= n; j += w) {
    Vec r = Vec::loadu(row + j) * va;
    r.store(row + j);
    acc = at::vec::fmadd(r, Vec::loadu(k + j), acc);
  }
  float s = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; j < n; ++j) {
    row[j] *= a;
    s += row[j] * k[j];
  }
  return s;
}

// row += d * k, returns dot(row, q)
inline float axpy_dot(float* row, float d, const float* k, const float* q, int64_t n) {
  const int64_t w = Vec::size();
  Vec acc(0.f), vd(d);
  int64_t j = 0;
  for (; j + w <= n; j += w) {
    Vec r = at::vec::fmadd(vd, Vec::loadu(k + j), Vec::loadu(row + j));
    r.store(row + j);
    acc = at::vec::fmadd(r, Vec::loadu(q + j), acc);
  }
  float s = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; j < n; ++j) {
    row[j] += d * k[j];
    s += row[j] * q[j];
  }
  return s;
}

template <typename S>
void run_gdr(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
             const at::Tensor& b, const at::Tensor& g, at::Tensor& state, at::Tensor& out,
             float scale, const std::vector<int64_t>& starts, const std::vector<int64_t>& lens,
             const std::vector<int64_t>& slots, const std::vector<int64_t>& init_slots,
             std::atomic<int64_t>& threads) {
  const int64_t nk = q.size(1), dk = q.size(2), nv = v.size(1), dv = v.size(2), rep = nv / nk;
  const int64_t n_items = static_cast<int64_t>(lens.size()) * nv;
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *bp = b.data_ptr<float>(), *gp = g.defined() ? g.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  S* sp = state.data_ptr<S>();
  const int64_t s0 = state.stride(0), s1 = state.stride(1), s2 = state.stride(2);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    threads.fetch_add(1);  // one body per thread of the region, however many items it takes
    std::vector<float> st(dv * dk), qs(dk);
    for (int64_t it = next.fetch_add(1); it < n_items; it = next.fetch_add(1)) {
      const int64_t r = it / nv, h = it % nv, hk = h / rep;
      if (lens[r] == 0) continue;
      load_rows(sp + init_slots[r] * s0 + h * s1, s2, dv, dk, st.data());
      for (int64_t p = 0; p < lens[r]; ++p) {
        const int64_t t = starts[r] + p;
        const float a = gp ? std::exp(gp[t * nv + h]) : 1.f, beta = bp[t * nv + h];
        const float* kt = kp + (t * nk + hk) * dk;
        const float* qt = qp + (t * nk + hk) * dk;
        for (int64_t j = 0; j < dk; ++j) qs[j] = qt[j] * scale;
        for (int64_t i = 0; i < dv; ++i) {
          float* row = st.data() + i * dk;
          const float kv = scale_dot(row, a, kt, dk);
          const float d = (vp[(t * nv + h) * dv + i] - kv) * beta;
          op[(t * nv + h) * dv + i] = axpy_dot(row, d, kt, qs.data(), dk);
        }
        store_rows(st.data(), dv, dk, sp + slots[t] * s0 + h * s1, s2);
      }
    }
  });
}

}  // namespace

at::Tensor gdr_emu_kernel(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const at::Tensor& state_in, const at::Tensor& beta,
                          const std::optional<at::Tensor>& g, double scale, at::IntArrayRef starts,
                          at::IntArrayRef lens, at::IntArrayRef slots, at::IntArrayRef init_slots) {
  TORCH_CHECK(query.dim() == 3 && key.sizes() == query.sizes() && value.dim() == 3 &&
                  value.size(0) == query.size(0) && value.size(1) % query.size(1) == 0,
              kGdr, ": query/key (T, Nk, Dk), value (T, Nv, Dv) with Nv a multiple of Nk");
  TORCH_CHECK(state_in.dim() == 4 && state_in.size(1) == value.size(1) &&
                  state_in.size(2) == value.size(2) && state_in.size(3) == query.size(2) &&
                  state_in.stride(3) == 1,
              kGdr, ": state must be (N, Nv, Dv, Dk) with a contiguous last dimension");
  TORCH_CHECK(starts.size() == lens.size() && init_slots.size() == lens.size() &&
                  static_cast<int64_t>(slots.size()) == query.size(0),
              kGdr, ": one start, length and initial slot per request, one slot per token");
  for (int64_t s : slots) TORCH_CHECK(s >= 0 && s < state_in.size(0), kGdr, ": slot ", s, " outside the state");
  for (int64_t s : init_slots) TORCH_CHECK(s >= 0 && s < state_in.size(0), kGdr, ": slot ", s, " outside the state");
  const auto f = at::kFloat;
  at::Tensor q = query.to(f).contiguous(), k = key.to(f).contiguous(), v = value.to(f).contiguous();
  at::Tensor b = beta.to(f).contiguous(), gg = g.has_value() ? g->to(f).contiguous() : at::Tensor();
  at::Tensor out = at::zeros(value.sizes(), value.options().dtype(f));
  at::Tensor state = state_in;  // written in place
  std::vector<int64_t> st(starts.begin(), starts.end()), ln(lens.begin(), lens.end()),
      sl(slots.begin(), slots.end()), in(init_slots.begin(), init_slots.end());
  std::atomic<int64_t> threads{0};
  switch (state.scalar_type()) {
    case at::kFloat: run_gdr<float>(q, k, v, b, gg, state, out, scale, st, ln, sl, in, threads); break;
    case at::kBFloat16: run_gdr<c10::BFloat16>(q, k, v, b, gg, state, out, scale, st, ln, sl, in, threads); break;
    case at::kHalf: run_gdr<c10::Half>(q, k, v, b, gg, state, out, scale, st, ln, sl, in, threads); break;
    default: TORCH_CHECK(false, kGdr, ": state dtype ", state.scalar_type(), " not supported");
  }
  g_emu_last_threads.store(threads.load());
  return out.to(value.scalar_type());
}

}  // namespace ascend_ext_emu
