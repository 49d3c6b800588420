"""The documented shape bounds of torch_npu's Gated-DeltaNet operators (pure data).

torch_npu 2.13 ("输入shape大小需满足约束"): ``npu_recurrent_gated_delta_rule`` takes
N_k, N_v, D_k, D_v <= 256; ``npu_chunk_gated_delta_rule`` takes N_k, N_v <= 64,
D_k = D_v = 128 and N_v a multiple of N_k. The op choice (``attention/gdn/ops_table.py``)
takes a torch_npu op only inside them, and contract mode checks every call against them
(``contract/op_rules.py``): one table for both.
"""

RECURRENT_MAX = 256
CHUNK_MAX_HEADS = 64
CHUNK_HEAD_DIM = 128
