from vllm_ascend_ext.cli.entry import console_main

if __name__ == "__main__":
    console_main()
