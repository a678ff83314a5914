"""Sequence and block state has one writer: the scheduler (engine/scheduling/scheduler.py and its
AsyncScheduler, engine/scheduling/async_scheduler.py), besides the modules that define that state
(engine/request/sequence.py, engine/kv/block_manager.py) and the scheduler's slot table. Everyone
else (the engine, AsyncDecode, the output processor, the runners) asks the scheduler.

import-linter cannot say this (it sees imports, not writes), so every module under
engine/ is parsed with `ast` and these are refused outside the owners:
- an assignment (`=`, `+=`, `del`, an item of it) to a sequence's scheduling state:
  SEQUENCE_STATE below, or its `times.first_scheduled` / `times.finished`, on anything
  but `self`; or a call that changes such a field in place (`seq.block_table.append`);
- a call of a BlockManager mutator (or of the HostResize plan's `commit`);
- a write to the scheduler's own state (`engine.scheduler.step_count += 1`,
  `scheduler.waiting.append(seq)`, `scheduler.slots.release(seq)`).
What a sequence shows its client (its text, logprobs, first/last token times) is the
output processor's and is not checked. The checker is a plain function over source
text, tested below on snippets, so each rule is seen to fail before it passes on the tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engine"

OWNERS = {
    "scheduling/scheduler.py",
    "scheduling/async_scheduler.py",
    "kv/block_manager.py",
    "request/sequence.py",
    "scheduling/slot_table.py",  # the scheduler's slot table: it sets seq.slot for the scheduler
}
EXEMPT = {
    # simulates admission on a BlockManager of its own: no engine, no scheduler, no sequence it shares
    "bench/kv_capacity.py",
}

# What the scheduler decides on: KV progress, block tables, admission bookkeeping and the
# tokens a sequence holds (names no other engine object has: any receiver) ...
SEQUENCE_STATE = {
    "num_computed_tokens",
    "block_table",
    "host_block_table",
    "num_hashed_blocks",
    "block_hashes",
    "num_cold_scanned",
    "needs_recompute_fault",
    "blocked_since_step",
    "output_token_ids",
    "token_counts",
}
# ... and its queue status, preemptions, sampler slot and why it finished: names the server's
# and the benchmarks' own objects use too, so checked on a receiver named as the engine names
# a sequence (`seq`, `item.seq`, `victim`).
SEQUENCE_STATE_BY_NAME = {"status", "num_preemptions", "num_cached_tokens", "slot", "finish_reason", "stop_reason"}
SCHEDULER_TIMES = {"first_scheduled", "finished"}  # of seq.times: set when scheduled and finished
SCHEDULER_STATE = {
    "waiting",
    "running",
    "swapped",
    "step_count",
    "num_preemptions",
    "has_deadlines",
    "slots",
    "block_manager",
    "config",
}
IN_PLACE = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault"}
# Names no other engine object uses: a call is a mutation whatever the receiver.
BLOCK_MUTATORS = {
    "try_allocate",
    "append_slots",
    "commit_full_blocks",
    "cool_blocks",
    "swap_in",
    "swap_out",
    "release_host",
    "append_token",
}
# Names other objects use too (LiveConfig.commit): a mutation when the receiver is a block
# manager or a host-resize plan by its name (`bm`, `...block_manager`, `host_resize`, `plan`).
GENERIC_BLOCK_MUTATORS = {"allocate", "free", "commit"}
BLOCK_RECEIVERS = ("block_manager", "bm", "resize", "plan")
SLOT_MUTATORS = {"acquire", "release"}


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _tail(node: ast.expr) -> str:
    """The last name of a receiver: `bm`, `self.block_manager` -> block_manager."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_sequence(node: ast.expr) -> bool:
    tail = _tail(node).lower()
    return "seq" in tail or tail == "victim"


def _is_sequence_state(receiver: ast.expr, attr: str) -> bool:
    return attr in SEQUENCE_STATE or (attr in SEQUENCE_STATE_BY_NAME and _is_sequence(receiver))


def _is_scheduler(node: ast.expr) -> bool:
    return _tail(node) in ("scheduler", "sched") and not _is_self(node)


def _state_write(target: ast.expr) -> str | None:
    """What an assignment target writes, when it is owned state."""
    while isinstance(target, ast.Subscript):  # seq.block_table[i] = ...
        target = target.value
    if not isinstance(target, ast.Attribute) or _is_self(target.value):
        return None
    if _is_sequence_state(target.value, target.attr):
        return f"sequence state .{target.attr}"
    if target.attr in SCHEDULER_TIMES and _tail(target.value) == "times":
        return f"sequence state .times.{target.attr}"
    if target.attr in SCHEDULER_STATE and _is_scheduler(target.value):
        return f"scheduler state .{target.attr}"
    return None


def _mutating_call(call: ast.Call) -> str | None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    receiver, name = func.value, func.attr
    if name in BLOCK_MUTATORS:
        return f"block/sequence mutator .{name}()"
    if name in GENERIC_BLOCK_MUTATORS and any(r in _tail(receiver).lower() for r in BLOCK_RECEIVERS):
        return f"block manager mutator .{name}()"
    if name in IN_PLACE and isinstance(receiver, ast.Attribute) and not _is_self(receiver.value):
        if _is_sequence_state(receiver.value, receiver.attr):
            return f"in-place change of sequence state .{receiver.attr}.{name}()"
        if receiver.attr in SCHEDULER_STATE and _is_scheduler(receiver.value):
            return f"in-place change of scheduler state .{receiver.attr}.{name}()"
    if name in SLOT_MUTATORS and _tail(receiver) == "slots" and isinstance(receiver, ast.Attribute):
        if _is_scheduler(receiver.value):
            return f"scheduler slot table .{name}()"
    return None


def violations(source: str, path: str = "<snippet>") -> list[str]:
    """`path:line: what` for every write of owned state in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what: str | None = None
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                    what = what or _state_write(part)
        elif isinstance(node, ast.Call):
            what = _mutating_call(node)
        if what:
            found.append(f"{path}:{node.lineno}: {what}")
    return found


def engine_modules() -> list[tuple[str, Path]]:
    return sorted((p.relative_to(ENGINE).as_posix(), p) for p in ENGINE.rglob("*.py"))


def test_only_the_scheduler_and_the_state_modules_write_sequence_and_block_state():
    checked = [(name, path) for name, path in engine_modules() if name not in OWNERS | EXEMPT]
    assert (
        len(checked) > 50 and {"llm_engine.py", "runner/async_decode.py", "output_processor.py"} <= dict(checked).keys()
    )
    found = [v for name, path in checked for v in violations(path.read_text(), f"engine/{name}")]
    assert not found, "only the scheduler changes sequence and block state; ask it instead:\n" + "\n".join(found)


def test_the_owners_and_exemptions_exist():
    names = {name for name, _ in engine_modules()}
    assert OWNERS | EXEMPT <= names


@pytest.mark.parametrize(
    "source, what",
    [
        ("seq.num_computed_tokens += n", "sequence state .num_computed_tokens"),
        ("item.seq.num_computed_tokens -= item.num_tokens", "sequence state .num_computed_tokens"),
        ("seq.status = SequenceStatus.FINISHED", "sequence state .status"),
        ("item.seq.finish_reason = 'stop'", "sequence state .finish_reason"),
        ("victim.num_preemptions += 1", "sequence state .num_preemptions"),
        ("seq.block_table[i] = cold", "sequence state .block_table"),
        ("a, seq.slot = 1, 2", "sequence state .slot"),
        ("del seq.host_block_table", "sequence state .host_block_table"),
        ("seq.times.finished = now", "sequence state .times.finished"),
        ("seq.block_table.append(block)", "in-place change of sequence state .block_table.append()"),
        ("seq.append_token(token)", "block/sequence mutator .append_token()"),
        ("self.block_manager.commit_full_blocks(seq)", "block/sequence mutator .commit_full_blocks()"),
        ("bm.append_slots(r.seq, n)", "block/sequence mutator .append_slots()"),
        ("self.block_manager.free(seq)", "block manager mutator .free()"),
        ("bm.allocate(seq)", "block manager mutator .allocate()"),
        ("host_resize.commit()", "block manager mutator .commit()"),
        ("scheduler.step_count += 1", "scheduler state .step_count"),
        ("self.scheduler.config = new", "scheduler state .config"),
        ("engine.scheduler.waiting.append(seq)", "in-place change of scheduler state .waiting.append()"),
        ("self.scheduler.slots.release(seq)", "scheduler slot table .release()"),
    ],
)
def test_each_kind_of_write_is_found(source, what):
    assert violations(source) == [f"<snippet>:1: {what}"]


@pytest.mark.parametrize(
    "source",
    [
        "self.status = 200",  # an object's own attribute
        "result.status, headers = await read_head(reader)",  # not a sequence
        "counters.num_preemptions += len(out.preempted)",
        "self.num_computed_tokens += 1",
        "self.live_config.commit(new)",  # not a block manager
        "seq.output_text = text",  # what the client sees: the output processor's
        "seq.logprobs.append(lp)",
        "seq.times.first_token = now",
        "n = seq.num_computed_tokens + len(seq.block_table)",  # reads
        "self.scheduler.finish(seq, 'abort', now)",  # asking the scheduler
        "self.scheduler.advance(batch)",
        "pairs = self.scheduler.cool(seqs, window, kind)",
        "self.kv_cache.swap(out.swap_out, out.swap_in)",
    ],
)
def test_reads_own_attributes_and_requests_to_the_scheduler_pass(source):
    assert violations(source) == []
