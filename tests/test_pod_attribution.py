"""Pod attribution: GPU series labelled from the kubelet's pod-resources API, eBPF
per-process series through the cgroup path.

No kubelet runs here: a real gRPC server on a unix socket answers PodResourcesLister/List
with the recorded response in tests/fixtures/kubelet/ (the wire format is the kubelet's:
the same method path and protobuf messages), and the agent's client reads it as it would
read /var/lib/kubelet/pod-resources/kubelet.sock.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families
from test_agent import EIGHT_GPUS, Agent, free_port
from test_ebpf import FakeProbe, _exposition

from inferd.exporters import pod_resources_api as api
from inferd.exporters.cgroup_pods import PodCgroup, ProcessPods, parse_cgroup_path, parse_proc_cgroup
from inferd.exporters.ebpf_numa import EbpfNumaCollector
from inferd.exporters.gpu import GpuCollector
from inferd.exporters.gpu_replay import ReplayBackend
from inferd.exporters.pod_resources import (
    KUBELET_SOCKET,
    PodRef,
    PodResources,
    PodResourcesClient,
    device_key,
    gpu_owners,
    socket_from_args,
)

from fixture_trees import FIXTURES, write_host

RECORDED = FIXTURES / "kubelet" / "pod-resources-gpu-node-8x.json"
CGROUPS = yaml.safe_load((FIXTURES / "kubelet" / "cgroups.yaml").read_text())
UUID = "GPU-60c8ee88-55ef-5794-5ee9-5e53be946e3{}".format
ENGINE_A = PodRef("inferd", "inferd-engine-7d9c6b5f4-8xq2m", "engine")
ENGINE_B = PodRef("inferd", "inferd-engine-7d9c6b5f4-w9hvd", "engine")
NOTEBOOK_0 = PodRef("research", "notebook-0", "jupyter")
# GPU index -> (pod, namespace, container) on the fixture node; "" where no pod holds it
EXPECTED = {
    0: ENGINE_A.labels,
    1: ENGINE_A.labels,
    2: ("", "", ""),
    3: ("", "", ""),
    4: ENGINE_B.labels,
    5: ("", "", ""),
    6: NOTEBOOK_0.labels,
    7: ("", "", ""),  # only a MIG slice of it is given out; whole-GPU series stay unlabelled
}


def recorded_response():
    return json_format.ParseDict(json.loads(RECORDED.read_text())["response"], api.ListPodResourcesResponse())


class Kubelet:
    """A gRPC server with the kubelet's PodResourcesLister service, on a unix socket."""

    def __init__(self, socket_path: Path):
        self.socket_path = socket_path
        self.response = recorded_response()
        self.calls = 0
        self.fail_with: grpc.StatusCode | None = None
        self.server = grpc.server(_executor())
        handler = grpc.method_handlers_generic_handler(
            f"{api.PACKAGE}.{api.SERVICE}",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=api.ListPodResourcesRequest.FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self.server.add_generic_rpc_handlers((handler,))
        assert self.server.add_insecure_port(f"unix://{socket_path}")
        self.server.start()

    def _list(self, request, context):
        self.calls += 1
        if self.fail_with is not None:
            context.abort(self.fail_with, "kubelet is restarting")
        return self.response

    def stop(self) -> None:
        self.server.stop(grace=None)


def _executor():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=2)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # a unix socket path must fit in 108 bytes; pytest's tmp_path may not
    path = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(short_dir) -> Iterator[Kubelet]:
    server = Kubelet(short_dir / "kubelet.sock")
    yield server
    server.stop()


def pod_resources(path: Path, max_age_s: float = 0.0) -> PodResources:
    return PodResources(PodResourcesClient(path, timeout_s=5.0), max_age_s=max_age_s)


def by_family(collector) -> dict[str, list]:
    return {metric.name: metric.samples for metric in collector.collect()}


def pod_of(sample) -> tuple[str, str, str]:
    return (sample.labels["pod"], sample.labels["namespace"], sample.labels["container"])


# ---- the kubelet's answer -------------------------------------------------------------


def test_recorded_response_maps_gpu_uuids_to_their_containers():
    owners = gpu_owners(recorded_response())
    assert owners == {
        UUID(0): ENGINE_A,
        UUID(1): ENGINE_A,
        UUID(4): ENGINE_B,
        UUID(6): NOTEBOOK_0,  # three time-slicing replicas, two pods: the first in order
    }


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        (UUID(3), UUID(3)),
        (f"{UUID(3)}::7", UUID(3)),
        ("nvidia3", "nvidia3"),
        ("MIG-1f2e3d4c-5b6a-5978-8a9b-0c1d2e3f4a5b", None),
        ("", None),
    ],
)
def test_device_ids_name_the_whole_gpu(device_id, key):
    assert device_key(device_id) == key


def test_device_names_from_other_plugins_map_to_the_gpu_device_label(kubelet):
    kubelet.response = api.ListPodResourcesResponse()
    pod = kubelet.response.pod_resources.add(name="trainer-0", namespace="ml")
    pod.containers.add(name="main").devices.add(resource_name="nvidia.com/gpu", device_ids=["nvidia5"])
    got = by_family(GpuCollector(ReplayBackend(EIGHT_GPUS), pods=pod_resources(kubelet.socket_path)))
    labelled = {s.labels["gpu"]: pod_of(s) for s in got["DCGM_FI_DEV_GPU_TEMP"] if s.labels["pod"]}
    assert labelled == {"5": ("trainer-0", "ml", "main")}


# ---- GPU series ------------------------------------------------------------------------


def test_gpu_series_carry_pod_namespace_container_from_the_kubelet(kubelet):
    got = by_family(GpuCollector(ReplayBackend(EIGHT_GPUS), pods=pod_resources(kubelet.socket_path)))
    assert kubelet.calls == 1  # one List per scrape, shared by every family
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"):
        assert {int(s.labels["gpu"]): pod_of(s) for s in got[name]} == EXPECTED, name
    replays = {int(s.labels["gpu"]): pod_of(s) for s in got["inferd_pcie_replay"] if s.name.endswith("_total")}
    assert replays == EXPECTED
    assert [s.value for s in got["inferd_pod_resources_up"]] == [1.0]


def test_a_later_scrape_follows_the_kubelet(kubelet):
    collector = GpuCollector(ReplayBackend(EIGHT_GPUS), pods=pod_resources(kubelet.socket_path))
    by_family(collector)
    del kubelet.response.pod_resources[2]  # engine A's pod is gone
    got = by_family(collector)
    assert {int(s.labels["gpu"]): s.labels["pod"] for s in got["DCGM_FI_DEV_GPU_TEMP"]}[0] == ""


def test_kubelet_errors_leave_gpu_series_unlabelled_and_say_so(kubelet, caplog):
    kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
    collector = GpuCollector(ReplayBackend(EIGHT_GPUS), pods=pod_resources(kubelet.socket_path))
    with caplog.at_level("WARNING"):
        got = by_family(collector)
    assert {pod_of(s) for s in got["DCGM_FI_DEV_GPU_TEMP"]} == {("", "", "")}
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 8
    assert [s.value for s in got["inferd_pod_resources_up"]] == [0.0]
    assert "UNAVAILABLE" in caplog.text and str(kubelet.socket_path) in caplog.text
    kubelet.fail_with = None
    assert [s.value for s in by_family(collector)["inferd_pod_resources_up"]] == [1.0]


def test_no_socket_at_all_is_a_down_kubelet_not_a_failed_scrape(short_dir):
    got = by_family(GpuCollector(ReplayBackend(EIGHT_GPUS), pods=pod_resources(short_dir / "absent.sock")))
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 8
    assert [s.value for s in got["inferd_pod_resources_up"]] == [0.0]


def test_outside_kubernetes_no_pod_labels_and_no_kubelet_family():
    got = by_family(GpuCollector(ReplayBackend(EIGHT_GPUS)))
    assert "inferd_pod_resources_up" not in got
    assert not any("pod" in s.labels for samples in got.values() for s in samples)
    assert socket_from_args(argparse.Namespace()) is None
    assert socket_from_args(argparse.Namespace(kubernetes=False, pod_resources_socket=None)) is None
    assert socket_from_args(argparse.Namespace(kubernetes=True, pod_resources_socket=None)) == KUBELET_SOCKET
    assert socket_from_args(argparse.Namespace(pod_resources_socket=Path("/x.sock"))) == Path("/x.sock")


def test_one_answer_is_shared_within_its_max_age(kubelet):
    now = [100.0]
    resources = PodResources(PodResourcesClient(kubelet.socket_path), max_age_s=1.0, clock=lambda: now[0])
    assert resources.owner_of(UUID(0)) == ENGINE_A
    assert resources.owner_of(UUID(4)) == ENGINE_B
    assert kubelet.calls == 1
    now[0] += 1.0
    assert resources.owner_of("GPU-unknown", "nvidia9") is None
    assert kubelet.calls == 2


def test_agent_with_pod_resources_socket_labels_its_gpu_series(kubelet, tmp_path):
    host = write_host(tmp_path / "host")
    agent = Agent(
        "--no-engine",
        "--gpu-backend",
        f"replay:{EIGHT_GPUS}",
        "--sysfs-root",
        str(host.sysfs),
        "--procfs-root",
        str(host.procfs),
        "--audit-log",
        str(tmp_path / "audit.jsonl"),
        "--prometheus-url",
        f"http://127.0.0.1:{free_port()}",
        "--pod-resources-socket",
        str(kubelet.socket_path),
    )
    try:
        agent.wait_ready()
        text = agent.metrics()
    finally:
        assert agent.stop() == 0
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    temps = families["DCGM_FI_DEV_GPU_TEMP"]
    got = {int(s.labels["gpu"]): pod_of(s) for s in temps}
    assert got == EXPECTED
    assert all("Hostname" in s.labels for s in temps)
    assert [s.value for s in families["inferd_pod_resources_up"]] == [1.0]


# ---- cgroup paths ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CGROUPS))
def test_proc_cgroup_names_the_pod_and_container(name):
    case = CGROUPS[name]
    got = parse_proc_cgroup(case["text"])
    if case["uid"] is None:
        assert got is None
    else:
        assert got == PodCgroup(case["uid"], case["container_id"])


def test_cgroup_paths_outside_kubepods_or_malformed_name_no_pod():
    assert parse_cgroup_path("/kubepods/burstable") is None
    assert parse_cgroup_path("/kubepods/burstable/podnot-a-uid/abc") is None
    assert parse_cgroup_path("/docker/0d3f4c2b9a8e") is None
    with pytest.raises(ValueError, match="dashed UUID"):
        PodCgroup("4e3c9a3e_7b9f_4d6b_9a55_2f1c8e0d7a61")


# ---- eBPF per-process series -----------------------------------------------------------

ENGINE_CGROUP = (
    "0::/kubepods.slice/kubepods-pod9b1d5e7a_3c2f_4a8b_b6d4_1e0f2a3b4c5d.slice/"
    "cri-containerd-3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b.scope\n"
)


def write_procfs(root: Path, engine_cgroup: str = ENGINE_CGROUP) -> Path:
    """A host /proc: the engine (pid 4242, holding GPUs 0 and 1 open) and its tokenizer
    (4250, same container, no GPU) in engine A's pod; a host process (77); the driver's
    GPU information files that map device minors to UUIDs."""
    processes = {
        4242: ("engine", engine_cgroup, [0, 1]),
        4250: ("tokenizer", engine_cgroup, []),
        77: ("tokenizer", "0::/system.slice/containerd.service\n", []),
    }
    for pid, (comm, cgroup, minors) in processes.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "cgroup").write_text(cgroup)
        (root / str(pid) / "fd" / "0").symlink_to("/dev/null")
        for fd, minor in enumerate(minors, start=3):
            (root / str(pid) / "fd" / str(fd)).symlink_to(f"/dev/nvidia{minor}")
        (root / str(pid) / "fd" / "9").symlink_to("/dev/nvidiactl")
    for minor, address in enumerate(["0000:03:00.0", "0000:04:00.0"]):
        info = root / "driver/nvidia/gpus" / address / "information"
        info.parent.mkdir(parents=True)
        info.write_text(
            f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t {UUID(minor)}\n"
            f"Video BIOS: \t 96.00.9f.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"Bus Location: \t {address}\nDevice Minor: \t {minor}\n"
        )
    (root / "sys/kernel").mkdir(parents=True)
    (root / "sys/kernel/numa_balancing").write_text("1\n")
    return root


def ebpf_collector(proc: Path, kubelet: Kubelet | None) -> EbpfNumaCollector:
    process_pods = ProcessPods(proc, pod_resources(kubelet.socket_path)) if kubelet is not None else None
    collector = EbpfNumaCollector(
        procfs_root=proc, watch_pids_fn=lambda: 4242, watch_comms=["tokenizer"], process_pods=process_pods
    )
    collector._started = True  # as if start() had loaded the probes below
    collector._probes = {
        "page_allocs": FakeProbe({(0, 0, 0): 100, (4242, 0, 0): 50, (4250, 1, 1): 5, (77, 0, 0): 3}),
        "numa_hint_faults": FakeProbe({(4242, 1): 2}),
        "page_migrations": FakeProbe({(3,): 12}, is_per_process=False),
        "task_numa_moves": FakeProbe({(4242, 1): 4}),
        "page_faults": FakeProbe({(0,): 1000, (4242,): 60, (77,): 6}),
    }
    collector._migration_reasons = {3: "syscall_or_cpuset"}
    return collector


def ebpf_samples(collector) -> dict[tuple[str, frozenset], float]:
    text = "\n".join(_exposition(collector)) + "\n"
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def key(name: str, **labels: str) -> tuple[str, frozenset]:
    return (name, frozenset(labels.items()))


IN_PODS = sorted(name for name, case in CGROUPS.items() if case["container_id"])


@pytest.mark.parametrize("cgroup", IN_PODS)
def test_ebpf_series_of_pod_processes_carry_the_pod(kubelet, tmp_path, cgroup):
    """The same node under each cgroup driver and version: the engine's container found
    through its cgroup path, named by the kubelet's answer for the GPUs it holds."""
    proc = write_procfs(tmp_path / "proc", CGROUPS[cgroup]["text"])
    got = ebpf_samples(ebpf_collector(proc, kubelet))
    engine = {"pod": "inferd-engine-7d9c6b5f4-8xq2m", "namespace": "inferd", "container": "engine"}
    none = {"pod": "", "namespace": "", "container": ""}
    expected = {
        key("inferd_ebpf_page_allocs_total", pid="4242", comm="engine", **engine, node="0", locality="local"): 50,
        # the tokenizer holds no GPU; it runs in the engine's container, so it is the engine's pod
        key("inferd_ebpf_page_allocs_total", pid="4250", comm="tokenizer", **engine, node="1", locality="remote"): 5,
        key("inferd_ebpf_numa_hint_faults_total", pid="4242", comm="engine", **engine, locality="remote"): 2,
        key("inferd_ebpf_task_numa_moves_total", pid="4242", comm="engine", **engine, kind="swap"): 4,
        key("inferd_ebpf_page_faults_total", pid="4242", comm="engine", **engine): 60,
        # a host process and the rest of the node: no pod
        key("inferd_ebpf_page_faults_total", pid="77", comm="tokenizer", **none): 6,
        key("inferd_ebpf_page_faults_total", pid="", comm="other", **none): 1000,
        key("inferd_ebpf_page_migrations_total", reason="syscall_or_cpuset"): 12,
    }
    for sample, value in expected.items():
        assert got.get(sample) == value, sample


def test_ebpf_series_lose_the_pod_when_its_container_no_longer_holds_a_gpu(kubelet, tmp_path):
    proc = write_procfs(tmp_path / "proc")
    collector = ebpf_collector(proc, kubelet)
    _exposition(collector)
    for fd in (proc / "4242" / "fd").iterdir():
        if os.readlink(fd).startswith("/dev/nvidia"):
            fd.unlink()
    kubelet.response.ClearField("pod_resources")
    lines = _exposition(collector)
    # remembered for the container while its processes are watched: the id is the same container
    assert any('pid="4242"' in line and 'pod="inferd-engine-7d9c6b5f4-8xq2m"' in line for line in lines)
    assert any('pid="4250"' in line and 'pod="inferd-engine-7d9c6b5f4-8xq2m"' in line for line in lines)
    (proc / "4242" / "cgroup").write_text(ENGINE_CGROUP.replace("3c4d5e6f", "99999999"))
    (proc / "4250" / "cgroup").write_text(ENGINE_CGROUP.replace("3c4d5e6f", "99999999"))
    lines = _exposition(collector)
    assert not any('pod="inferd-engine' in line for line in lines)


def test_ebpf_series_outside_kubernetes_keep_their_labels(tmp_path):
    proc = write_procfs(tmp_path / "proc")
    lines = _exposition(ebpf_collector(proc, None))
    assert 'inferd_ebpf_page_faults_total{comm="engine",pid="4242"} 60.0' in lines
    assert not any("pod=" in line for line in lines)


def test_in_kubernetes_the_probes_watch_the_processes_holding_pod_gpus(kubelet, tmp_path):
    proc = write_procfs(tmp_path / "proc")
    (proc / "5000" / "fd").mkdir(parents=True)  # a host process holding GPU 0: not a pod's
    (proc / "5000" / "cgroup").write_text("0::/system.slice/nvidia-persistenced.service\n")
    (proc / "5000" / "fd" / "3").symlink_to("/dev/nvidia0")
    process_pods = ProcessPods(proc, pod_resources(kubelet.socket_path))
    assert process_pods.gpu_pids() == [4242]
    kubelet.response.ClearField("pod_resources")  # the kubelet gave that GPU to no one
    assert process_pods.gpu_pids() == []
