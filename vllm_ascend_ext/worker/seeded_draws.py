"""A discarded partial prefill's random draws undone exactly, in the NPU runner.

After sampling, vLLM's runner rewinds the generator of each seeded request whose sample it
discards (a partial prefill, whose token is thrown away) by ``4``:
``gen.set_offset(gen.get_offset() - 4)``, the Philox offset one draw of its sampler takes
on CUDA. On an NPU the offset a draw advances is torch_npu's (op-plugin reserves its own
increment per random operator), not necessarily 4; a short rewind would leave a chunked
seeded request drawing other numbers than the same request unchunked. The NPU runner
therefore reads every seeded generator's offset before sampling (a host-side value: no
device sync) and, after vLLM's bookkeeping, sets the discarded requests' generators back
to exactly that offset.
"""

from __future__ import annotations


def offsets(generators: dict) -> dict[int, int]:
    """Batch index -> offset of each seeded request's generator (before sampling)."""
    return {index: int(gen.get_offset()) for index, gen in generators.items()}


def restore(generators: dict, before: dict[int, int], discarded) -> int:
    """Set each discarded request's generator back to its offset before sampling;
    ``discarded``: per batch index, whether its sample was discarded. Returns how many."""
    count = 0
    for index, offset in before.items():
        if index < len(discarded) and discarded[index] and index in generators:
            generators[index].set_offset(offset)
            count += 1
    return count
