"""The README's CLI table against the CLI: every command in the table exists and every
command exists in the table; `--help` works for each, and lists every subcommand the
table names, which are exactly the command's subcommands; the top-level help names them
too; every option's help shows its default. Parsed from README.md, so the test fails
when the two drift."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.agent.cli import COMMANDS, _top_help, command_parser, main

ROOT = Path(__file__).resolve().parents[1]
_SUBCOMMANDS = re.compile(r"^[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*$")


def readme_cli_table(text: str) -> dict[str, list[str]]:
    """{command: subcommands named in its row} from the `| command | what |` table under
    the `## CLI` heading."""
    section = text.split("\n## CLI\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `inferd "):
            continue
        span = re.match(r"\| `([^`]+)`", line).group(1).replace("\\|", "|")
        words = span.split()
        assert words[0] == "inferd", line
        subs = words[2].split("|") if len(words) > 2 and _SUBCOMMANDS.match(words[2]) else []
        assert words[1] not in rows, f"{words[1]} has two rows"
        rows[words[1]] = subs
    return rows


def test_the_table_parser_reads_commands_and_subcommands():
    text = (
        "intro\n## CLI\n\n| command | what |\n|---|---|\n"
        "| `inferd make-model DIR --preset tiny\\|small` | x |\n"
        "| `inferd bench serve\\|burst` | y |\n| `inferd gpu record PATH` | z |\n## Metrics\n"
        "| `inferd ignored` | below the section |\n"
    )
    assert readme_cli_table(text) == {"make-model": [], "bench": ["serve", "burst"], "gpu": ["record"]}


TABLE = readme_cli_table((ROOT / "README.md").read_text())


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """A parser's subcommands: its subparsers, or the choices of a positional `action`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
        if not action.option_strings and action.dest == "action" and action.choices:
            return list(action.choices)
    return []


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0, argv
    return capsys.readouterr().out


def test_the_table_lists_every_command_once():
    assert sorted(TABLE) == sorted(COMMANDS)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_command_in_the_table_has_help_that_lists_its_subcommands(name, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["inferd", name, "--help"])  # bench builds only the chosen subcommand's options
    text = help_text([name, "--help"], capsys)
    assert f"usage: inferd {name}" in text
    parser = command_parser(name)
    actual = subcommands(parser)
    assert TABLE[name] == actual, f"README names {TABLE[name]} for `inferd {name}`, the CLI has {actual}"
    top_line = next(line for line in _top_help().splitlines() if line.strip().startswith(name + " "))
    for sub in actual:
        assert re.search(rf"\b{re.escape(sub)}\b", text), f"`inferd {name} --help` does not list {sub}"
        assert re.search(rf"\b{re.escape(sub)}\b", top_line), f"`inferd --help` does not list {name} {sub}"


def _nested(parser: argparse.ArgumentParser, path: list[str]):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _nested(child, [*path, name])


def _every_parser():
    for name in sorted(COMMANDS):
        sys.argv = ["inferd", name]
        yield from _nested(command_parser(name), [name])


def test_every_subcommand_has_help(capsys, monkeypatch):
    for path, _ in _every_parser():
        if len(path) > 1:
            monkeypatch.setattr(sys, "argv", ["inferd", *path, "--help"])
            assert f"usage: inferd {' '.join(path)}" in help_text([*path, "--help"], capsys)


def test_every_option_shows_its_default(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["inferd"])
    missing = []
    for path, parser in _every_parser():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            if action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
                continue  # an on/off flag: off unless given
            if "default" not in formatter._format_action(action).lower():
                missing.append(f"inferd {' '.join(path)} {action.option_strings[0]}")
    assert not missing, "options whose --help does not show the default:\n" + "\n".join(missing)


def test_the_installed_entry_point_prints_the_same_top_level_help():
    result = subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == _top_help()
    for name in COMMANDS:
        assert f"  {name} " in result.stdout


@pytest.mark.parametrize("model", ["/nonexistent", "README.md"])
def test_generate_with_a_bad_model_is_one_line_and_exit_2(model):
    result = subprocess.run(
        [sys.executable, "-m", "inferd.agent.cli", "generate", "--model", model, "hi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"inferd generate: --model {model} ")
