// The FIA emulation kernel body, compiled once per vector path (see emu_attention.h).
// Included by emu_attention_default.cpp and emu_attention_avx2.cpp, each built with
// its own CPU_CAPABILITY (setup.py): the same source, at::vec picks the instructions.
//
// Per work item (request b, KV head h, a tile of query rows with all G = N / KVN query
// heads of h): the tile's query vectors (fp32, pre-scaled), then one pass over its keys,
// page by page, reading the paged cache in place: scores, mask by the row's visible key
// interval (and, in sparse_mode 0 with a mask, the mask itself), an online softmax and the
// weighted sum of values, all fp32. Items are handed to the threads of at::parallel_for
// largest first, from a shared counter.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "emu_attention.h"

namespace ascend_ext_emu {
namespace CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kPackedChunk = 128;  // key positions per pass when K/V are packed

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n, float mul) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * mul;
}

// s[i] = dot(q_i, k) for the NQ (<= 4) query rows q_i (stride ldq) and one key row k.
template <int NQ>
inline void dots(const float* q, int64_t ldq, const float* k, int64_t n, float* s) {
  const int64_t w = Vec::size();
  Vec acc[NQ];
  for (int i = 0; i < NQ; ++i) acc[i] = Vec(0.f);
  int64_t d = 0;
  for (; d + w <= n; d += w) {
    const Vec kv = Vec::loadu(k + d);
    for (int i = 0; i < NQ; ++i) acc[i] = at::vec::fmadd(Vec::loadu(q + i * ldq + d), kv, acc[i]);
  }
  for (int i = 0; i < NQ; ++i) {
    float t = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc[i]);
    for (int64_t e = d; e < n; ++e) t += q[i * ldq + e] * k[e];
    s[i] = t;
  }
}

// acc_i[0:n] = acc_i * alpha_i + sum_j p_i[j] * rows[j][0:n] for NP (<= 2) accumulator rows
// (acc stride lda, p stride ldp) and n_rows value rows (stride ld).
template <int NP>
inline void scale_accumulate(float* acc, int64_t lda, const float* alpha, const float* p,
                             int64_t ldp, const float* rows, int64_t ld, int64_t n_rows,
                             int64_t n) {
  const int64_t w = Vec::size();
  int64_t d = 0;
  for (; d + 4 * w <= n; d += 4 * w) {
    Vec a[NP][4];
    for (int i = 0; i < NP; ++i)
      for (int c = 0; c < 4; ++c) a[i][c] = Vec::loadu(acc + i * lda + d + c * w) * Vec(alpha[i]);
    for (int64_t j = 0; j < n_rows; ++j) {
      const float* r = rows + j * ld + d;
      const Vec r0 = Vec::loadu(r), r1 = Vec::loadu(r + w), r2 = Vec::loadu(r + 2 * w),
                r3 = Vec::loadu(r + 3 * w);
      for (int i = 0; i < NP; ++i) {
        const Vec pj(p[i * ldp + j]);
        a[i][0] = at::vec::fmadd(pj, r0, a[i][0]);
        a[i][1] = at::vec::fmadd(pj, r1, a[i][1]);
        a[i][2] = at::vec::fmadd(pj, r2, a[i][2]);
        a[i][3] = at::vec::fmadd(pj, r3, a[i][3]);
      }
    }
    for (int i = 0; i < NP; ++i)
      for (int c = 0; c < 4; ++c) a[i][c].store(acc + i * lda + d + c * w);
  }
  for (int i = 0; i < NP; ++i) {
    for (int64_t e = d; e < n; ++e) {
      float t = acc[i * lda + e] * alpha[i];
      for (int64_t j = 0; j < n_rows; ++j) t += p[i * ldp + j] * rows[j * ld + e];
      acc[i * lda + e] = t;
    }
  }
}

// exp(x - m) for n floats in place; returns their sum (x = -inf gives 0).
inline float exp_sub_sum(float* x, int64_t n, float m) {
  const int64_t w = Vec::size();
  Vec sum(0.f);
  const Vec vm(m);
  int64_t j = 0;
  for (; j + w <= n; j += w) {
    Vec e = (Vec::loadu(x + j) - vm).exp_u20();
    e.store(x + j);
    sum = sum + e;
  }
  float s = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, sum);
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    s += x[j];
  }
  return s;
}

inline float max_of(const float* x, int64_t n) {
  const int64_t w = Vec::size();
  Vec mv(kNegInf);
  int64_t j = 0;
  for (; j + w <= n; j += w) mv = at::vec::maximum(mv, Vec::loadu(x + j));
  float m = at::vec::vec_reduce_all<float>(
      [](Vec& x1, Vec& x2) { return at::vec::maximum(x1, x2); }, mv);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// Visible key interval [lo, hi] of query row i (empty when lo > hi).
inline void row_interval(const FiaArgs& a, int64_t i, int64_t q_len, int64_t kv_len,
                         int64_t& lo, int64_t& hi) {
  const int64_t off = kv_len - q_len;
  lo = 0;
  hi = kv_len - 1;
  switch (a.sparse_mode) {
    case 3: hi = std::min(hi, i + off); break;
    case 2: hi = std::min(hi, i); break;
    case 4:
      lo = std::max<int64_t>(lo, i + off - a.pre);
      hi = std::min(hi, i + off + a.nxt);
      break;
    default:
      if (a.mask != nullptr) {
        lo = std::max<int64_t>(lo, i - a.pre);
        hi = std::min(hi, i + a.nxt);
        if (i >= a.mask_rows) hi = -1;
      }
  }
}

template <typename T>
struct Worker {
  const FiaArgs& a;
  const T* q;
  const T* k;
  const T* v;
  // Query vector m of KV head h0 + hh is hh * M + m (m = row * G + g).
  std::vector<float> qs, acc, m_run, l_run, alpha, s, kf, vf;
  std::vector<int64_t> lo, hi;

  Worker(const FiaArgs& args)
      : a(args), q(static_cast<const T*>(args.q)), k(static_cast<const T*>(args.k)),
        v(static_cast<const T*>(args.v)) {}

  // n rows of dim elements (row stride st) as fp32 rows: in place for fp32 (row stride st),
  // converted into buf otherwise (row stride dim).
  const float* rows(const T* base, int64_t st, int64_t n, int64_t dim, std::vector<float>& buf) {
    if constexpr (std::is_same_v<T, float>) {
      return base;
    } else {
      buf.resize(n * dim);
      for (int64_t j = 0; j < n; ++j) to_float(base + j * st, buf.data() + j * dim, dim, 1.f);
      return buf.data();
    }
  }

  int64_t block_of(int64_t b, int64_t j) const {
    const int64_t col = std::min(j / a.block_size, a.table_w - 1);
    const int64_t blk = a.table[b * a.table_st + col];
    TORCH_CHECK(blk >= 0 && blk < a.num_planes, "emu_fused_infer_attention_score: block_table[",
                b, "][", col, "] = ", blk, " is outside the cache's ", a.num_planes, " blocks");
    return blk;
  }

  void run(const FiaItem& it) {
    const int64_t G = a.N / a.KVN, D = a.D, DV = a.DV;
    const int64_t q_len = a.cu_q[it.b + 1] - a.cu_q[it.b], kv_len = a.kv_lens[it.b];
    const int64_t rows_n = it.r1 - it.r0, H = it.h1 - it.h0, M = rows_n * G;
    qs.resize(H * M * D);
    acc.assign(H * M * DV, 0.f);
    m_run.assign(H * M, kNegInf);
    l_run.assign(H * M, 0.f);
    lo.resize(rows_n);
    hi.resize(rows_n);
    int64_t lo_all = kv_len, hi_all = -1;
    for (int64_t r = 0; r < rows_n; ++r) {
      row_interval(a, it.r0 + r, q_len, kv_len, lo[r], hi[r]);
      if (lo[r] <= hi[r]) {
        lo_all = std::min(lo_all, lo[r]);
        hi_all = std::max(hi_all, hi[r]);
      }
      const int64_t t = a.cu_q[it.b] + it.r0 + r;
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t g = 0; g < G; ++g)
          to_float(q + t * a.q_st + ((it.h0 + hh) * G + g) * a.q_sh,
                   qs.data() + (hh * M + r * G + g) * D, D, a.scale);
    }
    const bool paged = a.table != nullptr;
    for (int64_t j0 = lo_all; j0 <= hi_all;) {  // one page (or packed chunk) at a time
      int64_t j1;
      const T *kb, *vb;
      if (paged) {
        j1 = std::min(hi_all + 1, (j0 / a.block_size + 1) * a.block_size);
        const int64_t blk = block_of(it.b, j0), slot = j0 % a.block_size;
        kb = k + blk * a.k_sb + slot * a.k_ss;
        vb = v + blk * a.v_sb + slot * a.v_ss;
      } else {
        j1 = std::min(hi_all + 1, j0 + kPackedChunk);
        kb = k + (a.kv_start[it.b] + j0) * a.k_ss;
        vb = v + (a.kv_start[it.b] + j0) * a.v_ss;
      }
      for (int64_t hh = 0; hh < H; ++hh)
        chunk(it, hh * M, j0, j1 - j0, kb + (it.h0 + hh) * a.k_sh, vb + (it.h0 + hh) * a.v_sh,
              G, D, DV);
      j0 = j1;
    }
    finish(it, G, DV);
  }

  // Keys [j0, j0 + n) of one page (or packed chunk), one KV head (its vectors from base):
  // scores over the keys some row sees, masked per row, then the online-softmax update.
  void chunk(const FiaItem& it, int64_t base, int64_t j0, int64_t n, const T* kb, const T* vb,
             int64_t G, int64_t D, int64_t DV) {
    const int64_t rows_n = it.r1 - it.r0, M = rows_n * G;
    int64_t u0 = n, u1 = 0;  // keys of this chunk some row sees, relative to j0
    for (int64_t r = 0; r < rows_n; ++r) {
      u0 = std::min(u0, std::max<int64_t>(lo[r] - j0, 0));
      u1 = std::max(u1, std::min<int64_t>(hi[r] + 1 - j0, n));
    }
    if (u0 >= u1) return;
    const int64_t nu = u1 - u0;
    const float* qh = qs.data() + base * D;
    float* acch = acc.data() + base * DV;
    float* mh = m_run.data() + base;
    float* lh = l_run.data() + base;
    const float* kr = rows(kb + u0 * a.k_ss, a.k_ss, nu, D, kf);
    const int64_t kld = std::is_same_v<T, float> ? a.k_ss : D;
    s.resize(M * nu);
    alpha.resize(M);
    for (int64_t j = 0; j < nu; ++j) {  // scores: one key row against 4 query vectors at a time
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        float t[4];
        dots<4>(qh + m * D, D, kr + j * kld, D, t);
        for (int i = 0; i < 4; ++i) s[(m + i) * nu + j] = t[i];
      }
      for (; m < M; ++m) dots<1>(qh + m * D, D, kr + j * kld, D, &s[m * nu + j]);
    }
    for (int64_t r = 0; r < rows_n; ++r) {  // mask, then the online softmax of each vector
      const int64_t i = it.r0 + r;
      const int64_t v0 = std::max<int64_t>(lo[r] - j0, u0), v1 = std::min<int64_t>(hi[r] + 1 - j0, u1);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t m = r * G + g;
        float* sm = s.data() + m * nu - u0;  // sm[jj] for jj in [u0, u1)
        float mx = kNegInf;
        if (v0 < v1) {
          std::fill(sm + u0, sm + v0, kNegInf);
          std::fill(sm + v1, sm + u1, kNegInf);
          if (a.mask != nullptr) {
            for (int64_t jj = v0; jj < v1; ++jj)
              if (j0 + jj >= a.mask_cols || a.mask[i * a.mask_cols + j0 + jj]) sm[jj] = kNegInf;
          }
          mx = max_of(sm + v0, v1 - v0);
        }
        if (mx == kNegInf) {  // nothing visible here: weights 0, accumulator kept
          std::fill(sm + u0, sm + u1, 0.f);
          alpha[m] = 1.f;
          continue;
        }
        const float m_new = std::max(mh[m], mx);
        alpha[m] = mh[m] == kNegInf ? 0.f : std::exp(mh[m] - m_new);
        lh[m] = lh[m] * alpha[m] + exp_sub_sum(sm + u0, nu, m_new);
        mh[m] = m_new;
      }
    }
    const float* vr = rows(vb + u0 * a.v_ss, a.v_ss, nu, DV, vf);
    const int64_t vld = std::is_same_v<T, float> ? a.v_ss : DV;
    int64_t m = 0;  // weighted values: one pass over the value rows per 2 query vectors
    for (; m + 2 <= M; m += 2)
      scale_accumulate<2>(acch + m * DV, DV, alpha.data() + m, s.data() + m * nu, nu, vr, vld,
                          nu, DV);
    for (; m < M; ++m)
      scale_accumulate<1>(acch + m * DV, DV, alpha.data() + m, s.data() + m * nu, nu, vr, vld,
                          nu, DV);
  }

  void finish(const FiaItem& it, int64_t G, int64_t DV) {
    T* out = static_cast<T*>(a.out);
    const int64_t rows_n = it.r1 - it.r0, M = rows_n * G;
    for (int64_t hh = 0; hh < it.h1 - it.h0; ++hh) {
      for (int64_t r = 0; r < rows_n; ++r) {
        const int64_t t = a.cu_q[it.b] + it.r0 + r;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t m = hh * M + r * G + g, hq = (it.h0 + hh) * G + g;
          T* o = out + (t * a.N + hq) * DV;
          const bool seen = l_run[m] > 0.f;
          const float inv = seen ? 1.f / l_run[m] : 0.f;
          for (int64_t d = 0; d < DV; ++d) o[d] = static_cast<T>(acc[m * DV + d] * inv);
          if (a.lse != nullptr)
            a.lse[t * a.N + hq] = seen ? m_run[m] + std::log(l_run[m]) : kNegInf;
        }
      }
    }
  }
};

template <typename T>
int64_t run_items(const FiaArgs& a, const std::vector<FiaItem>& items) {
  std::atomic<int64_t> next{0}, threads{0};
  const int64_t n = static_cast<int64_t>(items.size());
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    threads.fetch_add(1);  // one body per thread of the region, however many items it takes
    Worker<T> w(a);
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) w.run(items[i]);
  });
  return threads.load();
}

int64_t fia_run(const FiaArgs& a, const std::vector<FiaItem>& items, at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return run_items<float>(a, items);
    case at::kBFloat16: return run_items<c10::BFloat16>(a, items);
    case at::kHalf: return run_items<c10::Half>(a, items);
    default: TORCH_CHECK(false, "emu_fused_infer_attention_score: dtype ", dtype, " not supported");
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace ascend_ext_emu
