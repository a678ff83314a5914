"""`inferd` command line.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Only the chosen subcommand's module is imported, so
`inferd topo` never pays for importing torch.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "make-model": ("engine.make_model", "write a random Llama-family checkpoint (HF format)"),
    "generate": ("engine.generate_cmd", "generate text offline with the engine"),
    "serve": ("engine.server.cli", "run the OpenAI-compatible engine server"),
    "bench": ("engine.bench.cli", "benchmarks: throughput, serve"),
    "agent": ("agent.main", "run the node agent (collectors, /metrics, engine supervision)"),
    "topo": ("agent.topo_cmd", "print GPU / PCIe / NUMA topology"),
    "gpu": ("exporters.gpu_cmd", "GPU tools: record an NVML snapshot sequence"),
    "stack": ("agent.stack", "start/stop agent, Prometheus and Alertmanager without Docker"),
    "report": ("agent.report", "write a static HTML report from Prometheus"),
}


def _top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: inferd COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "`inferd COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"inferd: unknown command {name!r}\n\n{_top_help()}", file=sys.stderr)
        return 2
    module_name, desc = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"inferd: command {name!r} is not available in this build ({exc})", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"inferd {name}", description=desc)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
