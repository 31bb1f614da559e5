"""bostudio: a runtime manager for llama.cpp speculative decoding."""

__version__ = "0.1.0"
