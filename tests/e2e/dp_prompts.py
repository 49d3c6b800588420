"""The prompts of the distributed runs (run_dp.py, run_tp.py, the two-node serving test):
one reference run serves them all."""

PROMPTS = ["the quick brown fox jumps over the lazy dog and then",
           "numbers like 1 2 3 and then some more numbers",
           "a decode step reads every cached token of its request",
           "hello world this is a test of data parallel serving"]
MAX_TOKENS = [8, 8, 8, 3]          # the last prompt (rank 1's own) finishes early
