"""Watch every GPU through the agent's collector while a tensor-parallel engine serves.

Run on a host with two or more GPUs, from the repo root:
    PYTHONPATH=. python scripts/gpu_tp_observe.py --out DIR -- [tp_decode arguments]

Starts `python -m inferd.engine.bench.tp_decode --out DIR/bench ...` as a child and meanwhile
scrapes the real collector (NvmlBackend + the metric families `/metrics` serves) every
--scrape-interval seconds. Afterwards it reports, per GPU, the DCGM-named SM activity,
GPU utilisation, framebuffer use and PCIe byte rates seen while the child ran: the
agent's view of every GPU of a tensor-parallel engine. Writes DIR/observed.json (the
summary and every scrape) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from inferd.exporters.gpu import snapshot_families
from inferd.exporters.gpu_nvml import NvmlBackend
from inferd.exporters.gpu_reading import GpuSnapshot

WATCHED = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_DRAM_ACTIVE",
)


def per_gpu(snapshot: GpuSnapshot) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family in snapshot_families(snapshot):
        for sample in family.samples:
            if sample.name in WATCHED and "gpu" in sample.labels:
                out.setdefault(sample.labels["gpu"], {})[sample.name] = sample.value
    return out


def summarise(scrapes: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    gpus = sorted({g for s in scrapes for g in s["gpus"]})
    summary = {}
    for gpu in gpus:
        summary[gpu] = {}
        for name in WATCHED:
            xs = [s["gpus"][gpu][name] for s in scrapes if name in s["gpus"].get(gpu, {})]
            if xs:
                summary[gpu][name] = {"mean": sum(xs) / len(xs), "max": max(xs), "samples": len(xs)}
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scrape-interval", type=float, default=0.5)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: arguments for engine.bench.tp_decode")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench_args = [a for a in args.bench_args if a != "--"]

    backend = NvmlBackend(gpm_interval_s=args.scrape_interval)
    child = subprocess.Popen(
        [sys.executable, "-m", "inferd.engine.bench.tp_decode", "--out", str(args.out / "bench"), *bench_args],
        env=dict(os.environ),
    )
    scrapes: list[dict] = []
    start = time.monotonic()
    while child.poll() is None:
        snapshot = backend.read()
        scrapes.append({"t": time.monotonic() - start, "gpus": per_gpu(snapshot)})
        time.sleep(args.scrape_interval)
    busy = [s for s in scrapes if any(v.get("DCGM_FI_PROF_SM_ACTIVE", 0) > 0.05 for v in s["gpus"].values())]
    result = {
        "child_returncode": child.returncode,
        "seconds": time.monotonic() - start,
        "scrapes": len(scrapes),
        "busy_scrapes": len(busy),
        "while_busy": summarise(busy),
        "whole_run": summarise(scrapes),
        "all": scrapes,
    }
    (args.out / "observed.json").write_text(json.dumps(result, indent=1))
    print(f"{'gpu':<5}{'SM active mean/max':>22}{'util mean':>11}{'FB used MiB max':>17}{'PCIe tx/rx MB/s max':>22}")
    for gpu, values in result["while_busy"].items():
        sm = values.get("DCGM_FI_PROF_SM_ACTIVE", {})
        util = values.get("DCGM_FI_DEV_GPU_UTIL", {})
        fb = values.get("DCGM_FI_DEV_FB_USED", {})
        tx = values.get("DCGM_FI_PROF_PCIE_TX_BYTES", {}).get("max", 0) / 1e6
        rx = values.get("DCGM_FI_PROF_PCIE_RX_BYTES", {}).get("max", 0) / 1e6
        print(
            f"{gpu:<5}{sm.get('mean', 0):>11.2f}/{sm.get('max', 0):<10.2f}{util.get('mean', 0):>11.1f}"
            f"{fb.get('max', 0):>17.0f}{tx:>11.1f}/{rx:<10.1f}"
        )
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(main())
