"""Fixture nodes for `inferd doctor`: the two-socket eight-GPU host of fixture_trees made
healthy or broken in one named way, its devices' config-space bytes, GPU replays with
throttling and XIDs, and small HTTP servers that answer as the engine, the agent and
Prometheus's query_range do.

The healthy node: engine pid 4242 on GPUs 0,1 (node 0), bound to node 0 with its pages
there; every link at Gen5 x16, no AER errors; MPS 256 along every path, MRRS 512, ASPM
off; CPUs on the performance governor; GPUs without throttling, XIDs or ECC errors;
an engine with an idle, healthy KV cache.
"""

from __future__ import annotations

import copy
import http.server
import json
import math
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from fixture_trees import ENGINE_PID, FIXTURES, HostRoots, load_description, write_host

EIGHT_GPUS = FIXTURES / "gpu" / "eight_h200.json"
PCI_EXP_OFFSET = 0x60  # the PCI Express capability, after a power-management one at 0x40


# ---- config space ----


def config_space(
    mps: int = 256,
    mps_supported: int = 512,
    mrrs: int = 512,
    aspm_supported: int = 3,
    aspm_enabled: int = 0,
    size: int = 256,
) -> bytes:
    """The config space a device's sysfs `config` file holds (root's view: 256 bytes),
    with a power-management capability at 0x40 pointing to a PCI Express one at 0x60.
    Sizes in bytes (128, 256, ... 4096); ASPM 1 = L0s, 2 = L1, 3 = both."""

    def code(size_bytes: int) -> int:
        value = (size_bytes // 128).bit_length() - 1
        assert 128 << value == size_bytes, f"{size_bytes} is not 128 x 2^n"
        return value

    data = bytearray(size)
    data[0x06:0x08] = (0x0010).to_bytes(2, "little")  # status: capability list present
    data[0x34] = 0x40
    data[0x40], data[0x41] = 0x01, PCI_EXP_OFFSET  # power management -> PCI Express
    base = PCI_EXP_OFFSET
    data[base], data[base + 1] = 0x10, 0x00
    data[base + 0x04 : base + 0x08] = code(mps_supported).to_bytes(4, "little")
    data[base + 0x08 : base + 0x0A] = ((code(mps) << 5) | (code(mrrs) << 12)).to_bytes(2, "little")
    data[base + 0x0C : base + 0x10] = (aspm_supported << 10).to_bytes(4, "little")
    data[base + 0x10 : base + 0x12] = aspm_enabled.to_bytes(2, "little")
    return bytes(data)


# ---- the host ----

HEALTHY_NUMA_MAPS = """\
55d0c2a00000 default file=/usr/bin/python3.11 mapped=1024 mapmax=3 N0=1024 kernelpagesize_kB=4
55d0c3a00000 bind:0 heap anon=40960 dirty=40960 active=0 N0=40960 kernelpagesize_kB=4
7f1c00000000 bind:0 anon=524288 dirty=524288 active=0 N0=524000 N1=288 kernelpagesize_kB=4
7ffd4a1f0000 default stack anon=33 dirty=33 N0=33 kernelpagesize_kB=4
"""


def _walk(devices):
    for device in devices:
        yield device
        yield from _walk(device.get("children", []))


def _device(description: dict, bdf: str) -> dict:
    for bridge in description["pci"]:
        for device in _walk(bridge.get("devices", [])):
            if device["bdf"] == bdf:
                return device
    raise KeyError(bdf)


def healthy_description() -> dict:
    d = copy.deepcopy(load_description())
    templates = d["templates"]
    for bdf in ("0000:00:03.0", "0000:07:00.0"):  # the base fixture's AER errors
        files = _device(d, bdf)["files"] = dict(_device(d, bdf)["files"])
        files["aer_dev_correctable"] = templates["aer_correctable_clean"]
        files["aer_dev_nonfatal"] = templates["aer_uncorrectable_clean_nonfatal"]
        files["aer_dev_fatal"] = templates["aer_uncorrectable_clean_fatal"]
    for bdf in ("0000:82:01.0", "0000:84:00.0"):  # the base fixture's x8 link
        files = _device(d, bdf)["files"] = dict(_device(d, bdf)["files"])
        files["current_link_width"] = "16"
    d["proc"]["4242/numa_maps"] = HEALTHY_NUMA_MAPS
    return d


def set_files(description: dict, bdf: str, **files: str) -> dict:
    device = _device(description, bdf)
    device["files"] = {**device["files"], **files}
    return description


def write_node(
    root: Path,
    description: dict | None = None,
    configs: dict[str, bytes] | None = None,
    environ: dict[str, str] | None = None,
    governor: str = "performance",
) -> HostRoots:
    """Write the node; every PCI device gets config space (`configs` overrides by BDF),
    the engine an environ (CUDA_VISIBLE_DEVICES=0,1 unless given), CPUs a governor."""
    description = description if description is not None else healthy_description()
    roots = write_host(root, description)
    configs = configs or {}
    for link in (roots.sysfs / "bus" / "pci" / "devices").iterdir():
        (link / "config").write_bytes(configs.get(link.name, config_space()))
    env = environ if environ is not None else {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin"}
    (roots.procfs / str(ENGINE_PID) / "environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    )
    for cpu in range(64):
        path = roots.sysfs / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cpufreq" / "scaling_governor"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(governor + "\n")
    thp = roots.sysfs / "kernel" / "mm" / "transparent_hugepage" / "enabled"
    thp.parent.mkdir(parents=True, exist_ok=True)
    thp.write_text("always [madvise] never\n")
    return roots


# ---- GPU replays ----


def gpu_replay(path: Path, edit: Callable[[int, dict], None] | None = None) -> Path:
    """eight_h200.json with every reading healthy (no throttle reason, XID, ECC error or
    pending remap), then `edit(snapshot_index, reading)` applied to each reading."""
    doc = json.loads(EIGHT_GPUS.read_text())
    for s_index, snapshot in enumerate(doc["snapshots"]):
        for reading in snapshot["gpus"]:
            reading.update(
                clocks_event_reasons=0,
                xid_errors=[],
                ecc_uncorrected_volatile=0,
                remapped_rows_pending=False,
                remapped_rows_failure=False,
            )
            if edit is not None:
                edit(s_index, reading)
    path.write_text(json.dumps(doc))
    return path


# ---- HTTP sources ----

ENGINE_CONFIG = {
    "config": {
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "kv_cold_dtype": "none",
        "kv_hot_window": 256,
        "swap_space_bytes": 4 << 30,
        "preemption_mode": "swap",
        "mode": "fast",
    },
    "bounds": {},
    "path": "fast",
    "path_reason": None,
}


def engine_metrics(
    usage: float = 0.2, fragmentation: float = 0.05, failures: int = 0, running: int = 4, waiting: int = 0
) -> str:
    labels = 'engine="0",model_name="tiny"'
    cache = 'block_size="16",num_gpu_blocks="40000",num_cpu_blocks="8192",swap_space="4"'
    return f"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{labels}}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} {usage}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{{labels},{cache}}} 1.0
# TYPE inferd_kv_fragmentation_ratio gauge
inferd_kv_fragmentation_ratio {fragmentation}
# TYPE inferd_engine_fastpath_failures_total counter
inferd_engine_fastpath_failures_total{{reason="cuda_error"}} {failures}
# TYPE inferd_engine_tunable gauge
inferd_engine_tunable{{param="max_num_seqs"}} 64.0
inferd_engine_tunable{{param="swap_space_bytes"}} {4 << 30}
# TYPE inferd_engine_mode gauge
inferd_engine_mode{{mode="fast"}} 1.0
inferd_engine_mode{{mode="fallback"}} 0.0
"""


def agent_metrics(sm: float = 0.3, dram: float = 0.7) -> str:
    lines = ["# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"]
    lines += [f'DCGM_FI_PROF_SM_ACTIVE{{gpu="{i}"}} {sm}' for i in range(8)]
    lines += ["# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge"]
    lines += [f'DCGM_FI_PROF_DRAM_ACTIVE{{gpu="{i}"}} {dram}' for i in range(8)]
    return "\n".join(lines) + "\n"


# A Prometheus answer: expr -> [(labels, value_at(t, start, end))]; an expression not
# listed answers an empty matrix, as Prometheus does for absent series.
Answers = dict[str, list[tuple[dict[str, str], Callable[[float, float, float], float]]]]


class FakeHttp:
    """A loopback HTTP server: fixed bodies by path, and /api/v1/query_range from `answers`."""

    def __init__(self, routes: dict[str, tuple[int, str, str]] | None = None, answers: Answers | None = None):
        self.routes = routes or {}
        self.answers = answers or {}
        self.queries: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/api/v1/query_range":
                    params = dict(urllib.parse.parse_qsl(url.query))
                    fake.queries.append(params["query"])
                    body = json.dumps(fake.matrix(params))
                    self._send(200, "application/json", body)
                elif url.path in fake.routes:
                    self._send(*fake.routes[url.path])
                else:
                    self._send(404, "text/plain", "not found")

            def _send(self, status: int, content_type: str, body: str):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def matrix(self, params: dict[str, str]) -> dict:
        start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
        times = [start + i * step for i in range(int(math.floor((end - start) / step)) + 1)]
        expr = params["query"]
        if expr == "vector(1)":
            series = [({}, lambda t, s, e: 1.0)]
        else:
            series = self.answers.get(expr, [])
        result = [{"metric": labels, "values": [[t, str(fn(t, start, end))] for t in times]} for labels, fn in series]
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHttp:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def engine_server(metrics: str | None = None, config: dict | None = None, max_model_len: int = 4096) -> FakeHttp:
    models = {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": max_model_len}]}
    return FakeHttp(
        {
            "/metrics": (200, "text/plain; version=0.0.4", metrics if metrics is not None else engine_metrics()),
            "/v1/models": (200, "application/json", json.dumps(models)),
            "/admin/config": (200, "application/json", json.dumps(config if config is not None else ENGINE_CONFIG)),
        }
    )


def agent_server(metrics: str | None = None) -> FakeHttp:
    return FakeHttp(
        {"/metrics": (200, "text/plain; version=0.0.4", metrics if metrics is not None else agent_metrics())}
    )
