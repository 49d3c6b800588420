// The CPU kernels behind the references of torch_npu's layer operators (emulation only):
//   emu_rms_norm      npu_rms_norm       (vllm_ascend_ext/ops/norm.py)
//   emu_add_rms_norm  npu_add_rms_norm   (vllm_ascend_ext/ops/add_rms_norm.py)
//   emu_rope          npu_mrope, rope mode, 'half' or 'interleave' (ops/mrope.py)
//   emu_swiglu        npu_swiglu over the last dim (ops/grouped_matmul.py)
// The Python references are the readable truth; their argument checks run in Python
// first. One pass over each row, fp32 arithmetic (double where the reference keeps
// float64: swiglu), one rounding to the input's dtype, as the references do. The
// reductions accumulate in double: the result differs from the reference's fp32 mean
// by its rounding only (tests/ut compare both with a float64 computation).
// Each op has a Meta kernel: a model compiled with Dynamo traces through them.
#include "emu_layer_ops.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <type_traits>
#include <vector>

namespace ascend_ext_emu {
namespace {

// Offsets (in elements) of the rows of ``x`` viewed as [rows, H]: the trailing dims that
// H covers must be contiguous; the outer dims may have any strides (a strided QKV slice).
std::vector<int64_t> row_offsets(const at::Tensor& x, int64_t trailing) {
  const int64_t outer = x.dim() - trailing;
  int64_t rows = 1;
  for (int64_t d = 0; d < outer; ++d) rows *= x.size(d);
  std::vector<int64_t> off(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, o = 0;
    for (int64_t d = outer - 1; d >= 0; --d) {
      o += (rem % x.size(d)) * x.stride(d);
      rem /= x.size(d);
    }
    off[r] = o;
  }
  return off;
}

bool trailing_contiguous(const at::Tensor& x, int64_t trailing) {
  int64_t expect = 1;
  for (int64_t d = x.dim() - 1; d >= x.dim() - trailing; --d) {
    if (x.size(d) != 1 && x.stride(d) != expect) return false;
    expect *= x.size(d);
  }
  return true;
}

std::vector<int64_t> rstd_shape(const at::Tensor& x, int64_t trailing) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  for (int64_t d = x.dim() - trailing; d < x.dim(); ++d) shape[d] = 1;
  return shape;
}

void check_norm(const at::Tensor& x, const at::Tensor& gamma, const char* op) {
  TORCH_CHECK(gamma.dim() >= 1 && gamma.dim() <= x.dim(), op, ": gamma must cover x's trailing dims");
  for (int64_t d = 1; d <= gamma.dim(); ++d)
    TORCH_CHECK(x.size(-d) == gamma.size(-d), op, ": gamma must match x's trailing dims");
  TORCH_CHECK(trailing_contiguous(x, gamma.dim()), op, ": the normalised dims must be contiguous");
}

// y = x * rsqrt(mean(x^2) + eps) * gamma over each row of H elements; x1 + x2 first
// when ``x2`` is given (its sum kept, rounded, in ``sum_out``).
template <typename T>
void norm_rows(const T* x1, const T* x2, const std::vector<int64_t>& off1,
               const std::vector<int64_t>& off2, const float* gamma, int64_t H, double eps,
               T* y, float* rstd, T* sum_out) {
  const int64_t rows = static_cast<int64_t>(off1.size());
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(H);
    for (int64_t r = r0; r < r1; ++r) {
      const T* a = x1 + off1[r];
      double ss = 0.0;
      if (x2 != nullptr) {
        const T* b = x2 + off2[r];
        for (int64_t i = 0; i < H; ++i) {
          const float v = static_cast<float>(a[i]) + static_cast<float>(b[i]);
          buf[i] = v;
          sum_out[r * H + i] = static_cast<T>(v);
          ss += static_cast<double>(v) * v;
        }
      } else {
        for (int64_t i = 0; i < H; ++i) {
          const float v = static_cast<float>(a[i]);
          buf[i] = v;
          ss += static_cast<double>(v) * v;
        }
      }
      const float mean = static_cast<float>(ss / static_cast<double>(H));
      const float rs = 1.0f / std::sqrt(mean + static_cast<float>(eps));
      rstd[r] = rs;
      T* out = y + r * H;
      for (int64_t i = 0; i < H; ++i) out[i] = static_cast<T>(buf[i] * rs * gamma[i]);
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_emu_kernel(const at::Tensor& x, const at::Tensor& gamma,
                                                       double epsilon) {
  check_norm(x, gamma, "emu_rms_norm");
  const int64_t H = gamma.numel();
  const at::Tensor g = gamma.to(at::kFloat).contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor rstd = at::empty(rstd_shape(x, gamma.dim()), x.options().dtype(at::kFloat));
  const std::vector<int64_t> off = row_offsets(x, gamma.dim());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "emu_rms_norm", [&] {
    norm_rows<scalar_t>(x.const_data_ptr<scalar_t>(), nullptr, off, off, g.const_data_ptr<float>(), H,
                        epsilon, y.data_ptr<scalar_t>(), rstd.data_ptr<float>(), nullptr);
  });
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_emu_kernel(
    const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& gamma, double epsilon) {
  check_norm(x1, gamma, "emu_add_rms_norm");
  check_norm(x2, gamma, "emu_add_rms_norm");
  TORCH_CHECK(x1.sizes() == x2.sizes() && x1.scalar_type() == x2.scalar_type(),
              "emu_add_rms_norm: x1 and x2 must have one shape and dtype");
  const int64_t H = gamma.numel();
  const at::Tensor g = gamma.to(at::kFloat).contiguous();
  auto opts = x1.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor y = at::empty(x1.sizes(), opts), sum = at::empty(x1.sizes(), opts);
  at::Tensor rstd = at::empty(rstd_shape(x1, gamma.dim()), x1.options().dtype(at::kFloat));
  const std::vector<int64_t> off1 = row_offsets(x1, gamma.dim()), off2 = row_offsets(x2, gamma.dim());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x1.scalar_type(), "emu_add_rms_norm", [&] {
    norm_rows<scalar_t>(x1.const_data_ptr<scalar_t>(), x2.const_data_ptr<scalar_t>(), off1, off2,
                        g.const_data_ptr<float>(), H, epsilon, y.data_ptr<scalar_t>(),
                        rstd.data_ptr<float>(), sum.data_ptr<scalar_t>());
  });
  return {y, rstd, sum};
}

namespace {

template <typename T, typename P>
void rope_rows(const P* pos, int64_t tokens, const T* x, int64_t x_st, int64_t heads, int64_t hs,
               const T* cache, int64_t cache_st, int64_t half, bool neox, T* out) {
  at::parallel_for(0, tokens, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* c = cache + static_cast<int64_t>(pos[t]) * cache_st;
      const T* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        const T* in = x + t * x_st + h * hs;
        T* o = out + (t * heads + h) * hs;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = neox ? i : 2 * i, i2 = neox ? i + half : 2 * i + 1;
          const float a = static_cast<float>(in[i1]), b = static_cast<float>(in[i2]);
          const float cf = static_cast<float>(c[i]), sf = static_cast<float>(s[i]);
          o[i1] = static_cast<T>(a * cf - b * sf);
          o[i2] = static_cast<T>(b * cf + a * sf);
        }
        for (int64_t i = 2 * half; i < hs; ++i) o[i] = in[i];
      }
    }
  });
}

at::Tensor rope_one(const at::Tensor& positions, const at::Tensor& x, const at::Tensor& cache,
                    int64_t head_size, bool neox) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % head_size == 0,
              "emu_rope: query/key [T, heads * head_size] with contiguous rows");
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t half = cache.size(1) / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "emu_rope", [&] {
    if (positions.scalar_type() == at::kInt) {
      rope_rows<scalar_t, int32_t>(positions.const_data_ptr<int32_t>(), x.size(0),
                                   x.const_data_ptr<scalar_t>(), x.stride(0), x.size(1) / head_size,
                                   head_size, cache.const_data_ptr<scalar_t>(), cache.stride(0), half,
                                   neox, out.data_ptr<scalar_t>());
    } else {
      rope_rows<scalar_t, int64_t>(positions.const_data_ptr<int64_t>(), x.size(0),
                                   x.const_data_ptr<scalar_t>(), x.stride(0), x.size(1) / head_size,
                                   head_size, cache.const_data_ptr<scalar_t>(), cache.stride(0), half,
                                   neox, out.data_ptr<scalar_t>());
    }
  });
  return out;
}

}  // namespace

namespace {
void check_rope(const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
                const at::Tensor& cache, int64_t head_size) {
  TORCH_CHECK(head_size > 0, "emu_rope: head_size must be positive");
  TORCH_CHECK(positions.dim() == 1 && query.dim() == 2 && key.dim() == 2 && cache.dim() == 2,
              "emu_rope: positions [T], query/key [T, heads * head_size], cos_sin_cache 2-D");
  TORCH_CHECK(query.size(0) == positions.size(0) && key.size(0) == positions.size(0) &&
                  query.size(1) % head_size == 0 && key.size(1) % head_size == 0,
              "emu_rope: one position per token, rows of whole heads");
  TORCH_CHECK(cache.size(1) % 2 == 0 && cache.size(1) <= head_size,
              "emu_rope: rotary_dim even and at most head_size");
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_emu_kernel(const at::Tensor& positions, const at::Tensor& query,
                                                   const at::Tensor& key, const at::Tensor& cos_sin_cache,
                                                   int64_t head_size, bool neox) {
  check_rope(positions, query, key, cos_sin_cache, head_size);
  TORCH_CHECK(positions.dim() == 1 && positions.is_contiguous() &&
                  (positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt),
              "emu_rope: positions 1-D int32/int64, contiguous");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.stride(1) == 1 && cos_sin_cache.size(1) % 2 == 0 &&
                  cos_sin_cache.size(1) <= head_size && cos_sin_cache.scalar_type() == query.scalar_type() &&
                  key.scalar_type() == query.scalar_type(),
              "emu_rope: cos_sin_cache [positions, rotary_dim] in the query's dtype, rotary_dim even");
  TORCH_CHECK(query.size(0) == positions.size(0) && key.size(0) == positions.size(0),
              "emu_rope: one position per token");
  const int64_t limit = cos_sin_cache.size(0);
  AT_DISPATCH_INDEX_TYPES(positions.scalar_type(), "emu_rope_positions", [&] {
    const index_t* p = positions.const_data_ptr<index_t>();
    for (int64_t t = 0; t < positions.size(0); ++t)
      TORCH_CHECK(p[t] >= 0 && p[t] < limit, "emu_rope: positions must lie in [0, ", limit - 1,
                  "], got positions[", t, "] = ", static_cast<int64_t>(p[t]));
  });
  return {rope_one(positions, query, cos_sin_cache, head_size, neox),
          rope_one(positions, key, cos_sin_cache, head_size, neox)};
}

at::Tensor swiglu_emu_kernel(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0 && x.is_contiguous(),
              "emu_swiglu: a contiguous x whose last dim is even");
  const int64_t H = x.size(-1) / 2, rows = H == 0 ? 0 : x.numel() / (2 * H);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = H;
  at::Tensor out = at::empty(shape, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "emu_swiglu", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* a = in + r * 2 * H;
        const scalar_t* b = a + H;
        for (int64_t i = 0; i < H; ++i) {
          const acc_t av = static_cast<acc_t>(a[i]);
          o[r * H + i] = static_cast<scalar_t>(av / (acc_t(1) + std::exp(-av)) * static_cast<acc_t>(b[i]));
        }
      }
    });
  });
  return out;
}

// Shapes and dtypes only (Dynamo's fake tensors trace a compiled model through them): in
// symbolic sizes, so that a trace keeps the token count dynamic.
namespace {
std::vector<c10::SymInt> sym_shape(const at::Tensor& x) {
  return std::vector<c10::SymInt>(x.sym_sizes().begin(), x.sym_sizes().end());
}
// The shape rules of check_norm, on symbolic sizes (the normalised dims are static).
void meta_check_norm(const at::Tensor& x, const at::Tensor& gamma, const char* op) {
  TORCH_CHECK(gamma.dim() >= 1 && gamma.dim() <= x.dim(), op, ": gamma must cover x's trailing dims");
  for (int64_t d = 1; d <= gamma.dim(); ++d)
    TORCH_CHECK(x.sym_size(-d) == gamma.sym_size(-d), op,
                ": gamma must match x's trailing dims");
}
std::vector<c10::SymInt> sym_rstd_shape(const at::Tensor& x, int64_t trailing) {
  std::vector<c10::SymInt> shape = sym_shape(x);
  for (int64_t d = x.dim() - trailing; d < x.dim(); ++d) shape[d] = 1;
  return shape;
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_emu_meta(const at::Tensor& x, const at::Tensor& gamma, double) {
  meta_check_norm(x, gamma, "emu_rms_norm");
  return {at::empty_symint(sym_shape(x), x.options()),
          at::empty_symint(sym_rstd_shape(x, gamma.dim()), x.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_emu_meta(const at::Tensor& x1, const at::Tensor& x2,
                                                                     const at::Tensor& gamma, double) {
  meta_check_norm(x1, gamma, "emu_add_rms_norm");
  meta_check_norm(x2, gamma, "emu_add_rms_norm");
  TORCH_CHECK(x1.dim() == x2.dim() && x1.scalar_type() == x2.scalar_type(),
              "emu_add_rms_norm: x1 and x2 must have one shape and dtype");
  return {at::empty_symint(sym_shape(x1), x1.options()),
          at::empty_symint(sym_rstd_shape(x1, gamma.dim()), x1.options().dtype(at::kFloat)),
          at::empty_symint(sym_shape(x1), x1.options())};
}

std::tuple<at::Tensor, at::Tensor> rope_emu_meta(const at::Tensor& positions, const at::Tensor& query,
                                                 const at::Tensor& key, const at::Tensor& cache, int64_t head_size,
                                                 bool) {
  TORCH_CHECK(head_size > 0 && positions.dim() == 1 && query.dim() == 2 && key.dim() == 2 && cache.dim() == 2,
              "emu_rope: positions [T], query/key [T, heads * head_size], cos_sin_cache 2-D, head_size > 0");
  return {at::empty_symint(sym_shape(query), query.options()), at::empty_symint(sym_shape(key), key.options())};
}

at::Tensor swiglu_emu_meta(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "emu_swiglu: x must have a last dim");
  std::vector<c10::SymInt> shape = sym_shape(x);
  shape.back() = shape.back() / 2;
  return at::empty_symint(shape, x.options());
}

}  // namespace ascend_ext_emu
