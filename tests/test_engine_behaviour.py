"""Batch invariance, sampling features, priorities and bad input."""

from __future__ import annotations

import pytest

from inferd.engine import LLM, EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(tiny_model, block_size=8)


def busy_llm(tiny_model, mode):
    probe = LLM(tiny_model, block_size=8)
    bb = probe.engine.block_bytes
    return LLM(
        tiny_model,
        block_size=8,
        kv_cache_bytes=30 * bb,
        swap_space_bytes=40 * bb,
        preemption_mode=mode,
        watermark=0.0,
        max_num_batched_tokens=48,
    )


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_batch_invariance_under_preemption(tiny_model, llm, mode):
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    seeded = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=20, ignore_eos=True)
    prompt = "The scheduler preempts the newest sequence"
    alone = [llm.generate(prompt, p)[0].outputs[0].token_ids for p in (greedy, seeded)]
    busy = busy_llm(tiny_model, mode)
    noise = [f"request {i} about caches and NUMA nodes " * (1 + i % 3) for i in range(10)]
    params = [greedy, seeded] + [SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)] * 10
    outs = busy.generate([prompt, prompt] + noise, params)
    assert [o.outputs[0].token_ids for o in outs[:2]] == alone
    assert busy.engine.counters.num_preemptions > 0


def test_seed_reproducible_and_different_seeds_differ(llm):
    p1 = SamplingParams(temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    p2 = SamplingParams(temperature=1.0, seed=8, max_tokens=16, ignore_eos=True)
    a = llm.generate("hello", p1)[0].outputs[0].token_ids
    b = llm.generate("hello", p1)[0].outputs[0].token_ids
    c = llm.generate("hello", p2)[0].outputs[0].token_ids
    assert a == b and a != c


def test_n_completions_share_prompt_blocks(llm):
    before = llm.engine.counters.prefix_hits
    prompt = "shared prompt blocks for every completion of the request " * 2
    out = llm.generate(prompt, SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    n_prompt = len(out.prompt_token_ids)
    assert llm.engine.counters.prefix_hits - before >= 2 * ((n_prompt - 1) // 8) * 8


def test_stop_strings_and_stop_tokens(llm):
    base = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0].outputs[
        0
    ]
    stop_tok = base.token_ids[5]
    out = llm.generate(
        "Once upon a time", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop_tok])
    )[0].outputs[0]
    assert out.token_ids == base.token_ids[: base.token_ids.index(stop_tok) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    text = base.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if stop.strip() and "\ufffd" not in stop:
        out = llm.generate(
            "Once upon a time", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop])
        )[0].outputs[0]
        assert out.finish_reason == "stop" and out.stop_reason == stop
        assert out.text == text[: text.find(stop)]


def test_min_tokens_and_max_tokens(llm):
    out = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    first = out.token_ids[0]
    out = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=5, min_tokens=3, stop_token_ids=[first]))[
        0
    ].outputs[0]
    assert first not in out.token_ids[:3]


def test_penalties_change_output(llm):
    base = (
        llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0].outputs[0].token_ids
    )
    pen = (
        llm.generate(
            "Hello",
            SamplingParams(
                temperature=0.0, max_tokens=40, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0
            ),
        )[0]
        .outputs[0]
        .token_ids
    )
    assert len(set(pen)) >= len(set(base))
    assert pen != base or len(set(base)) == len(base)


def test_logprobs_are_normalised_and_include_chosen_token(llm):
    out = llm.generate("abc", SamplingParams(temperature=0.0, max_tokens=4, logprobs=3))[0].outputs[0]
    for tok, entry in zip(out.token_ids, out.logprobs):
        assert tok in entry and max(entry, key=entry.get) == tok
        assert all(v <= 0 for v in entry.values())


def test_priority_admitted_first(tiny_model):
    """One sequence slot: the waiting requests run lowest priority value first (vLLM's
    meaning; negative values allowed, 0 the default), equal priorities in arrival order."""
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8, max_num_seqs=1))
    p = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for rid, priority in (("background", 5), ("mid", 2), ("urgent", -1), ("default", 0), ("mid-later", 2)):
        engine.add_request(rid, f"{rid} priority", p, priority=priority)
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["urgent", "default", "mid", "mid-later", "background"]


def test_the_least_urgent_running_request_is_preempted(tiny_model):
    """Two requests share a 64-block pool that cannot hold both to their end: the one
    with the higher priority value (5, less urgent in vLLM's meaning, and the older one)
    is preempted, the priority-0 one never is."""
    engine = LLMEngine(
        EngineConfig(model=tiny_model, block_size=16, kv_cache_bytes=524288, preemption_mode="recompute", watermark=0.0)
    )
    assert engine.request_limits.num_usable_blocks == 64
    p = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)  # 600 tokens each: 38 blocks
    engine.add_request("background", [7] * 480, p, priority=5)
    engine.add_request("urgent", [9] * 480, p, priority=0)
    background, urgent = (engine.requests[rid].seqs[0] for rid in ("background", "urgent"))
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert background.num_preemptions >= 1 and urgent.num_preemptions == 0
    assert finished == ["urgent", "background"]


def test_aging_admits_a_starved_request_at_the_step_the_rule_gives(tiny_model):
    """Effective priority = priority - steps waited // priority_aging_steps; lower first,
    ties to the earlier arrival. One slot, two steps a request (prefill, one decode): the
    k-th admission is at step 2k+1. A priority-0 request arrives every step, so the oldest
    one waiting then is hi{k}, which has waited k+1 steps; old-low (priority 3) has waited
    2k+1. old-low goes first at the first k with 3 - (2k+1)//aging <= -((k+1)//aging):
    k = 6 for aging 2, after hi0..hi5, admitted at step 13 and finished at step 14."""
    aging, gap = 2, 3
    k = next(k for k in range(100) if (2 * k + 1) // aging >= gap + (k + 1) // aging)
    assert k == 6
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8, max_num_seqs=1, priority_aging_steps=aging))
    p = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request("old-low", "x", p, priority=gap)
    admitted, finished_at = [], {}
    for i in range(4 * k):
        engine.add_request(f"hi{i}", "y", p, priority=0)
        finished_at.update((o.request_id, engine.scheduler.step_count) for o in engine.step() if o.finished)
        admitted += [s.request_id for s in engine.scheduler.running if s.request_id not in admitted]
        if "old-low" in finished_at:
            break
    assert admitted == [f"hi{j}" for j in range(k)] + ["old-low"]
    assert finished_at == {**{f"hi{j}": 2 * j + 2 for j in range(k)}, "old-low": 2 * k + 2}


@pytest.mark.parametrize(
    "prompt, params, field",
    [
        ("x " * 5000, SamplingParams(), "max_model_len"),
        ("", SamplingParams(), "empty"),
        ([1, 2, 99999], SamplingParams(), "unknown token id"),
    ],
)
def test_bad_requests_raise_and_leave_others_alone(tiny_model, prompt, params, field):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    good = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_request("good", "fine prompt", good)
    engine.step()
    with pytest.raises(ValueError, match=field):
        engine.add_request("bad", prompt, params)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.request_id for o in outs if o.finished] == ["good"]
    assert len(outs[-1].outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(n=0), "n"),
        (dict(min_p=2.0), "min_p"),
        (dict(top_k=-5), "top_k"),
    ],
)
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(block_size=12), "block_size"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(preemption_mode="drop"), "preemption_mode"),
        (dict(dtype="int3"), "dtype"),
        (dict(max_num_batched_tokens=2), "max_num_batched_tokens"),
        (dict(kv_cold_dtype="fp8"), "kv_cold_dtype"),
    ],
)
def test_engine_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(model="x", **kwargs)


def test_unknown_config_key_is_named():
    with pytest.raises(ValueError, match="max_num_seq"):
        EngineConfig.from_dict({"model": "x", "max_num_seq": 3})


def test_missing_files_and_unsupported_architecture(tmp_path, tiny_model):
    import json
    import shutil

    with pytest.raises(FileNotFoundError, match="config.json"):
        LLMEngine(EngineConfig(model=str(tmp_path)))
    bad = tmp_path / "gpt"
    shutil.copytree(tiny_model, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="supported: LlamaForCausalLM"):
        LLMEngine(EngineConfig(model=str(bad)))
    (bad / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    (bad / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLMEngine(EngineConfig(model=str(bad)))


def test_reconfigure_bounds_and_fallback_switch(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    with pytest.raises(ValueError, match=r"max_num_seqs must be in \[1, 1024\]"):
        engine.reconfigure({"max_num_seqs": 0})
    with pytest.raises(ValueError, match="not a tunable"):
        engine.reconfigure({"block_size": 8})
    assert engine.reconfigure({"max_num_seqs": 4, "preemption_mode": "recompute"}).max_num_seqs == 4
    p = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ref = LLM(tiny_model, block_size=8).generate("fault injection", p)[0].outputs[0].token_ids
    engine.add_request("a", "fault injection", p)
    engine.step()
    engine.runner.inject_fastpath_failure("test")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].outputs[0].token_ids == ref  # the failed step was re-run, nothing lost
    assert engine.config.mode == "fallback" and engine.counters.fastpath_failures["injected"] == 1
    assert engine.set_mode("fast").mode == "fast" and engine.runner.mode == "fast"
    with pytest.raises(AttributeError):  # the engine's config is the mode's one owner
        engine.runner.mode = "fallback"


def test_extreme_sampling_values_do_not_fail_the_batch(llm):
    outs = llm.generate(
        ["a", "b", "c"],
        [
            SamplingParams(temperature=1e-300, max_tokens=4, ignore_eos=True),
            SamplingParams(temperature=1.0, repetition_penalty=1e-300, max_tokens=4, ignore_eos=True, seed=1),
            SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
        ],
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4, 4]
    greedy = llm.generate("a", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert outs[0].outputs[0].token_ids == greedy.outputs[0].token_ids  # a vanishing temperature is greedy


def test_failed_swap_resize_changes_nothing(tiny_model, monkeypatch):
    """A host allocation that fails mid-reconfigure leaves the old host pool and the
    swapped-out sequences' tables in place; every request still finishes as alone."""
    import inferd.engine.kv.kv_cache as kv_cache

    busy = busy_llm(tiny_model, "swap")
    engine = busy.engine
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    prompts = [f"request {i} about caches and NUMA nodes " * (1 + i % 3) for i in range(10)]
    alone = [LLM(tiny_model, block_size=8).generate(p, greedy)[0].outputs[0].token_ids for p in prompts[:3]]
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, greedy)
    outs = {}
    while not engine.scheduler.swapped and engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step()})
    assert engine.scheduler.swapped, "the workload should swap sequences out"
    before = (
        engine.config,
        engine.block_manager.host_pool,
        engine.kv_cache.host_pool,
        [list(s.host_block_table) for s in engine.scheduler.swapped],
    )

    def no_memory(*args, **kwargs):
        raise RuntimeError("host allocation failed")

    monkeypatch.setattr(kv_cache, "_Arena", no_memory)
    with pytest.raises(ValueError, match="swap_space_bytes: could not allocate .* nothing was changed") as info:
        engine.reconfigure({"swap_space_bytes": 80 * engine.block_bytes, "max_num_seqs": 3})
    assert info.value.name == "swap_space_bytes"
    monkeypatch.undo()
    assert (
        engine.config,
        engine.block_manager.host_pool,
        engine.kv_cache.host_pool,
        [list(s.host_block_table) for s in engine.scheduler.swapped],
    ) == before
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step()})
    assert [outs[str(i)].outputs[0].token_ids for i in range(3)] == alone
    assert all(len(o.outputs[0].token_ids) == 30 for o in outs.values()) and len(outs) == 10


def test_swap_resize_beyond_host_memory_is_refused_up_front(tiny_model, monkeypatch):
    import inferd.engine.llm_engine as llm_engine

    engine = LLMEngine(EngineConfig(model=tiny_model, block_size=8))
    monkeypatch.setattr(llm_engine, "available_host_bytes", lambda: 10 * engine.block_bytes)
    before = engine.block_manager.host_pool
    with pytest.raises(ValueError, match=r"needs .* GiB of host memory; this host has .* available") as info:
        engine.reconfigure({"max_num_seqs": 4, "swap_space_bytes": 11 * engine.block_bytes})
    assert info.value.name == "swap_space_bytes"
    assert engine.block_manager.host_pool is before and engine.config.max_num_seqs == 64
    assert engine.reconfigure({"swap_space_bytes": 9 * engine.block_bytes}).swap_space_bytes == 9 * engine.block_bytes
    assert engine.block_manager.host_pool.num_blocks == 9 == engine.kv_cache.num_host_blocks


def test_decode_counters_add_up_the_bytes_each_decode_step_reads(tiny_model):
    """One sequence, prompt P, N new tokens: N - 1 pure decode steps (the first token comes
    from the prefill), step i reading every weight once and P + i tokens of KV."""
    from inferd.engine.stats import decode_weight_bytes

    llm = LLM(tiny_model, block_size=8)
    engine = llm.engine
    out = llm.generate("count the bytes", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    prompt, new = len(out.prompt_token_ids), 6
    weights = decode_weight_bytes(engine.model_config, engine.dtype.itemsize)
    kv_token = engine.block_bytes // 8
    expected = (new - 1) * weights + sum(prompt + i for i in range(1, new)) * kv_token
    assert engine.counters.decode_bytes_read == expected
    assert engine.counters.decode_seconds > 0
    assert engine.counters.cuda_graphs_captured == 0  # no fast path on the CPU
