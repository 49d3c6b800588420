"""Independent float64 forward of a Qwen3-Next checkpoint, straight from its safetensors.

Plain math sharing no code with the plugin, vLLM or transformers, and float64
throughout (transformers' "float64" model still computes its Gated-DeltaNet core, its
RMSNorms, RoPE frequencies, attention softmax and router softmax in float32):

- RMSNorm ``x / sqrt(mean(x^2) + eps) * (1 + w)`` (the gated GDN norm: ``* w *
  silu(z)``);
- Gated-DeltaNet: the interleaved ``in_proj_qkvz`` / ``in_proj_ba`` rows (per key head
  ``[q, k, v, z]``, ``[b, a]``), causal depthwise conv + SiLU, ``beta = sigmoid(b)``,
  ``g = -exp(A_log) * softplus(a + dt_bias)``, L2-normalised q/k (eps 1e-6 under the
  root), q scaled by ``Dk^-1/2``, and the recurrence token by token (an explicit loop):
  ``S = e^g S; S += beta (v - S k) k^T; o = S q``;
- gated attention: ``q_proj`` rows per head ``[query, gate]``, q/k RMSNorm, NeoX RoPE on
  the first ``head_dim * partial_rotary_factor`` dims, causal GQA softmax attention,
  output times ``sigmoid(gate)``;
- MoE: softmax router, top-k (renormalised with ``norm_topk_prob``), SwiGLU experts, a
  shared SwiGLU expert times ``sigmoid(shared_expert_gate)``; dense SwiGLU layers where
  the config says so.

``forward(ids)`` returns float64 logits ``[L, V]`` and, per layer, the token mixer's
output, the MLP's output and the residual stream after the layer (for layer-by-layer
comparisons), and the router logits of the MoE layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class DenseQwen3Next:
    def __init__(self, model_dir: str) -> None:
        d = Path(model_dir)
        self.c = json.loads((d / "config.json").read_text())
        self.w = {k: v.double() for k, v in load_file(str(d / "model.safetensors")).items()}

    # ------------------------------------------------------------------ pieces
    def _rms(self, x, w, plus_one=True):
        eps = self.c["rms_norm_eps"]
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return y * ((1.0 + w) if plus_one else w)

    @staticmethod
    def _swiglu(x, gate, up, down):
        return (F.silu(x @ gate.t()) * (x @ up.t())) @ down.t()

    def _rope(self, x, pos):
        """NeoX rotation of the first rotary_dim dims of x [L, H, D]."""
        c = self.c
        rd = int(x.shape[-1] * c.get("partial_rotary_factor", 1.0))
        inv = 1.0 / c["rope_theta"] ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
        ang = pos[:, None].double() * inv[None]                  # [L, rd/2]
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        x1, x2, rest = x[..., : rd // 2], x[..., rd // 2: rd], x[..., rd:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)

    def _gdn(self, p, x):
        c, w = self.c, self.w
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, kern = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        r, n = nv // nk, x.shape[0]
        qkvz = (x @ w[p + "in_proj_qkvz.weight"].t()).view(n, nk, 2 * dk + 2 * r * dv)
        ba = (x @ w[p + "in_proj_ba.weight"].t()).view(n, nk, 2 * r)
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], -1)
        b, a = ba.split([r, r], -1)
        mixed = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], -1)
        cw = w[p + "conv1d.weight"][:, 0]                         # [conv_dim, K]
        padded = torch.cat([mixed.new_zeros(kern - 1, mixed.shape[1]), mixed])
        conv = torch.stack([(padded[t:t + kern] * cw.t()).sum(0) for t in range(n)])
        if p + "conv1d.bias" in w:
            conv = conv + w[p + "conv1d.bias"]
        conv = F.silu(conv)
        q, k, v = conv.split([nk * dk, nk * dk, nv * dv], -1)
        q = q.view(n, nk, dk).repeat_interleave(r, 1)
        k = k.view(n, nk, dk).repeat_interleave(r, 1)
        v = v.view(n, nv, dv)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(b.reshape(n, nv))
        g = -torch.exp(w[p + "A_log"]) * F.softplus(a.reshape(n, nv) + w[p + "dt_bias"])
        state = torch.zeros(nv, dv, dk, dtype=torch.float64)
        out = torch.empty(n, nv, dv, dtype=torch.float64)
        for t in range(n):                                        # the recurrence itself
            state = state * torch.exp(g[t])[:, None, None]
            err = v[t] - torch.einsum("hvk,hk->hv", state, k[t])
            state = state + beta[t][:, None, None] * err[:, :, None] * k[t][:, None, :]
            out[t] = torch.einsum("hvk,hk->hv", state, q[t])
        normed = self._rms(out, w[p + "norm.weight"], plus_one=False) * F.silu(z.reshape(n, nv, dv))
        return normed.reshape(n, nv * dv) @ w[p + "out_proj.weight"].t()

    def _attention(self, p, x, pos):
        c, w = self.c, self.w
        nq, nkv, hd, n = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], x.shape[0]
        qg = (x @ w[p + "q_proj.weight"].t()).view(n, nq, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        k = (x @ w[p + "k_proj.weight"].t()).view(n, nkv, hd)
        v = (x @ w[p + "v_proj.weight"].t()).view(n, nkv, hd)
        q = self._rope(self._rms(q, w[p + "q_norm.weight"]), pos)
        k = self._rope(self._rms(k, w[p + "k_norm.weight"]), pos)
        rep = nq // nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        attn = torch.einsum("hqk,khd->qhd", probs, v) * torch.sigmoid(gate)
        return attn.reshape(n, nq * hd) @ w[p + "o_proj.weight"].t()

    def _moe(self, p, x):
        c, w = self.c, self.w
        logits = x @ w[p + "gate.weight"].t()
        top, ids = torch.softmax(logits, -1).topk(c["num_experts_per_tok"], -1)
        if c.get("norm_topk_prob", True):
            top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(c["num_experts"]):
            rows, slot = (ids == e).nonzero(as_tuple=True)
            if rows.numel():
                q = p + f"experts.{e}."
                y = self._swiglu(x[rows], w[q + "gate_proj.weight"], w[q + "up_proj.weight"],
                                 w[q + "down_proj.weight"])
                out.index_add_(0, rows, y * top[rows, slot][:, None])
        q = p + "shared_expert."
        shared = self._swiglu(x, w[q + "gate_proj.weight"], w[q + "up_proj.weight"],
                              w[q + "down_proj.weight"])
        return out + shared * torch.sigmoid(x @ w[p + "shared_expert_gate.weight"].t()), logits

    def _is_moe(self, i: int) -> bool:
        c = self.c
        return (i not in c.get("mlp_only_layers", []) and c.get("num_experts", 0) > 0
                and (i + 1) % c.get("decoder_sparse_step", 1) == 0)

    # ------------------------------------------------------------------ forward
    def forward(self, ids: list[int]) -> dict:
        c, w = self.c, self.w
        pos = torch.arange(len(ids))
        h = w["model.embed_tokens.weight"][torch.tensor(ids)]
        parts, routers = {}, {}
        for i, kind in enumerate(c["layer_types"]):
            p = f"model.layers.{i}."
            x = self._rms(h, w[p + "input_layernorm.weight"])
            mix = (self._gdn(p + "linear_attn.", x) if kind == "linear_attention"
                   else self._attention(p + "self_attn.", x, pos))
            h = h + mix
            x = self._rms(h, w[p + "post_attention_layernorm.weight"])
            if self._is_moe(i):
                mlp, routers[i] = self._moe(p + "mlp.", x)
            else:
                mlp = self._swiglu(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                                   w[p + "mlp.down_proj.weight"])
            h = h + mlp
            parts[f"L{i}.mixer"], parts[f"L{i}.mlp"], parts[f"L{i}.stream"] = mix, mlp, h
        h = self._rms(h, w["model.norm.weight"])
        lm = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
        return {"logits": h @ lm.t(), "parts": parts, "routers": routers}
