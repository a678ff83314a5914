"""Placement: which NUMA node should the engine's threads and host buffers live on.

Each (GPU, NUMA node) choice is scored by how fast host memory on that node reaches
the GPU:

    score(g, n) = B(g) / (1 + HOP_PENALTY * hops(g)) / cross(g, n)

    B(g)       the path's bottleneck in GB/s: the lowest current link capacity
               (width x per-lane rate of the generation, after encoding) between the
               GPU and its root port, so a link trained at x8 halves it;
    hops(g)    bridges between the GPU and the root complex (each adds latency and a
               point where traffic from other devices merges); HOP_PENALTY = 0.1;
    cross(g,n) 1 when n is the GPU's own node; otherwise the SLIT distance ratio
               distance(node(g), n) / distance(n, n) from sysfs (21 / 10 = 2.1 on a
               typical two-socket host), or CROSS_SOCKET_PENALTY = 2.0 when the
               kernel gives no distances. When the GPU's node is unknown every node
               gets cross = 1 and the lowest node id wins the tie.

The best node for a GPU maximises its score; for a set of GPUs (the engine's), the
node with the highest summed score.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd.agent.topology import GpuTopology, Topology

HOP_PENALTY = 0.1
CROSS_SOCKET_PENALTY = 2.0


@dataclass(frozen=True, slots=True)
class PlacementScore:
    gpu: int
    node: int
    score: float
    bandwidth_bytes_per_second: float
    num_hops: int
    cross_factor: float

    def to_dict(self) -> dict:
        return {
            "gpu": self.gpu,
            "node": self.node,
            "score": round(self.score, 6),
            "bandwidth_bytes_per_second": int(round(self.bandwidth_bytes_per_second)),
            "num_hops": self.num_hops,
            "cross_factor": round(self.cross_factor, 6),
        }


def cross_factor(topology: Topology, gpu: GpuTopology, node: int) -> float:
    if gpu.numa_node is None or gpu.numa_node == node:
        return 1.0
    target = topology.node(node)
    if target is not None:
        remote = target.distances.get(gpu.numa_node)
        local = target.distances.get(node)
        if remote and local:
            return remote / local
    return CROSS_SOCKET_PENALTY


def score(topology: Topology, gpu: GpuTopology, node: int) -> PlacementScore:
    bandwidth = gpu.bottleneck_bytes_per_second or 0.0
    cross = cross_factor(topology, gpu, node)
    value = bandwidth / 1e9 / (1 + HOP_PENALTY * gpu.num_hops) / cross
    return PlacementScore(gpu.index, node, value, bandwidth, gpu.num_hops, cross)


def score_all(topology: Topology) -> list[PlacementScore]:
    """Every GPU x node score, in GPU then node order."""
    return [score(topology, gpu, node.node) for gpu in topology.gpus for node in topology.nodes]


def best_node_per_gpu(topology: Topology) -> dict[int, int | None]:
    best: dict[int, int | None] = {}
    for gpu in topology.gpus:
        scores = [score(topology, gpu, node.node) for node in topology.nodes]
        # max() keeps the first of equal scores, so ties go to the lowest node id
        best[gpu.index] = max(scores, key=lambda s: s.score).node if scores else None
    return best


def best_node_for_gpus(topology: Topology, gpu_indices: list[int] | None = None) -> int | None:
    """The node with the highest summed score over the given GPUs (all when None)."""
    chosen = [g for g in topology.gpus if gpu_indices is None or g.index in gpu_indices]
    if gpu_indices is not None:
        unknown = sorted(set(gpu_indices) - {g.index for g in chosen})
        if unknown:
            raise ValueError(f"no GPU with index {unknown} (have {[g.index for g in topology.gpus]})")
    if not topology.nodes or not chosen:
        return None
    totals = {node.node: sum(score(topology, g, node.node).score for g in chosen) for node in topology.nodes}
    return max(totals, key=lambda n: totals[n])
