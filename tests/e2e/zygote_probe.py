"""A script for tests/e2e/test_zygote.py: reports what a forked run can see."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import vllm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exit", type=int, default=None)
    ap.add_argument("--sleep", type=float, default=0.0)
    args = ap.parse_args()
    seen = getattr(vllm, "_zygote_probe", None)
    vllm._zygote_probe = os.getpid()            # a state change no later run may see
    time.sleep(args.sleep)
    if args.exit is not None:
        print("failing on purpose", file=sys.stderr)
        sys.exit(args.exit)
    print("RESULT " + json.dumps({"platform": "probe", "seen": seen, "pid": os.getpid(),
                                  "probe_env": os.environ.get("ZYGOTE_PROBE"),
                                  "argv": sys.argv[1:], "cwd": os.getcwd()}))


if __name__ == "__main__":
    main()
