"""Hybrid prefix caching (vLLM's "align" mode) on the plugin's Gated-DeltaNet layers,
emulated on the NPU engine path: the embedded tiny Qwen3-Next serves two waves of requests
sharing prefixes of several blocks (``run_gdn_prefix.py``), with prefix caching on and off.

- fp32: on == off (tokens identical, logprobs within 1e-4); wave 2 hits wave 1's blocks
  (vLLM's cached-token counts) and the state copies ran on the NPU runner's substitute;
- fp32 with ngram speculation (3 drafts), the mixed split on and caching on == caching
  off without them; the speculative copies (``AlignSpecCopies``) moved rows before and
  after steps, the full-attention layer split every mixed step;
- bf16 (every expert taken, so no routing near-ties): tokens identical, logprobs within
  bf16's chunking noise, contract mode 0 violations;
- negative control: resuming from the neighbouring block's checkpoint changes the tokens.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import run_script
from tests.e2e.hybrid_judge import BF16_STATE_TOL

pytestmark = pytest.mark.e2e
FP32_TOL = 1e-4            # measured: 1.8e-5 (the chunks differ: align mode cuts at blocks)
# bf16: align mode cuts the prompts into other chunks than caching off, and the tiny
# model's sharp logits turn bf16 rounding into logprob gaps of ~0.1 without any cache hit
# (measured: wave 1, no hits, 0.145; wave 2, resumed from checkpoints, 0.101)
# bf16 recurrent states, as on an NPU (vLLM's CPU platform reset them to fp32 before the
# emulated platform became the NPU platform): caching on and off round the states at
# different places (hybrid_judge.BF16_STATE_TOL).
BF16_TOL = BF16_STATE_TOL
ALL_EXPERTS = json.dumps({"num_experts_per_tok": 4})


def _run(*args: str, **env: str) -> dict:
    return run_script("run_gdn_prefix.py", *args, emulate=True, timeout=900, **env)


@pytest.fixture(scope="module")
def off():
    return _run("--caching", "off")


@pytest.fixture(scope="module")
def on():
    return _run("--caching", "on")


def _gap(a: dict, b: dict) -> float:
    return max(abs(x - y) for wa, wb in zip(a["waves"], b["waves"])
               for ra, rb in zip(wa["logprobs"], wb["logprobs"]) for x, y in zip(ra, rb))


def _tokens(r: dict) -> list:
    return [w["tokens"] for w in r["waves"]]


def _bf16_departures(a: dict, b: dict, tol: float) -> list[str]:
    """bf16 runs whose roundings differ (cached states vs recomputed ones): each request's
    first token agrees, logprobs agree within ``tol`` up to the first differing token (a
    near tie may flip a later greedy token; the continuations then condition on different
    tokens), as the nightly suite's bf16 equality gate (``nightly/gates.equality``)."""
    out = []
    for w, (wa, wb) in enumerate(zip(a["waves"], b["waves"])):
        for r, (ta, tb) in enumerate(zip(wa["tokens"], wb["tokens"])):
            at = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
            if at == 0 or len(ta) != len(tb):
                out.append(f"wave {w} request {r}: differs from token {at}")
            gaps = [abs(x - y) for x, y in zip(wa["logprobs"][r][:at], wb["logprobs"][r][:at])]
            if gaps and max(gaps) > tol:
                out.append(f"wave {w} request {r}: logprob gap {max(gaps):.3f} before token {at}")
    return out


def _hits(r: dict, block: int) -> None:
    """Wave 1 hits nothing; every wave-2 request resumes from whole blocks: A's questions
    from the system prompt's last full block, B's first next turn from its first prompt's
    last full block (vLLM keeps no checkpoint of a block a request completed while
    decoding), the second from the first's prompt."""
    one, two = r["waves"]
    assert one["cached"] == [0, 0]
    assert two["cached"] == [4 * block, 4 * block, 3 * block, 4 * block], two["cached"]


def test_caching_on_equals_off_and_hits_the_second_wave(on, off):
    assert (on["prefix_caching"], on["mamba_cache_mode"]) == (True, "align")
    assert (off["prefix_caching"], off["mamba_cache_mode"]) == (False, "none")
    assert off["waves"][1]["cached"] == [0, 0, 0, 0]
    _hits(on, on["block_size"])
    copies = on["copies"]
    assert copies["substitute"] == "vllm_ascend_ext.worker.mamba_state_copy.batch_memcpy"
    assert copies["batch_memcpy"] > 0 and off["copies"]["batch_memcpy"] == 0
    assert _tokens(on) == _tokens(off)
    assert _gap(on, off) < FP32_TOL


def test_ngram_speculation_with_caching_equals_plain_without(off):
    spec = _run("--caching", "on", "--spec", "--mixed-split", "on")
    _hits(spec, spec["block_size"])
    assert spec["split"] and all(split == mixed > 0 for mixed, split in spec["split"]), \
        spec["split"]
    copies = spec["copies"]
    assert copies["spec_context"] == "AlignSpecCopies"
    assert copies["precopy_rows"] > 0 and copies["postcopy_rows"] > 0, copies
    assert _tokens(spec) == _tokens(off)
    assert _gap(spec, off) < FP32_TOL


def test_bfloat16_on_equals_off_with_contract_mode():
    on16 = _run("--caching", "on", "--dtype", "bfloat16", "--variant", ALL_EXPERTS,
                ASCEND_EXT_NPU_CONTRACT="1")
    off16 = _run("--caching", "off", "--dtype", "bfloat16", "--variant", ALL_EXPERTS)
    _hits(on16, on16["block_size"])
    assert on16["contract"]["violations"] == 0, on16["contract"]["summary"]
    assert "npu_fused_infer_attention_score" in on16["contract"]["summary"]
    # bf16: equal up to near ties (the fp32 tests above compare exactly)
    assert _bf16_departures(on16, off16, BF16_TOL) == []


def test_negative_control_resuming_from_the_neighbouring_block_changes_the_tokens(on):
    bad = _run("--caching", "on", "--corrupt", "neighbour-block")
    _hits(bad, bad["block_size"])
    assert _tokens(bad) != _tokens(on)
    assert bad["waves"][1]["tokens"] != on["waves"][1]["tokens"]
