"""Independent float64 forward of the tiny DSA model, straight from its safetensors.

Plain math, sharing no code with the plugin: non-absorbed MLA (per-head k_nope / v
from kv_b_proj), GPT-J (interleaved) RoPE on the MLA rope parts, NeoX RoPE on the
indexer's first 64 dims, an explicit indexer score with causal top-k, attention
restricted to the selected keys, DeepSeek-V3 MoE routing (sigmoid scores, bias for
selection only, renormalized weights) and a shared expert. Recomputes the whole
sequence for every position (no cache): what the engine must match.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


class DenseDSA:
    def __init__(self, model_dir: str, index_topk: int | None = None) -> None:
        d = Path(model_dir)
        self.c = json.loads((d / "config.json").read_text())
        if index_topk is not None:
            self.c["index_topk"] = index_topk
        self.w = {k: v.double() for k, v in load_file(str(d / "model.safetensors")).items()}

    def _rms(self, x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * g

    def _freqs(self, pos, dim):
        inv = self.c["rope_theta"] ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        return pos[:, None].double() * inv[None]                       # [L, dim/2]

    def _rope_gptj(self, x, pos):                                       # x [L, ..., dim]
        f = self._freqs(pos, x.shape[-1])
        while f.dim() < x.dim():
            f = f.unsqueeze(1)
        e, o = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = e * f.cos() - o * f.sin()
        out[..., 1::2] = o * f.cos() + e * f.sin()
        return out

    def _rope_neox_first(self, x, pos, dim):
        f = self._freqs(pos, dim)
        while f.dim() < x.dim():
            f = f.unsqueeze(1)
        h = dim // 2
        a, b = x[..., :h], x[..., h:dim]
        return torch.cat((a * f.cos() - b * f.sin(), b * f.cos() + a * f.sin(), x[..., dim:]), -1)

    def _mlp(self, p, x):
        g, u, dn = (self.w[p + n + ".weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        a = x @ g.T
        return ((a / (1 + torch.exp(-a))) * (x @ u.T)) @ dn.T

    def _moe(self, p, x):
        c = self.c
        scores = torch.sigmoid(x @ self.w[p + "gate.weight"].T)           # [L, E]
        choice = (scores + self.w[p + "gate.e_score_correction_bias"]).topk(
            c["num_experts_per_tok"], dim=-1).indices
        out = self._mlp(p + "shared_experts.", x)
        for t in range(x.shape[0]):
            wts = scores[t, choice[t]]
            wts = wts / wts.sum() * c["routed_scaling_factor"]
            for k, e in enumerate(choice[t].tolist()):
                out[t] += wts[k] * self._mlp(p + f"experts.{e}.", x[t:t + 1])[0]
        return out

    def _attention(self, p, x, pos):
        c, w = self.c, self.w
        n, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                         c["v_head_dim"])
        L = x.shape[0]
        cq = self._rms(x @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"])
        q = (cq @ w[p + "q_b_proj.weight"].T).view(L, n, dn + dr)
        q_nope, q_pe = q[..., :dn], self._rope_gptj(q[..., dn:], pos)
        kv = x @ w[p + "kv_a_proj_with_mqa.weight"].T
        ckv = self._rms(kv[:, : c["kv_lora_rank"]], w[p + "kv_a_layernorm.weight"])
        k_pe = self._rope_gptj(kv[:, c["kv_lora_rank"]:], pos)            # [L, dr]
        kvb = (ckv @ w[p + "kv_b_proj.weight"].T).view(L, n, dn + dv)
        k_nope, v = kvb[..., :dn], kvb[..., dn:]
        # indexer
        ni, di = c["index_n_heads"], c["index_head_dim"]
        qi = self._rope_neox_first((cq @ w[p + "indexer.wq_b.weight"].T).view(L, ni, di), pos, dr)
        ki = torch.nn.functional.layer_norm(x @ w[p + "indexer.wk.weight"].T, (di,),
                                            w[p + "indexer.k_norm.weight"],
                                            w[p + "indexer.k_norm.bias"], 1e-6)
        ki = self._rope_neox_first(ki, pos, dr)
        wts = (x @ w[p + "indexer.weights_proj.weight"].T) * ni ** -0.5 * di ** -0.5
        score = (torch.relu(torch.einsum("thd,sd->ths", qi, ki)) * wts[..., None]).sum(1)
        scale = (dn + dr) ** -0.5
        out = torch.zeros(L, n, dv, dtype=torch.float64)
        for t in range(L):
            sel = score[t, : t + 1].topk(min(c["index_topk"], t + 1)).indices
            lg = (torch.einsum("hd,shd->hs", q_nope[t], k_nope[sel])
                  + torch.einsum("hd,sd->hs", q_pe[t], k_pe[sel])) * scale
            pr = torch.softmax(lg, -1)
            out[t] = torch.einsum("hs,shd->hd", pr, v[sel])
        return out.reshape(L, n * dv) @ w[p + "o_proj.weight"].T

    def logits(self, ids: list[int]) -> torch.Tensor:
        c, w = self.c, self.w
        pos = torch.arange(len(ids))
        h = w["model.embed_tokens.weight"][ids]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = h + self._attention(p + "self_attn.", self._rms(h, w[p + "input_layernorm.weight"]), pos)
            x = self._rms(h, w[p + "post_attention_layernorm.weight"])
            h = h + (self._mlp(p + "mlp.", x) if i < c["first_k_dense_replace"]
                     else self._moe(p + "mlp.", x))
        return self._rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T

    def check(self, prompt_ids: list[int], tokens: list[int]) -> list[tuple[int, float]]:
        """Teacher-forced on the engine's tokens: (dense argmax, dense logprob of token)."""
        seq = list(prompt_ids)
        out = []
        for tok in tokens:
            lp = torch.log_softmax(self.logits(seq)[-1], -1)
            out.append((int(lp.argmax()), float(lp[tok])))
            seq.append(tok)
        return out


def selected_fraction(model: DenseDSA, length: int) -> float:
    """Fraction of visible keys the indexer keeps for the last token of a prompt."""
    return min(model.c["index_topk"], length) / length

