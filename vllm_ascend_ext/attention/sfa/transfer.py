"""KV transfer (P/D disaggregation) around one SFA layer's forward.

vLLM's layer-wise connector hook (``maybe_transfer_kv_layer``) waits for one layer's
KV before the forward and saves it after. An SFA layer writes three cache layers
(``caches.py``), so the same two calls are made for each of them, through vLLM's
public connector API; without a v1 connector (or without connector metadata this
step) the body simply runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def run_with_kv_transfer(layer_names: Sequence[str], body: Callable[[], None]) -> None:
    from vllm.distributed.kv_transfer import (
        get_kv_transfer_group,
        has_kv_transfer_group,
        is_v1_kv_transfer_group,
    )
    from vllm.model_executor.layers.attention.attention import get_attention_context

    if not has_kv_transfer_group() or not is_v1_kv_transfer_group():
        body()
        return
    connector = get_kv_transfer_group()
    contexts = [(name, get_attention_context(name)) for name in layer_names]
    if contexts[0][1][0] is None or not connector.has_connector_metadata():
        body()
        return
    for name in layer_names:
        connector.wait_for_layer_load(name)
    body()
    for name, (attn_metadata, _, kv_cache, _) in contexts:
        connector.save_kv_layer(name, kv_cache, attn_metadata)
