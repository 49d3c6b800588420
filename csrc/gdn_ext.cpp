// Kernels of npu_causal_conv1d_ext and npu_recurrent_gated_delta_rule_ext (see gdn_ext.h).
// Preconditions the plugin's builder guarantees and the Python references check: every
// request row has >= 1 token and its own state slot (rows never share a slot), and
// 1 <= num_accepted_tokens <= its row's length for the recurrence. The kernels cannot
// check them without reading tensor data on the host: they clamp indices instead, so a
// broken precondition reads or writes a neighbouring slot rather than faulting.
#include "gdn_ext.h"

#include <c10/util/Exception.h>

namespace ascend_ext_gdn {
namespace {

using at::indexing::Slice;

at::ScalarType work_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void check_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_states,
                const at::Tensor& qsl, const at::Tensor& cache_indices,
                const at::Tensor& has_init, const std::optional<at::Tensor>& accepted) {
  constexpr const char* op = "npu_causal_conv1d_ext";
  TORCH_CHECK(x.dim() == 2, op, ": x must be [T, dim], got ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), op,
              ": weight must be [K, dim=", x.size(1), "], got ", weight.sizes());
  TORCH_CHECK(conv_states.dim() == 3 && conv_states.size(2) == x.size(1) &&
                  conv_states.size(1) >= weight.size(0) - 1,
              op, ": conv_states must be [N, state_len >= K-1, dim], got ", conv_states.sizes());
  int64_t b = cache_indices.size(0);
  TORCH_CHECK(qsl.dim() == 1 && qsl.size(0) == b + 1, op,
              ": query_start_loc must be [B+1] for B=", b, " cache indices");
  TORCH_CHECK(has_init.dim() == 1 && has_init.size(0) == b, op, ": has_initial_state must be [B]");
  TORCH_CHECK(!accepted || (accepted->dim() == 1 && accepted->size(0) == b), op,
              ": num_accepted_tokens must be [B]");
}

}  // namespace

at::Tensor causal_conv1d_ext_meta(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_states,
    const at::Tensor& query_start_loc, const at::Tensor& cache_indices,
    const at::Tensor& has_initial_state, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& num_accepted_tokens, bool silu, int64_t pad_slot_id) {
  check_conv(x, weight, conv_states, query_start_loc, cache_indices, has_initial_state,
             num_accepted_tokens);
  return at::empty_like(x);
}

at::Tensor causal_conv1d_ext_kernel(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_states_in,
    const at::Tensor& query_start_loc, const at::Tensor& cache_indices,
    const at::Tensor& has_initial_state, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& num_accepted_tokens, bool silu, int64_t pad_slot_id) {
  check_conv(x, weight, conv_states_in, query_start_loc, cache_indices, has_initial_state,
             num_accepted_tokens);
  at::Tensor conv_states = conv_states_in;  // a view of the caller's cache: written in place
  const int64_t t = x.size(0), k = weight.size(0), b = cache_indices.size(0);
  const int64_t sl = conv_states.size(1);
  const auto w = work_type(x);
  const auto lo = x.options().dtype(at::kLong);
  if (t == 0 || b == 0) return at::empty_like(x);

  at::Tensor qsl = query_start_loc.to(at::kLong);
  at::Tensor starts = qsl.index({Slice(0, b)});
  at::Tensor lens = qsl.index({Slice(1, b + 1)}) - starts;
  at::Tensor slot = cache_indices.to(at::kLong);
  at::Tensor real = slot.ne(pad_slot_id);
  at::Tensor slot_c = slot.clamp_min(0);
  at::Tensor live = real.logical_and(has_initial_state.to(at::kBool));
  at::Tensor off = num_accepted_tokens ? num_accepted_tokens->to(at::kLong) - 1
                                       : at::zeros({b}, lo);
  at::Tensor xw = x.to(w);
  at::Tensor ww = weight.to(w);

  // Per token: its request and position (no host read of query_start_loc).
  at::Tensor tok = at::arange(t, lo);
  at::Tensor req = at::searchsorted(qsl.index({Slice(1, b + 1)}), tok, false, true)
                       .clamp_max(b - 1);
  at::Tensor pos = tok - starts.index_select(0, req);
  at::Tensor slot_t = slot_c.index_select(0, req);
  at::Tensor live_t = live.index_select(0, req).unsqueeze(1);
  at::Tensor off_t = off.index_select(0, req);

  // seq = history (K-1 rows from offset `off`) ++ the request's tokens; tap j of token
  // at position p reads seq[p + j].
  at::Tensor acc = at::zeros({t, x.size(1)}, x.options().dtype(w));
  for (int64_t j = 0; j < k; ++j) {
    at::Tensor r = pos + j;
    at::Tensor from_x = r.ge(k - 1).unsqueeze(1);
    at::Tensor xi = (tok + (j - (k - 1))).clamp(0, t - 1);
    at::Tensor hrow = (off_t + r).clamp(0, sl - 1);
    at::Tensor hist = conv_states.index({slot_t, hrow}).to(w);
    at::Tensor val = at::where(from_x, xw.index_select(0, xi),
                               at::where(live_t, hist, at::zeros_like(hist)));
    acc.add_(val * ww.index({j}));
  }
  if (bias) acc.add_(bias->to(w));
  if (silu) acc = at::silu(acc);
  at::Tensor y = acc.to(x.scalar_type());

  // State: rows [0, n) of the request's slot become seq[shift + r]; shift is 1 with
  // num_accepted_tokens (the window of accepted token a sits at offset a - 1 next step),
  // L otherwise (the last K-1 inputs). Rows past n keep their value.
  at::Tensor rr = at::arange(sl, lo).unsqueeze(0);                      // [1, SL]
  at::Tensor shift = num_accepted_tokens ? at::ones({b}, lo) : lens;
  at::Tensor src = shift.unsqueeze(1) + rr;                             // [B, SL]
  at::Tensor n = at::clamp_max(lens + (k - 1) - shift, sl).unsqueeze(1);
  at::Tensor write = rr.lt(n).logical_and(lens.gt(0).unsqueeze(1)).logical_and(real.unsqueeze(1));
  at::Tensor xi = (starts.unsqueeze(1) + src - (k - 1)).clamp(0, t - 1);
  at::Tensor hrow = (off.unsqueeze(1) + src).clamp(0, sl - 1);
  at::Tensor slot_b = slot_c.unsqueeze(1).expand({b, sl});
  at::Tensor hist = conv_states.index({slot_b, hrow});
  hist = at::where(live.unsqueeze(1).unsqueeze(2), hist, at::zeros_like(hist));
  at::Tensor val = at::where(src.ge(k - 1).unsqueeze(2),
                             x.index_select(0, xi.reshape({-1})).reshape({b, sl, -1})
                                 .to(conv_states.scalar_type()),
                             hist);
  at::Tensor rows = rr.expand({b, sl});
  at::Tensor old = conv_states.index({slot_b, rows});
  at::Tensor fresh = at::where(write.unsqueeze(2), val, old);
  // Padding rows must write nothing, yet a masked scatter would need a host read. So
  // each padding row repeats the first real row's write (same place, same values):
  // duplicate writes then agree, whatever order the device applies them in.
  at::Tensor first_real = real.to(at::kInt).argmax();
  at::Tensor src_row = at::where(real, at::arange(b, lo), first_real);
  conv_states.index_put_({slot_b.index_select(0, src_row), rows},
                         fresh.index_select(0, src_row));
  return y;
}

at::Tensor recurrent_gdr_ext_meta(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& state, const at::Tensor& beta, double scale,
    const at::Tensor& actual_seq_lengths, const at::Tensor& ssm_state_indices,
    const std::optional<at::Tensor>& num_accepted_tokens, const std::optional<at::Tensor>& g,
    const std::optional<at::Tensor>& has_initial_state, int64_t max_seq_len) {
  constexpr const char* op = "npu_recurrent_gated_delta_rule_ext";
  TORCH_CHECK(query.dim() == 3 && key.sizes() == query.sizes(), op, ": query/key must be [T, Nk, Dk]");
  TORCH_CHECK(value.dim() == 3 && value.size(0) == query.size(0) &&
                  value.size(1) % query.size(1) == 0, op, ": value must be [T, Nv, Dv], Nv % Nk == 0");
  TORCH_CHECK(state.dim() == 4 && state.size(1) == value.size(1) && state.size(2) == value.size(2) &&
                  state.size(3) == query.size(2), op, ": state must be [N, Nv, Dv, Dk]");
  TORCH_CHECK(ssm_state_indices.dim() == 1 && ssm_state_indices.size(0) == query.size(0), op,
              ": ssm_state_indices must be [T]");
  TORCH_CHECK(max_seq_len >= 1, op, ": max_seq_len must be >= 1");
  return at::empty_like(value);
}

at::Tensor recurrent_gdr_ext_kernel(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& state_in, const at::Tensor& beta, double scale,
    const at::Tensor& actual_seq_lengths, const at::Tensor& ssm_state_indices,
    const std::optional<at::Tensor>& num_accepted_tokens, const std::optional<at::Tensor>& g,
    const std::optional<at::Tensor>& has_initial_state, int64_t max_seq_len) {
  recurrent_gdr_ext_meta(query, key, value, state_in, beta, scale, actual_seq_lengths,
                         ssm_state_indices, num_accepted_tokens, g, has_initial_state,
                         max_seq_len);
  at::Tensor state = state_in;
  const int64_t t = query.size(0), b = actual_seq_lengths.size(0);
  const int64_t nv = value.size(1), dv = value.size(2);
  const int64_t rep = nv / query.size(1);
  const auto w = work_type(query);
  const auto lo = query.options().dtype(at::kLong);
  if (t == 0 || b == 0) return at::zeros_like(value);

  at::Tensor q = query.to(w).repeat_interleave(rep, 1) * scale;
  at::Tensor kk = key.to(w).repeat_interleave(rep, 1);
  at::Tensor v = value.to(w), bt = beta.to(w);
  at::Tensor decay = g ? at::exp(g->to(w)) : at::ones_like(bt);
  at::Tensor lens = actual_seq_lengths.to(at::kLong);
  at::Tensor starts = at::cumsum(lens, 0) - lens;
  at::Tensor idx = ssm_state_indices.to(at::kLong);
  at::Tensor na = num_accepted_tokens ? num_accepted_tokens->to(at::kLong) : at::ones({b}, lo);
  at::Tensor first = (starts + na - 1).clamp(0, t - 1);
  at::Tensor s = state.index_select(0, idx.index_select(0, first)).to(w);  // [B, Nv, Dv, Dk]
  if (has_initial_state) {
    s = at::where(has_initial_state->to(at::kBool).view({b, 1, 1, 1}), s, at::zeros_like(s));
  }
  at::Tensor outbuf = at::zeros({max_seq_len, b, nv, dv}, value.options().dtype(w));
  at::Tensor last = (starts + lens - 1).clamp(0, t - 1);
  for (int64_t p = 0; p < max_seq_len; ++p) {
    at::Tensor active = lens.gt(p);
    at::Tensor tp = at::where(active, starts + p, last);
    at::Tensor cur = s * decay.index_select(0, tp).view({b, nv, 1, 1});
    at::Tensor kt = kk.index_select(0, tp);                               // [B, Nv, Dk]
    at::Tensor kv = at::matmul(cur, kt.unsqueeze(-1)).squeeze(-1);        // [B, Nv, Dv]
    at::Tensor delta = (v.index_select(0, tp) - kv) * bt.index_select(0, tp).unsqueeze(-1);
    cur = cur + delta.unsqueeze(-1) * kt.unsqueeze(2);
    at::Tensor o = at::matmul(cur, q.index_select(0, tp).unsqueeze(-1)).squeeze(-1);
    s = at::where(active.view({b, 1, 1, 1}), cur, s);
    outbuf.select(0, p).copy_(o);
    // Active rows store the state after token p; finished rows store their final state
    // again in their own last slot (rows never share slots, so no write collides).
    state.index_put_({idx.index_select(0, tp)}, s.to(state.scalar_type()));
  }
  at::Tensor tok = at::arange(t, lo);
  at::Tensor req = at::searchsorted(at::cumsum(lens, 0), tok, false, true).clamp_max(b - 1);
  at::Tensor pos = (tok - starts.index_select(0, req)).clamp(0, max_seq_len - 1);
  return outbuf.index({pos, req}).to(value.scalar_type());
}

}  // namespace ascend_ext_gdn
