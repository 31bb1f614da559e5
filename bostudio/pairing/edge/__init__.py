"""The pairing edge: what the core decides on, gathered from local files, the engine's tools (llama-quantize,
tokenizers) and the hub (drafters pulled as the pull policy allows)."""
