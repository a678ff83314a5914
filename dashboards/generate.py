"""Write every board's JSON to dashboards/generated/, or with --check fail when it differs.

python -m inferd.dashboards.generate           # rewrite the committed JSON
python -m inferd.dashboards.generate --check   # exit 1 and name the files that drifted
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .boards import BOARDS
from .common import REMEDIATION_ANNOTATIONS
from .render import build, to_json

GENERATED_DIR = Path(__file__).resolve().parent / "generated"


def render_all() -> dict[str, str]:
    """File name -> JSON text for every board."""
    files = {}
    for board in BOARDS:
        links = tuple((other.title, other.uid) for other in BOARDS if other.uid != board.uid)
        annotations = REMEDIATION_ANNOTATIONS if board.remediation_annotations else ()
        files[f"{board.uid}.json"] = to_json(build(board, annotations, links))
    return files


def drifted(directory: Path = GENERATED_DIR) -> list[str]:
    """Names of generated files that are missing, stale, or no longer generated."""
    expected = render_all()
    problems = [
        name
        for name, text in expected.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]
    problems += [p.name for p in directory.glob("*.json") if p.name not in expected]
    return sorted(problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the committed JSON differs")
    parser.add_argument(
        "--out", type=Path, default=GENERATED_DIR, help="output directory (default dashboards/generated)"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = drifted(args.out)
        for name in problems:
            print(
                f"{args.out / name}: differs from what dashboards/ generates; run python -m inferd.dashboards.generate",
                file=sys.stderr,
            )
        return 1 if problems else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (args.out / name).write_text(text)
    for stale in args.out.glob("*.json"):
        if stale.name not in render_all():
            stale.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
