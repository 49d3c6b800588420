"""Workers the plugin's platforms name (``parallel_config.worker_cls``)."""
