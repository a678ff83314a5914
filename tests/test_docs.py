"""The repository's Markdown: BENCHMARKS.md stays short, no document speaks of how the
project was developed, and every link resolves. Fast and offline: external links are
checked for form only, never fetched.

The checkers are plain functions over text and paths, unit-tested on tmp_path trees
below, so each check is seen to fail on a broken input before it passes on the repo.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MAX_LINES = 250

# Words that belong to the project's history (git has it), not to a user document: a
# work session, a numbered device call, an issue or pull-request number. "session" is
# allowed after a qualifier that makes it a technical term ("HTTP session").
_TECHNICAL_SESSION = r"(?<!http )(?<!https )(?<!tls )(?<!ssl )(?<!ssh )(?<!tmux )(?<!login )(?<!browser )(?<!client )"
HISTORY_PATTERNS = {
    "session": re.compile(_TECHNICAL_SESSION + r"\bsessions?\b", re.IGNORECASE),
    "call N": re.compile(r"\bcalls? \d+\b", re.IGNORECASE),
    "issue N": re.compile(r"\b(?:issues?|pull requests?|PRs?) #?\d+\b", re.IGNORECASE),
}


# --- helpers ---------------------------------------------------------------------------


def tracked_markdown(root: Path = ROOT) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=root, capture_output=True, check=True)
    names = [n for n in out.stdout.decode().split("\0") if n]
    return [root / n for n in names if (root / n).is_file()]  # a file deleted in the work tree is not checked


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def strip_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (lines kept)."""
    lines, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            lines.append("")
            continue
        if m:
            fence = m.group(1)
            lines.append("")
            continue
        lines.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line))
    return "\n".join(lines)


def history_words(text: str) -> list[tuple[int, str, str]]:
    """(line number, pattern name, matched text) of every history word."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern in HISTORY_PATTERNS.items():
            hits += [(number, name, m.group(0)) for m in pattern.finditer(line)]
    return hits


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation
    other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1", r"\2", text)  # emphasis
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text, with GitHub's -1, -2 for repeats, plus
    explicit `<a name=...>` / `id=...` anchors."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    lines = strip_code(text).splitlines()
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        heading = m.group(2) if m else None
        if (
            heading is None
            and i > 0
            and lines[i - 1].strip()
            and _SETEXT.match(line)
            and not _HEADING.match(lines[i - 1])
        ):
            if not lines[i - 1].lstrip().startswith(("|", "-", "*", ">")):
                heading = lines[i - 1].strip()
        if heading is None:
            continue
        slug = github_slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return out


_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)]*)\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
_AUTOLINK = re.compile(r"<(https?://[^>]*)>")


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image, reference definition and
    autolink outside code."""
    body = strip_code(text)
    found = []
    for pattern in (_INLINE_LINK, _REF_DEF, _AUTOLINK):
        for m in pattern.finditer(body):
            found.append((body.count("\n", 0, m.start()) + 1, _target(m.group(1))))
    return sorted(found)


def _target(inner: str) -> str:
    """The destination of `[text](inner)`: `<...>` or the text before an optional
    "title"; anything else after a space is kept, so the checker reports it."""
    inner = inner.strip()
    if inner.startswith("<") and ">" in inner:
        return inner[1 : inner.index(">")]
    m = re.fullmatch(r"(\S*)\s+(\"[^\"]*\"|'[^']*')", inner)
    return m.group(1) if m else inner


def is_well_formed_url(url: str) -> bool:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return (
        parts.scheme in ("http", "https")
        and bool(host)
        and not re.search(r"\s", url)
        and re.fullmatch(r"[A-Za-z0-9.-]+", host) is not None
        and ".." not in host
        and (host == "localhost" or "." in host)
    )


def broken_links(path: Path, root: Path) -> list[str]:
    """Problems with the links of one Markdown file, as 'file:line: target: why'."""
    text = path.read_text(encoding="utf-8")
    problems = []
    rel = path.relative_to(root)
    for line, target in links(text):

        def bad(why: str, line: int = line, target: str = target) -> None:
            problems.append(f"{rel}:{line}: {target}: {why}")

        if not target:
            bad("empty link")
            continue
        if re.search(r"\s", target):
            bad("space in the link target")
            continue
        scheme = urlsplit(target).scheme
        if scheme in ("http", "https"):
            if not is_well_formed_url(target):
                bad("malformed URL")
            continue
        if scheme == "mailto":
            continue
        if scheme:
            bad(f"unsupported scheme {scheme!r}")
            continue
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        if file_part:
            dest = (root / file_part.lstrip("/")) if file_part.startswith("/") else (path.parent / file_part)
            dest = dest.resolve()
            if root.resolve() not in (dest, *dest.parents):
                bad("points outside the repository")
                continue
            if not dest.exists():
                bad("no such file")
                continue
        else:
            dest = path
        if anchor:
            if dest.is_file() and dest.suffix.lower() == ".md":
                if unquote(anchor).lower() not in anchors(dest.read_text(encoding="utf-8")):
                    bad(
                        f"no heading for #{anchor} in {dest.relative_to(root.resolve()) if dest != path else 'this file'}"
                    )
            elif not dest.is_file() or dest.suffix.lower() != ".md":
                pass  # anchors into code files (GitHub line anchors like #L10) are not checked
    return problems


# --- the repository ----------------------------------------------------------------------


def too_long(path: Path, max_lines: int = BENCHMARKS_MAX_LINES) -> str | None:
    n = len(path.read_text(encoding="utf-8").splitlines())
    return f"{path.name} has {n} lines (at most {max_lines})" if n > max_lines else None


def test_benchmarks_md_is_short():
    problem = too_long(ROOT / "BENCHMARKS.md")
    assert problem is None, problem


def test_markdown_has_no_history_words():
    problems = [
        f"{p.relative_to(ROOT)}:{line}: {word!r} ({name})"
        for p in tracked_markdown()
        for line, name, word in history_words(p.read_text(encoding="utf-8"))
    ]
    assert not problems, "history belongs in git, not in the documents:\n" + "\n".join(problems)


def test_markdown_links_resolve():
    problems = [problem for p in tracked_markdown() for problem in broken_links(p, ROOT)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_there_is_markdown_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in tracked_markdown()}
    assert {"README.md", "BENCHMARKS.md"} <= names


# --- the checkers themselves -------------------------------------------------------------


def test_long_benchmarks_file_fails(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("x\n" * BENCHMARKS_MAX_LINES)
    assert too_long(path) is None
    path.write_text("x\n" * (BENCHMARKS_MAX_LINES + 1))
    assert f"{BENCHMARKS_MAX_LINES + 1} lines" in too_long(path)


# Each pattern's term, in the spellings and cases a document would use, with a number after it.
HISTORY_TERMS = ["session", "SESSIONS", "call", "calls", "issue", "issue #", "PR", "pull request #"]


@pytest.mark.parametrize("term", HISTORY_TERMS)
def test_history_words_found(term):
    assert history_words(f"the figure from {term}{'' if term.endswith('#') else ' '}4")


@pytest.mark.parametrize(
    "text",
    [
        "an HTTP session per client",
        "the TLS session cache",
        "ssh session",
        "the call returns 4 values",
        "recalls 3 times",
        "nonsession",
        "issues with 4 GPUs",
        "session_id",
        "`ClientSession`",
    ],
)
def test_history_words_not_found(text):
    assert not history_words(text)


@pytest.mark.parametrize(
    "heading, slug",
    [
        ("How to read these", "how-to-read-these"),
        ("Server against the offline engine (burst)", "server-against-the-offline-engine-burst"),
        ("`inferd stack up/down` and `inferd report`", "inferd-stack-updown-and-inferd-report"),
        ("GPU decode: batch-1, H200", "gpu-decode-batch-1-h200"),
        ("Hot/cold KV & swap", "hotcold-kv--swap"),
        ("The **engine** step", "the-engine-step"),
        ("snake_case names", "snake_case-names"),
        ("A [link](x.md) here", "a-link-here"),
    ],
)
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_anchors_number_repeats_and_skip_code():
    text = "# Intro\n## Intro\n```\n# not a heading\n```\nTitle\n=====\n"
    assert anchors(text) == {"intro", "intro-1", "title"}


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "OTHER.md").write_text("# Other doc\n\n## Part two\n")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "x.py").write_text("")
    return tmp_path


def test_good_links_pass(tmp_path):
    root = _tree(tmp_path)
    (root / "README.md").write_text(
        "# Top\n\n## Usage\n\nSee [other](docs/OTHER.md), [part](docs/OTHER.md#part-two), [up](#usage),\n"
        "[code](engine/x.py#L3), [dir](engine/), [abs](/docs/OTHER.md), [web](https://example.com/a?b=c#d),\n"
        "<https://prometheus.io/docs/>, ![img](docs/OTHER.md), `[not](a-link.md)`,\n\n"
        "```\n[also not](missing.md)\n```\n\n[ref]: docs/OTHER.md\n"
    )
    (root / "docs" / "BACK.md").write_text("[back](../README.md#top)\n")
    assert broken_links(root / "README.md", root) == []
    assert broken_links(root / "docs" / "BACK.md", root) == []


@pytest.mark.parametrize(
    "link, why",
    [
        ("[gone](docs/GONE.md)", "no such file"),
        ("[gone](docs/benchmarks/run.log)", "no such file"),
        ("[anchor](docs/OTHER.md#part-three)", "no heading"),
        ("[self](#nowhere)", "no heading"),
        ("[web](https:/example.com)", "malformed URL"),
        ("[web](http://exa mple.com)", "space in the link target"),
        ("[web](https://)", "malformed URL"),
        ("[web](ftp://example.com/x)", "unsupported scheme"),
        ("[empty]()", "empty link"),
        ("[out](../../etc/passwd)", "outside the repository"),
        ("[ref]: docs/NOPE.md", "no such file"),
    ],
)
def test_broken_links_fail(tmp_path, link, why):
    root = _tree(tmp_path)
    (root / "README.md").write_text(f"# Top\n\n{link}\n")
    problems = broken_links(root / "README.md", root)
    assert problems and why in problems[0], problems
