"""The NPU platform's substitutes for vLLM's Triton kernels (``worker/kernel_substitutes``):
every kernel vLLM 0.32's CPU platform overrides is substituted (the drafters' input kernels
in ``test_drafter_substitutes.py``); drafter methods other than ngram and MTP are refused; the slot-mapping substitute equals an explicit loop and vLLM's own
CPU kernel, context parallelism and padding included."""

from __future__ import annotations

import random

import pytest
import torch

from vllm_ascend_ext.worker import kernel_substitutes as ks


def _cpu_platform_overrides(monkeypatch) -> dict:
    """The kernel names vLLM's CPU platform registers, read by calling it with the
    registry's ``register_kernels`` captured (nothing is registered)."""
    import vllm.triton_utils as tu
    from vllm.platforms.cpu import CpuPlatform
    from vllm.triton_utils import dispatcher

    seen: dict = {}
    monkeypatch.setattr(tu, "HAS_TRITON", False)
    monkeypatch.setattr(dispatcher, "register_kernels", lambda overrides: seen.update(overrides))
    CpuPlatform.register_triton_kernel_overrides()
    return seen


def test_every_kernel_vllm_overrides_is_substituted_or_named_unreachable(monkeypatch):
    names = set(_cpu_platform_overrides(monkeypatch))
    assert len(names) >= 10 and ks.SLOT_MAPPING in names
    assert not set(ks.SUBSTITUTES) & set(ks.UNREACHED)
    missing = names - set(ks.SUBSTITUTES) - set(ks.UNREACHED)
    assert not missing, f"vLLM overrides kernels the NPU platform neither substitutes nor names: {missing}"
    stale = (set(ks.SUBSTITUTES) | set(ks.UNREACHED)) - names
    assert not stale, stale


def test_the_npu_serves_ngram_and_mtp_and_refuses_other_drafters():
    from types import SimpleNamespace

    from vllm_ascend_ext.errors import AscendExtError
    from vllm_ascend_ext.platform.config_hooks import (
        exact_host_lists_with_speculation,
        refuse_speculation_without_substitutes,
    )
    refuse_speculation_without_substitutes(None)
    refuse_speculation_without_substitutes(SimpleNamespace(method="ngram"))
    refuse_speculation_without_substitutes(SimpleNamespace(method="mtp"))
    for method in ("eagle", "eagle3", "draft_model", "dflash"):
        with pytest.raises(AscendExtError, match=f"method '{method}'.*not verified.*'ngram' or 'mtp'"):
            refuse_speculation_without_substitutes(SimpleNamespace(method=method))
    config = SimpleNamespace(speculative_config=SimpleNamespace(method="ngram"),
                             scheduler_config=SimpleNamespace(async_scheduling=True))
    exact_host_lists_with_speculation(config)
    assert config.scheduler_config.async_scheduling is False


def _loop(num_tokens, max_tokens, qsl, positions, table, bs, world, rank, inter, pad=-1):
    out = [pad] * max_tokens
    for r in range(len(qsl) - 1):
        for t in range(qsl[r], qsl[r + 1]):
            pos = positions[t]
            vblock, voff = divmod(pos, bs * world)
            if (voff // inter) % world != rank:
                continue
            local = (voff // (world * inter)) * inter + voff % inter
            out[t] = table[r][vblock] * bs + local
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("world,inter", [(1, 1), (2, 1), (4, 2)])
def test_slot_mapping_substitute_equals_a_loop(seed, world, inter):
    rng = random.Random(seed)
    bs, max_reqs, width = rng.choice([16, 128]), 6, 8
    lens = [rng.randint(1, 40) for _ in range(rng.randint(1, max_reqs))]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    positions = []
    for n in lens:
        start = rng.randint(0, bs * world * (width - 3))
        positions += list(range(start, start + n))
    table = [[rng.randint(1, 500) for _ in range(width)] for _ in range(max_reqs)]
    rank = rng.randrange(world)
    max_tokens = qsl[-1] + rng.randint(0, 9)
    out = torch.full((max_tokens + 3,), 12345, dtype=torch.int64)
    ks.compute_slot_mapping(qsl[-1], max_tokens, torch.tensor(qsl, dtype=torch.int32),
                            torch.tensor(positions), torch.tensor(table, dtype=torch.int32),
                            width, out, bs, world, rank, inter)
    want = _loop(qsl[-1], max_tokens, qsl, positions, table, bs, world, rank, inter)
    assert out[:max_tokens].tolist() == want
    assert out[max_tokens:].tolist() == [12345] * 3          # nothing past max_num_tokens
    if world == 1 and hasattr(torch.ops._C, "compute_slot_mapping_kernel_impl"):
        theirs = torch.full((max_tokens,), -1, dtype=torch.int64)   # vLLM's CPU kernel
        torch.ops._C.compute_slot_mapping_kernel_impl(
            torch.tensor(qsl, dtype=torch.int32), torch.tensor(positions),
            torch.tensor(table, dtype=torch.int32), theirs, bs)
        assert theirs.tolist() == want


def test_the_emulated_platform_registers_the_npu_substitute_over_vllms():
    from vllm.triton_utils.dispatcher import _registry

    from vllm_ascend_ext.emulation.platform import EmulatedAscendPlatform

    EmulatedAscendPlatform.register_triton_kernel_overrides()
    EmulatedAscendPlatform.register_triton_kernel_overrides()   # idempotent
    for name, impl in ks.SUBSTITUTES.items():
        assert _registry[name][1] is impl, name
