"""Distributed pieces of the plugin: the platforms' device communicator."""
