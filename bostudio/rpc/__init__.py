"""Pooling other machines' devices with llama.cpp's RPC backend.

    workers.py  Worker (host, port, budget), parsing `--rpc` and config.toml `[[rpc]]`: pure
    probe.py    a worker's devices through the engine (`llama-server --rpc EP --list-devices`)
    serve.py    `bostudio rpc serve`: ggml's rpc-server on a worker machine, and its user unit
"""
