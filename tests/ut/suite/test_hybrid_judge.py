"""The hybrid comparison's pure rules (``tests/e2e/hybrid_judge.py``), on hand-made results:
tokens and logprobs against references, routing ties by router-logit gap, the fp32 and
bf16 verdicts, and the layer-by-layer first departure. Plus the float64 dense model
against transformers float64 on the embedded checkpoint, and the GDN layer's refusal of
a repacked conv weight."""

from __future__ import annotations

import math

import pytest
import torch

from tests.e2e import hybrid_judge as hj


def _lp(rows: list[list[float]]) -> torch.Tensor:
    return torch.log_softmax(torch.tensor(rows, dtype=torch.float64), -1)


def test_compare_tokens_first_difference_gaps_margins_and_noise():
    exact = _lp([[3.0, 1.0, 0.0], [0.0, 2.0, 1.9], [1.0, 0.0, 4.0]])
    ref = exact.clone()
    ref[1] = _lp([[0.0, 1.8, 2.0]])[0]            # the reference prefers token 2 at step 1
    tokens, lps = [0, 1, 2], [float(exact[0, 0]), float(exact[1, 1]) + 3e-4, float(exact[2, 2])]
    r = hj.compare_tokens(tokens, lps, ref, exact)
    assert r["first_diff"] == 1 and r["ref_tokens"] == [0, 2, 2]
    assert r["margin_at_diff"] == pytest.approx(0.2)
    assert r["lp_gaps"][0] == 0 and r["lp_gaps"][1] == pytest.approx(
        abs(float(ref[1, 1]) - lps[1]))
    # noise: the reference's own error at step 1 over tokens {2, 1} (its and exact's top-2)
    assert r["noise"][1] == pytest.approx(float((ref[1] - exact[1]).abs()[1:].max()))
    assert r["noise"][0] == 0 == r["noise"][2]


def test_routing_gaps_are_router_logit_gaps_between_kth_and_next():
    logits = {0: torch.tensor([[5.0, 4.9, 1.0, 0.0], [0.0, 3.0, 2.0, 2.5]], dtype=torch.float64)}
    gaps = hj.routing_gaps(logits, top_k=2)
    assert gaps.shape == (1, 2)
    assert gaps[0, 0] == pytest.approx(4.9 - 1.0) and gaps[0, 1] == pytest.approx(2.5 - 2.0)
    assert hj.tie_positions(gaps, 0.6) == [1] and hj.tie_positions(gaps, 0.1) == []
    # one expert of one: no k+1-th, no gap
    assert hj.routing_gaps({0: torch.zeros(3, 2)}, top_k=2).numel() == 0


def _entry(n_prompt, tokens, ref_tokens, gaps, ties=(), noise=1e-5, margins=None, refs=None):
    r = {"first_diff": next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b),
                            None),
         "lp_gaps": list(gaps), "ref_tokens": list(ref_tokens),
         "margins": margins or [1.0] * len(tokens), "noise": [noise] * len(tokens)}
    r["margin_at_diff"] = None if r["first_diff"] is None else r["margins"][r["first_diff"]]
    e = {"len": n_prompt, "tokens": list(tokens), "routing_ties": {"positions": list(ties)}}
    for name in refs or ("dense_float64", "hf_float32"):
        e[name] = dict(r)
    return e


def test_fp32_rules_fail_on_a_token_or_logprob_departure_and_excuse_after_a_tie():
    ok = _entry(10, [1, 2, 3], [1, 2, 3], [1e-6] * 3)
    assert hj.fp32_failures({"prompts": [ok]}) == []
    flip = _entry(10, [1, 2, 3], [1, 5, 3], [1e-6] * 3)
    assert any("generated token 1 differs" in f for f in hj.fp32_failures({"prompts": [flip]}))
    gap = _entry(10, [1, 2, 3], [1, 2, 3], [1e-6, 3e-4, 1e-6])
    assert any("logprob gap" in f for f in hj.fp32_failures({"prompts": [gap]}))
    # a tie at position 10 (predicts generated token 1) excuses tokens 1.. but not 0
    tied = _entry(10, [1, 2, 3], [1, 5, 3], [1e-6, 0.3, 1e-6], ties=[10])
    assert hj.fp32_failures({"prompts": [tied]}) == []
    assert hj.first_excused(10, [10]) == 1 and hj.first_excused(10, [3]) == 0
    assert hj.excused_fraction({"prompts": [tied]}) == pytest.approx(2 / 3)
    early = _entry(10, [9, 2, 3], [1, 2, 3], [1e-6] * 3, ties=[10])
    assert hj.fp32_failures({"prompts": [early]})
    # deeper models: the tolerance follows transformers-fp32's own error (twice it) ...
    noisy = _entry(10, [1, 2, 3], [1, 2, 3], [1e-6, 3e-4, 1e-6], noise=2e-4)
    assert hj.fp32_failures({"prompts": [noisy]}) == []
    # ... counted only where the rules apply: not widened by its error after a tie
    late = _entry(10, [1, 2, 3], [1, 2, 3], [3e-4, 1e-6, 1e-6], ties=[11], noise=1e-5)
    late["hf_float32"]["noise"] = [1e-5, 1e-5, 0.5]
    assert any("logprob gap" in f for f in hj.fp32_failures({"prompts": [late]}))


def test_bf16_rules_distribution_everywhere_positions_only_without_routing():
    refs = ("dense_float64", "hf_bfloat16")

    def result(tokens, margins, err=0.05, ref_err=0.05, noise=0.1, routed=False):
        e = _entry(10, tokens, [1, 2, 3, 4], [err] * 4, noise=noise, margins=margins,
                   refs=refs)
        e["hf_bfloat16"]["tok_err"] = [ref_err] * 4
        return {"routed": routed, "prompts": [e]}

    assert hj.bf16_failures(result([1, 2, 3, 4], [1.0] * 4)) == []
    # token 1 differs where the margin (1.0) exceeds twice bf16's largest error (0.2)
    bad = hj.bf16_failures(result([1, 9, 3, 4], [1.0] * 4))
    assert bad == ["prompt of 10 tokens: generated token 1 differs from float64 where the "
                   "margin 1.00 exceeds twice bf16's largest error (0.10)"]
    assert hj.bf16_counted(result([1, 9, 3, 4], [1.0, 0.15, 1.0, 1.0])) == 0.75
    # ... not where the margin (0.15) is within it, nor at all with top-k routing
    assert hj.bf16_failures(result([1, 9, 3, 4], [1.0, 0.15, 1.0, 1.0])) == []
    assert hj.bf16_failures(result([1, 9, 3, 4], [1.0] * 4, routed=True)) == []
    # the error distribution is judged either way: more than twice transformers-bf16's
    for routed in (False, True):
        wide = hj.bf16_failures(result([1, 2, 3, 4], [1.0] * 4, err=0.3, ref_err=0.1,
                                       routed=routed))
        assert [f.split(":")[0] for f in wide] == ["bf16 logprob error, median",
                                                   "bf16 logprob error, 90th percentile"]
        assert hj.bf16_failures(result([1, 2, 3, 4], [1.0] * 4, err=0.19, ref_err=0.1,
                                       routed=routed)) == []


def test_compare_tokens_reference_error_at_the_plugins_token():
    exact = _lp([[3.0, 1.0, 0.0], [0.0, 2.0, 1.9]])
    ref = _lp([[3.0, 1.5, 0.0], [0.0, 2.0, 1.9]])
    r = hj.compare_tokens([1, 2], [float(exact[0, 1]), float(exact[1, 2])], ref, exact)
    assert r["tok_err"][0] == pytest.approx(abs(float(ref[0, 1] - exact[0, 1])))
    assert r["tok_err"][1] == 0


def test_first_departure_names_the_lowest_part_at_the_first_bad_position():
    n, h = 6, 8
    g = torch.Generator().manual_seed(0)
    exact = {f"L{i}.{p}": torch.randn(n, h, generator=g, dtype=torch.float64)
             for i in range(2) for p in hj.PARTS}
    noise = {k: v + 1e-7 * torch.randn(n, h, generator=g, dtype=torch.float64)
             for k, v in exact.items()}
    plugin = {k: v + 1e-7 * torch.randn(n, h, generator=g, dtype=torch.float64)
              for k, v in exact.items()}
    plugin["L1.mlp"][4:] += 0.5          # departs from position 4 on
    plugin["L1.stream"][3:] += 0.5       # and, earlier, the stream (position 3)
    plugin["L0.mixer"][0] = math.nan     # a position the engine did not report: ignored
    res = hj.first_departure(plugin, exact, noise, 2, factor=20.0, floor=1e-5)
    assert res["first"]["part"] == "L1.stream" and res["first"]["position"] == 3
    assert [r["first_bad_position"] for r in res["table"]] == [None] * 4 + [4, 3]
    clean = hj.first_departure(noise, exact, noise, 2, factor=20.0, floor=1e-5)
    assert clean["first"] is None


def test_routing_report_flags_flips_and_ties():
    exact = {1: torch.tensor([[3.0, 2.0, 1.99], [3.0, 2.0, 0.0]], dtype=torch.float64)}
    plugin = {"L1.router": torch.tensor([[3.0, 1.98, 1.99], [3.0, 2.0, 0.0]],
                                        dtype=torch.float64)}
    rep = hj.routing_report(plugin, exact, top_k=2, tie_eps=0.05)
    assert rep["flips"] == [{"layer": 1, "position": 0, "float64_gap": pytest.approx(0.01),
                             "tie": True}]
    assert rep["max_router_logit_err"] == pytest.approx(0.02)


def test_dense_float64_model_matches_transformers_on_the_embedded_checkpoint():
    from transformers import AutoModelForCausalLM

    from tests.e2e.dense_qwen3_next import DenseQwen3Next
    from vllm_ascend_ext.models import tiny_qwen3_next_path

    path = tiny_qwen3_next_path()
    ids = torch.randint(2, 1024, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    dense = torch.log_softmax(DenseQwen3Next(path).forward(ids)["logits"], -1)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64,
                                              experts_implementation="eager").eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
    assert torch.equal(dense.argmax(-1), ref.argmax(-1))
    # transformers' "float64" keeps its GDN core, norms and softmaxes in float32
    assert (dense - ref).abs().max() < 1e-3


def test_gdn_layer_refuses_a_repacked_conv_weight():
    from vllm_ascend_ext.attention.gdn.layer import ConvWeightError, conv_taps

    conv = torch.nn.Module()
    conv.weight = torch.nn.Parameter(torch.arange(24.0).view(6, 1, 4))
    assert torch.equal(conv_taps(conv), torch.arange(24.0).view(6, 4).t())
    conv._cpu_unpacked_conv_weight = conv.weight.view(6, 4).clone()   # vLLM packed it
    conv.weight = torch.nn.Parameter(torch.zeros(6, 4))
    with pytest.raises(ConvWeightError, match="repacked"):
        conv_taps(conv)
