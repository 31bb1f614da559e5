"""RPC workers as data: `--rpc` and `[[rpc]]` parsing (table-driven errors), the pool's device names
and budgets, the loopback-only bind, the self-draft spec, the buffer-log parser. No processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bostudio.errors import ConfigError
from bostudio.hardware.device import MIB, EngineDevice
from bostudio.planner.reported import device_buffers
from bostudio.rpc.probe import WorkerProbe, buffer_labels, pool_devices, rpc_arg
from bostudio.rpc.serve import RpcServeOptions, check_rpc_bind, rpc_unit, serve_argv
from bostudio.rpc.workers import Worker, parse_workers, select_workers, workers_from_config
from bostudio.speculation import SpecRequest, parse_spec


def test_rpc_values_parse_to_workers() -> None:
    assert parse_workers("10.0.0.2:50052, pc3") == (Worker("10.0.0.2", 50052), Worker("pc3", 50052))


CONFIG_ERRORS = [
    ("unknown key", '[[rpc]]\nhost = "a"\nbuget_mib = 3\n', "unknown key `buget_mib`", "budget_mib"),
    ("no host", "[[rpc]]\nport = 1\n", "needs host", 'host = "'),
    ("bad budget", '[[rpc]]\nhost = "a"\nbudget_mib = -5\n', "budget_mib must be a positive", "20000"),
    ("bool budget", '[[rpc]]\nhost = "a"\nbudget_mib = true\n', "budget_mib must be a positive", "20000"),
    ("bad link", '[[rpc]]\nhost = "a"\nlink_mbit = "fast"\n', "link_mbit must be a positive", "10 GbE"),
    ("zero link", '[[rpc]]\nhost = "a"\nlink_mbit = 0\n', "link_mbit must be a positive", "1000"),
    ("bad port", '[[rpc]]\nhost = "a"\nport = 99999\n', "out of range", "65535"),
    ("twice", '[[rpc]]\nhost = "a"\n[[rpc]]\nhost = "a"\n', "named twice", "once"),
    ("not a table", 'rpc = 3\n', "array of tables", "[[rpc]]"),
    ("bad toml", '[[rpc]\n', "cannot read config", "TOML"),
]


@pytest.mark.parametrize("case,text,message,hint", CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS])
def test_config_errors_name_the_file_and_say_what_to_write(tmp_path: Path, case: str, text: str, message: str,
                                                           hint: str) -> None:
    f = tmp_path / "config.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        workers_from_config(f)
    assert str(f) in exc.value.message and message in exc.value.message
    assert hint in exc.value.hint


def test_cli_workers_take_their_budgets_from_config(tmp_path: Path) -> None:
    f = tmp_path / "config.toml"
    f.write_text('[[rpc]]\nhost = "a"\nport = 1\nbudget_mib = 100\nlink_mbit = 10000\n[[catalog]]\n')
    config = workers_from_config(f)
    assert config == (Worker("a", 1, 100, 10000),)
    assert select_workers(None, config) == config
    assert select_workers("a:1,b:2", config) == (Worker("a", 1, 100, 10000), Worker("b", 2, None))
    assert select_workers("none", config) == ()
    assert workers_from_config(tmp_path / "missing.toml") == ()


def test_pool_devices_are_named_as_llama_server_will_name_them() -> None:
    dev = lambda n: EngineDevice("RPC0", "x", 8192, 4096 * n, "rpc")  # noqa: E731 (each worker probed alone)
    probes = (WorkerProbe(Worker("a", 1, 300, 2500), (dev(1), dev(2))),
              WorkerProbe(Worker("dead", 2), problem="rpc worker dead:2 cannot be reached"),
              WorkerProbe(Worker("b", 3), (dev(1),)))
    devices = pool_devices(probes)
    assert [d.label for d in devices] == ["RPC0", "RPC1", "RPC2"]  # numbered across reachable workers
    assert [d.endpoint for d in devices] == ["a:1", "a:1", "b:3"]
    assert [d.budget_bytes for d in devices] == [100 * MIB, 200 * MIB, None]  # a's budget by free memory
    assert [d.link_mbit for d in devices] == [2500, 2500, None]
    assert all(d.remote and d.is_gpu for d in devices)
    assert rpc_arg(probes) == "a:1,b:3"


def test_only_loopback_binds_without_allow_network() -> None:
    assert check_rpc_bind("127.0.0.1", 50052, False) is None
    assert check_rpc_bind("::1", 50052, False) is None
    with pytest.raises(ConfigError, match="refusing to bind") as exc:
        check_rpc_bind("0.0.0.0", 50052, False)
    assert "ssh -N -L 50052:127.0.0.1:50052" in exc.value.hint and "--allow-network" in exc.value.hint
    warning = check_rpc_bind("192.168.1.5", 50052, True)
    assert warning is not None and "no authentication" in warning and "trusted LAN" in warning


def test_serve_argv_and_unit() -> None:
    opts = RpcServeOptions(host="127.0.0.1", port=50053, devices="CUDA0", threads=4, cache=True)
    assert serve_argv(Path("/e/ggml-rpc-server"), opts) == [
        "/e/ggml-rpc-server", "--host", "127.0.0.1", "--port", "50053", "--device", "CUDA0", "--threads", "4",
        "--cache"]
    unit = rpc_unit("/py", opts)
    assert "ExecStart=/py -m bostudio rpc serve --host 127.0.0.1 --port 50053 --device CUDA0" in unit
    with pytest.raises(ConfigError, match="--threads 0"):
        serve_argv(Path("x"), RpcServeOptions(threads=0))


def test_self_draft_spec() -> None:
    assert parse_spec("self-draft:q2_k") == SpecRequest("self-draft", quant="Q2_K")
    for bad in ("self-draft", "self-draft:", "self-draft:Q2 K"):
        with pytest.raises(ConfigError, match="self-draft"):
            parse_spec(bad)


LOG = """\
load_tensors: offloading output layer to GPU
load_tensors:   CPU_Mapped model buffer size =   900.50 MiB
load_tensors: RPC0[127.0.0.1:41001] model buffer size =   650.25 MiB
load_tensors: RPC0[127.0.0.1:41000] model buffer size =    88.00 MiB
llama_context: constructing llama_context
llama_kv_cache: RPC0[127.0.0.1:41000] KV buffer size =     4.00 MiB
llama_kv_cache:        CPU KV buffer size =    10.00 MiB
llama_kv_cache: size =   14.00 MiB (  4096 cells,   3 layers,  4/1 seqs), K (f16):    7.00 MiB
llama_kv_cache:        CPU KV buffer size =     2.00 MiB
llama_context: constructing llama_context
llama_kv_cache:        CPU KV buffer size =    99.00 MiB
"""


def test_device_buffers_are_read_per_device() -> None:
    """llama.cpp names RPC buffers by the device's index on its server: both workers' are RPC0[...]."""
    workers = pool_devices((WorkerProbe(Worker("127.0.0.1", 41000), (EngineDevice("RPC0", "x", 1, 1, "rpc"),)),
                            WorkerProbe(Worker("127.0.0.1", 41001), (EngineDevice("RPC0", "x", 1, 1, "rpc"),))))
    got = device_buffers(LOG, buffer_labels(workers))
    assert got["RPC0"] == {"weights": 88 * MIB, "KV cache": 4 * MIB}
    assert got["RPC1"] == {"weights": round(650.25 * MIB)}
    assert got["CPU"] == {"weights": round(900.5 * MIB), "KV cache": 12 * MIB}  # the second context is not ours
