"""ModelSlim-quantized checkpoints (``quant_model_description.json``), method ``ascend_ext``."""
