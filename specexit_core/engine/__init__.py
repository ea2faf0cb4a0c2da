"""Engines that run SpecExit: the reference (PyTorch) engine here; vLLM through the plugin."""
