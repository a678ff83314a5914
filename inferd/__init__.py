"""inferd: a per-node agent for GPU inference servers and its paged-KV inference engine.

The repository keeps the design's top-level folders (engine/, agent/, exporters/,
dashboards/, ebpf/); they are installed, and imported, as subpackages of this one:
`from inferd.engine import LLM`, `python -m inferd.agent.cli`. In a source checkout
inferd/<name> is a link to ../<name>.
"""

__version__ = "0.1.0"
