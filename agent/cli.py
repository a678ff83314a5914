"""`inferd` command line.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Only the chosen subcommand's module is imported, so
`inferd topo` never pays for importing torch.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import sys

# name -> (module, one-line help). A command with subcommands names every one of them
# here (tests/test_cli_help.py checks it against the parser).
COMMANDS: dict[str, tuple[str, str]] = {
    "make-model": ("inferd.engine.model.make_model", "write a random Llama-family checkpoint (HF format)"),
    "generate": ("inferd.engine.generate_cmd", "generate text offline with the engine"),
    "serve": ("inferd.engine.server.cli", "run the OpenAI-compatible engine server"),
    "bench": (
        "inferd.agent.scenario.bench_cmd",
        "benchmarks: serve, burst, throughput, tp-decode, gpu-decode, scenario",
    ),
    "agent": ("inferd.agent.main", "run the node agent (collectors, /metrics, engine supervision)"),
    "topo": ("inferd.agent.topo_cmd", "print GPU / PCIe / NUMA topology"),
    "doctor": ("inferd.agent.doctor.cli", "diagnose this node: ranked findings with evidence and the fix"),
    "gpu": ("inferd.exporters.gpu_cmd", "GPU tools: record (NVML snapshots for the replay back end)"),
    "stack": ("inferd.agent.stack", "the stack without Docker: up, down, status, token, default-model"),
    "report": ("inferd.agent.report", "write a static HTML report from Prometheus"),
}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter, worded for people: every option's help
    ends with its default unless the help already says it; an unset default reads
    `none`; on/off flags (off unless given) and positionals are left as they are."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and action.nargs != 0:
            action = copy.copy(action)  # argparse prints no help at all for an option without one
            action.help = f"default: {_shown(action.default)}"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").strip()
        if (
            "default" in text.lower()
            or action.default is argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: {_shown(action.default)})"


def _shown(default) -> str:
    return "none" if default in (None, "", [], ()) else "%(default)s"


def use_defaults_formatter(parser: argparse.ArgumentParser) -> None:
    """Give the parser and every subcommand parser under it DefaultsHelpFormatter."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                use_defaults_formatter(child)


def _top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: inferd COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "`inferd COMMAND --help` for a command's options."]
    return "\n".join(lines)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one command (its module imported); ModuleNotFoundError when the
    module is not in this build."""
    module_name, desc = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"inferd {name}", description=desc, formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--log-level", default="INFO", help="logging level")
    module.add_arguments(parser)
    use_defaults_formatter(parser)
    parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"inferd: unknown command {name!r}\n\n{_top_help()}", file=sys.stderr)
        return 2
    module_name, _ = COMMANDS[name]
    try:
        parser = command_parser(name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"inferd: command {name!r} is not available in this build ({exc})", file=sys.stderr)
            return 2
        raise
    args = parser.parse_args(rest)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
