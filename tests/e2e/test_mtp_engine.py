"""MTP speculative decoding on the plugin's backends, inside real vLLM (emulated, fp32): the
embedded tiny Qwen3-Next with its MTP layer (``num_nextn_predict_layers`` 1), the draft
layer's attention on FIA, the target's verify steps on FIA + the plugin's Gated-DeltaNet
layers, the drafter's input kernels on the NPU substitutes.

A ragged batch (eight prompts of different lengths, ``max_tokens`` 16 / 13 / 10 so that
requests finish mid-draft) on a 16-token budget (chunked prefill: verify rows beside
prompt chunks). The untrained MTP layer agrees with the model in ~3% of drafts, so the
harness replaces a fixed 60% of the proposals (by prompt and position) with the plain
run's continuation: drafts are then accepted and rejected raggedly, at every position.

- MTP k = 1 and k = 3 == plain decoding: tokens identical, logprobs within 1e-4;
- the acceptance the worker counts on the device equals vLLM's own spec-decode metrics
  (the scheduler's count, from the host), per position;
- the drafter's input kernels ran as the NPU substitutes (call counts);
- no host sync inside the GDN layers over the MTP runs' steps (dispatcher counts);
- an emulated Ascend 950 with the mixed split on: split verify+prefill steps, same tokens;
- bf16 with contract mode: every NPU operator call, the draft layer's included, validated;
- negative controls: GDN states advanced by the drafted instead of the accepted count, and
  verify rows that read one KV slot past their sequence, change the output.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import max_logprob_gap, oracle_runs, run_script

pytestmark = pytest.mark.e2e
LOGPROB_TOL = 1e-4
RAGGED = ("--ragged", "--budget", "16", "--eager")
ORACLE_RATE = "0.6"


@pytest.fixture(scope="module")
def plain():
    return run_script("run_gdn.py", *RAGGED, "--count-ops", emulate=True, timeout=900)


@pytest.fixture(scope="module")
def mtp(plain, tmp_path_factory):
    return oracle_runs("run_gdn.py", RAGGED, plain, tmp_path_factory.mktemp("mtp"),
                       ORACLE_RATE)


@pytest.fixture(scope="module")
def plain_file(mtp):
    return mtp.plain_file


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_equals_plain_decoding_with_ragged_acceptance(plain, mtp, k):
    res = mtp(k, "--count-ops")
    assert res["tokens"] == plain["tokens"]
    assert max_logprob_gap(res, plain) < LOGPROB_TOL
    lengths = {len(t) for t in plain["tokens"]}
    assert lengths == {16, 13, 10}          # requests finished at different steps
    # verify rows beside prompt chunks, and verify-only steps
    assert res["gdn_steps"]["kinds"].get("spec+prefill", 0) > 0
    assert res["gdn_steps"]["kinds"].get("spec", 0) > 0
    assert res["gdn_steps"]["continued_prefill_rows"] > 0
    acc, vllm = res["acceptance"], res["spec_metrics"]
    assert acc["drafts"] == vllm["num_drafts"] and acc["draft_tokens"] == vllm["num_draft_tokens"]
    assert acc["per_position"] == vllm["num_accepted_tokens_per_pos"]
    assert acc["draft_tokens"] == k * acc["drafts"]
    accepted = sum(acc["per_position"])
    assert 0 < accepted < acc["draft_tokens"]            # accepted and rejected drafts
    assert all(n > 0 for n in acc["per_position"][:2])   # acceptance past the first draft
    assert "method=mtp" in acc["summary"]
    calls = res["substitute_calls"]
    assert calls["eagle_prepare_next_token_padded_kernel"] > 0
    assert calls["eagle_prepare_inputs_padded_kernel"] > 0
    # later drafts step autoregressively: one slot-mapping update per extra draft
    assert (calls["eagle_step_slot_mapping_metadata_kernel"] > 0) == (k > 1)
    assert res["oracle_steps"] > 0


@pytest.mark.parametrize("k", [1, 3])
def test_no_host_sync_inside_the_gdn_layers_with_mtp(mtp, k):
    steps = [s for s in mtp(k, "--count-ops")["steps"] if s["in_layers"]]
    assert {"spec", "spec+prefill"} <= {s["kind"] for s in steps}
    assert all(s["syncs_in_layers"] == 0 for s in steps), [s for s in steps
                                                            if s["syncs_in_layers"]][:2]
    assert len(steps) >= 10 and all(
        s["in_layers"].get("_C_ascend_ext.npu_causal_conv1d_ext", 0) >= 3 for s in steps)


def test_ascend950_splits_verify_and_prefill_spans_with_mtp(plain, mtp):
    res = mtp(3, "--mixed-split", "on", ASCEND_EXT_SOC="ascend950")
    mixed, split = res["split"][0]
    assert mixed > 0 and split == mixed
    assert res["gdn_ops"][0]["decode"] == "_C_ascend_ext.npu_recurrent_gated_delta_rule_ext"
    assert res["tokens"] == plain["tokens"] and max_logprob_gap(res, plain) < LOGPROB_TOL


def test_bfloat16_mtp_under_contract_mode(mtp):
    res = mtp(3, "--dtype", "bfloat16", ASCEND_EXT_NPU_CONTRACT="1")
    assert res["contract"]["violations"] == 0, res["contract"]["summary"]
    assert res["contract"]["calls"]["npu_fused_infer_attention_score"] > 0
    assert res["acceptance"]["draft_tokens"] > 0


@pytest.mark.parametrize("corruption", ["drafted-count", "verify-slot"])
def test_negative_controls_change_the_output(plain, plain_file, corruption):
    res = run_script("run_gdn.py", "--mtp", "3", "--oracle", plain_file, ORACLE_RATE, *RAGGED,
                     "--corrupt", corruption, emulate=True, timeout=900)
    # measured: drafted-count changes all eight prompts, verify-slot one (its logprobs
    # move by up to 0.77 on the tokens the runs still share)
    assert res["tokens"] != plain["tokens"]
