"""MTP speculative decoding on the SFA backend, inside real vLLM (emulated): the embedded
tiny DSA (float and W8A8) with its MTP layer (layer 2, ``num_nextn_predict_layers`` 1)
served by the plugin's ``DeepseekV32MTPModel`` (``models/dsa_mtp.py``): the draft layer
is the plugin's DSA decoder layer with its own SFA caches, indexer and MoE; the target's
verify rows (1 + k query tokens per request) go through the lightning indexer and sparse
attention as causal rows.

A ragged batch (four prompts of 110+ words, past ``index_topk`` 32; ``max_tokens`` 12 / 9
/ 6, so requests finish mid-draft) on a 64-token budget (chunked prefill). As for
Qwen3-Next (``test_mtp_engine.py``) the untrained MTP layer rarely agrees with the model,
so the harness replaces a fixed 60% of the proposals with the plain run's continuation.

- float, MTP k = 1 and 3 == plain decoding (tokens identical, logprobs within 1e-4);
  acceptance counted on the device == vLLM's metrics, per position; drafter substitutes
  called; no host-sync operator inside the SFA layers over the engine steps (dispatcher
  counts; the test's indexer probe off: it reads selection counts to the host);
- W8A8, MTP k = 3 == W8A8 plain decoding;
- W8A8 bf16 with contract mode, MTP k = 1: every NPU call validated (the prolog, indexer
  and sparse attention of the draft layer included);
- negative control: verify rows that read one KV slot past their sequence change tokens.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import max_logprob_gap, run_script

pytestmark = pytest.mark.e2e
LOGPROB_TOL = 1e-4
RAGGED = ("--ragged", "--max-tokens", "12", "--max-num-batched-tokens", "64",
          "--enforce-eager")
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict = {}
    folder = tmp_path_factory.mktemp("sfa_mtp")

    def get(*args: str, **env: str) -> dict:
        key = (args, tuple(sorted(env.items())))
        if key not in cache:
            cache[key] = run_script("run_dsa.py", *args, *RAGGED, emulate=True, timeout=900,
                                    **env)
        return cache[key]

    def plain_file(quantized: bool) -> str:
        path = folder / f"plain{'_w8a8' if quantized else ''}.json"
        if not path.exists():
            path.write_text(json.dumps(get(*(("--quantized",) if quantized else ()))))
        return str(path)

    get.plain_file = plain_file
    return get


def _mtp(runs, k: int, *extra: str, quantized: bool = False, **env) -> dict:
    q = ("--quantized",) if quantized else ()
    return runs(*q, "--mtp", str(k), "--oracle", runs.plain_file(quantized), "0.6", *extra,
                **env)


@pytest.mark.parametrize("k", [1, 3])
def test_float_mtp_equals_plain_decoding(runs, k):
    plain = runs()
    res = _mtp(runs, k, "--count-ops", "--no-probe")
    assert res["drafter"]["class"] == "AscendDsaMTP"
    assert res["drafter"]["sfa_layers"] == ["model.layers.2.self_attn.attn"]
    assert {len(t) for t in plain["tokens"]} == {12, 9, 6}
    assert res["tokens"] == plain["tokens"] and max_logprob_gap(res, plain) < LOGPROB_TOL
    acc, vllm = res["acceptance"], res["spec_metrics"]
    assert acc["per_position"] == vllm["num_accepted_tokens_per_pos"]
    assert acc["draft_tokens"] == vllm["num_draft_tokens"] == k * acc["drafts"]
    assert 0 < sum(acc["per_position"]) < acc["draft_tokens"]
    assert all(n > 0 for n in acc["per_position"])        # every draft position accepted
    calls = res["substitute_calls"]
    assert calls["eagle_prepare_inputs_padded_kernel"] > 0
    assert (calls["eagle_step_slot_mapping_metadata_kernel"] > 0) == (k > 1)
    # inside the SFA layers (target and draft): no host read. Outside them vLLM's proposer
    # reads its host copy of query_start_loc (``.item()`` on a CPU tensor), which the CPU
    # emulation cannot tell from a device read; it is not counted here.
    steps = [s for s in res["steps"] if s["in_layers"]]
    assert len(steps) > 10
    assert all(sum(s["in_layers"].get(n, 0) for n in SYNC_OPS) == 0 for s in steps)


def test_w8a8_mtp_equals_w8a8_plain_decoding(runs):
    plain = runs("--quantized")
    res = _mtp(runs, 3, quantized=True)
    assert res["quant"] == plain["quant"] == "ascend_ext"
    assert res["tokens"] == plain["tokens"] and max_logprob_gap(res, plain) < LOGPROB_TOL
    assert 0 < sum(res["acceptance"]["per_position"]) < res["acceptance"]["draft_tokens"]


def test_w8a8_bf16_mtp_under_contract_mode(runs):
    res = runs("--quantized", "--dtype", "bfloat16", "--mtp", "1", ASCEND_EXT_NPU_CONTRACT="1")
    assert res["contract"]["violations"] == 0, res["contract"]["summary"]
    for op in ("npu_lightning_indexer", "npu_sparse_flash_attention", "npu_mla_prolog_v3"):
        assert res["contract"]["calls"][op] > 0, op
    assert res["acceptance"]["draft_tokens"] > 0


def test_negative_control_verify_reading_one_slot_too_far_changes_tokens(runs):
    res = _mtp(runs, 3, "--corrupt-verify-slot")
    assert res["tokens"] != runs()["tokens"]
