import sys

from vllm_ascend_ext.cli import main

if __name__ == "__main__":
    sys.exit(main())
