"""bcc programs (C text) and their thin Python loaders: kernel NUMA signals per process.

    c/            the BPF programs, compiled by bcc at load time (watched.h is shared)
    probes.py     the five probes: what each compiles and attaches, reading their maps
    node_map.py   frame-range -> node and CPU -> node, read from sysfs (or /proc/zoneinfo)
    tracefs.py    tracepoint formats (enum names) and whether a function can be traced
    watch.py      which processes get their own labels; folding the departed into "other"

The Prometheus collector over them is exporters/ebpf_numa.py. bcc is the distribution's
python3-bpfcc (scripts/link_bcc.sh makes it importable from .venv), never PyPI's `bcc`.
"""
