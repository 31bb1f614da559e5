"""llama-server engines: get the pinned llama.cpp source, build it per backend, find and probe builds,
and turn a launch request into argv the probed binary understands."""
