"""engine/model/progress.py: silent for quick work, a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import io

from inferd.engine.model.progress import Progress, note


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quick_work_prints_nothing(monkeypatch):
    monkeypatch.delenv("INFERD_PROGRESS", raising=False)
    out = io.StringIO()
    with Progress(10, "loading", stream=out, delay_s=60) as progress:
        for _ in range(10):
            progress.update()
    assert out.getvalue() == ""


def test_plain_lines_when_not_a_terminal(monkeypatch):
    monkeypatch.delenv("INFERD_PROGRESS", raising=False)
    out = io.StringIO()
    with Progress(4, "loading weights", unit="tensors", stream=out, delay_s=0, interval_s=0) as progress:
        for _ in range(4):
            progress.update()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("loading weights: 1/4 tensors (25%)")
    assert lines[-1].startswith("loading weights: 4/4 tensors, done in ")
    assert "\r" not in out.getvalue()


def test_a_bar_redrawn_in_place_on_a_terminal(monkeypatch):
    monkeypatch.delenv("INFERD_PROGRESS", raising=False)
    out = Terminal()
    with Progress(2, "writing", unit="shards", stream=out, delay_s=0, redraw_s=0) as progress:
        progress.update()
        progress.update()
    text = out.getvalue()
    assert text.startswith("\rwriting [" + "#" * 12 + "." * 12 + "] 1/2 shards")
    assert text.count("\n") == 1 and text.endswith("\n")
    assert "[" + "#" * 24 + "] 2/2 shards" in text


def test_the_environment_turns_it_off_or_always_on(monkeypatch):
    out = io.StringIO()
    monkeypatch.setenv("INFERD_PROGRESS", "0")
    with Progress(1, "x", stream=out, delay_s=0, interval_s=0) as progress:
        progress.update()
    note("phase", stream=out)
    assert out.getvalue() == ""
    monkeypatch.setenv("INFERD_PROGRESS", "1")
    with Progress(1, "x", stream=out, delay_s=60) as progress:
        progress.update()
    assert out.getvalue().startswith("x: 1/1")


def test_a_closed_stream_does_not_stop_the_work(monkeypatch):
    monkeypatch.delenv("INFERD_PROGRESS", raising=False)
    out = io.StringIO()
    out.close()
    with Progress(3, "x", stream=out, delay_s=0, interval_s=0) as progress:
        for _ in range(3):
            progress.update()
    assert progress.count == 3
