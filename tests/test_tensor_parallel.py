"""Tensor parallelism on CPU: gloo, two processes, the same code as on GPUs.

tp=2 must give the same greedy tokens as tp=1 (and logits within float32 summation
noise) with preemption by swap and by recompute and with cold KV; a dead worker must
bring the engine down with a clear error instead of hanging it; shapes the group size
does not divide must be refused before any process starts.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import pytest
import torch

from inferd.engine import LLM, SamplingParams
from inferd.engine.model.loader import load_model
from inferd.engine.model.model_config import ModelConfig
from inferd.engine.parallel import (
    ShardSpec,
    TensorParallelError,
    check_divisible,
    local_config,
    shard_tensor,
    split_dim,
)
from inferd.engine.parallel.sharding import read_shards
from inferd.engine.runner.runner_protocol import ModelRunnerProtocol

HANG_GUARD_S = 120  # a hung engine fails the test instead of the whole run


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two ranks share the machine's cores
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tp_model(model_factory) -> str:
    return model_factory(preset="tiny", overrides=dict(num_attention_heads=4, num_key_value_heads=2))


def busy_config(model_dir: str) -> dict:
    """A KV pool small enough that the prompts below preempt each other."""
    probe = LLM(model_dir, block_size=8, dtype="float32")
    bb = probe.engine.block_bytes
    return dict(
        block_size=8,
        dtype="float32",
        kv_cache_bytes=30 * bb,
        swap_space_bytes=40 * bb,
        watermark=0.0,
        max_num_batched_tokens=48,
    )


class Engines:
    """At most one tensor-parallel engine lives at a time (one process group per process)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.config = busy_config(model_dir)
        self.tp1 = LLM(model_dir, **self.config)
        self._tp2: LLM | None = None

    def tp2(self) -> LLM:
        runner = self._tp2.engine.runner if self._tp2 else None
        if runner is None or runner.failure is not None or runner.workers.stopping:
            self._tp2 = LLM(self.model_dir, tensor_parallel_size=2, **self.config)
        return self._tp2

    def fresh_tp2(self) -> LLM:
        self.close()
        return self.tp2()

    def close(self) -> None:
        if self._tp2 is not None:
            self._tp2.engine.runner.shutdown()
            self._tp2 = None


@pytest.fixture(scope="module")
def engines(tp_model):
    e = Engines(tp_model)
    yield e
    e.close()


def record_logits(llm: LLM) -> list[torch.Tensor]:
    runner, seen = llm.engine.runner, []
    execute = runner.execute

    def recording(batch):
        output = execute(batch)
        seen.append(output.logits.detach().clone())
        return output

    runner.execute = recording
    return seen


PROMPT = "The scheduler preempts the newest sequence"
NOISE = [f"request {i} about caches and NUMA nodes " * (1 + i % 3) for i in range(10)]


def greedy_run(llm: LLM, max_tokens: int = 24):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    logits = record_logits(llm)
    try:
        outs = llm.generate([PROMPT] + NOISE, params)
    finally:
        del llm.engine.runner.execute  # back to the class's method
    return [o.outputs[0].token_ids for o in outs], logits


def assert_logits_close(expected: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(expected) == len(got), "tp=1 and tp=2 ran different numbers of steps"
    for step, (a, b) in enumerate(zip(expected, got)):
        assert a.shape == b.shape, f"step {step}: logits {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.numel():
            rel = (a - b).abs().max() / a.abs().max()
            assert rel < 1e-4, f"step {step}: logits differ by {rel:.2e} of their range"


# --- sharding rules and the per-rank loader (no processes) -----------------------------------
def test_split_rules():
    assert split_dim("model.layers.3.self_attn.q_proj.weight") == 0
    assert split_dim("model.layers.3.self_attn.k_proj.bias") == 0
    assert split_dim("model.layers.0.mlp.up_proj.weight") == 0
    assert split_dim("model.layers.0.self_attn.o_proj.weight") == 1
    assert split_dim("model.layers.0.mlp.down_proj.weight") == 1
    assert split_dim("model.embed_tokens.weight") == 0
    assert split_dim("lm_head.weight") == 0
    assert split_dim("model.layers.0.input_layernorm.weight") is None
    assert split_dim("model.norm.weight") is None


def test_rank_slices_put_back_together_are_the_checkpoint(tp_model):
    full = {
        ("model." + n if not n.startswith("lm_head") else n): p
        for n, p in load_model(tp_model, torch.float32, torch.device("cpu")).named_parameters()
    }
    shards = [read_shards(tp_model, set(full), ShardSpec(r, 2), torch.float32) for r in range(2)]
    for name, tensor in full.items():
        dim = split_dim(name)
        if dim is None:
            assert all(torch.equal(s[name], tensor) for s in shards), name
        else:
            assert shards[0][name].shape[dim] == tensor.shape[dim] // 2, name
            assert torch.equal(torch.cat([s[name] for s in shards], dim=dim), tensor), name
            assert torch.equal(shard_tensor(name, tensor, ShardSpec(1, 2)), shards[1][name]), name


def test_local_config_divides_heads_inner_and_vocab(tp_model):
    cfg = ModelConfig.from_dir(tp_model)
    local = local_config(cfg, 2)
    assert (local.num_attention_heads, local.num_key_value_heads) == (
        cfg.num_attention_heads // 2,
        cfg.num_key_value_heads // 2,
    )
    assert (local.intermediate_size, local.vocab_size) == (cfg.intermediate_size // 2, cfg.vocab_size // 2)
    assert local.head_dim == cfg.head_dim and local.hidden_size == cfg.hidden_size


@pytest.mark.parametrize("rank, size", [(2, 2), (-1, 2), (0, 0), (0, 9), (True, 2)])
def test_shard_spec_validation(rank, size):
    with pytest.raises(ValueError, match="rank|world_size"):
        ShardSpec(rank, size)


def test_indivisible_shapes_are_refused_before_any_process_starts(tp_model, model_factory):
    before = set(multiprocessing.active_children())
    with pytest.raises(
        ValueError,
        match="tensor_parallel_size=3 must divide num_attention_heads=4, "
        "num_key_value_heads=2, intermediate_size=176, vocab_size=512",
    ):
        LLM(tp_model, dtype="float32", tensor_parallel_size=3)
    one_kv_head = model_factory(preset="tiny", overrides=dict(num_attention_heads=4, num_key_value_heads=1))
    with pytest.raises(ValueError, match=r"must divide num_key_value_heads=1 of the model"):
        LLM(one_kv_head, dtype="float32", tensor_parallel_size=2)
    assert set(multiprocessing.active_children()) == before
    with pytest.raises(
        ValueError, match=r"tensor_parallel_size=8 must divide num_attention_heads=4, num_key_value_heads=2 of"
    ):
        check_divisible(ModelConfig.from_dir(tp_model), 8)  # 176 and 512 are multiples of 8


def test_gpu_worker_binds_to_its_gpus_numa_node(tmp_path, monkeypatch):
    import inferd.engine.memory.numa_memory as numa_memory
    from inferd.engine.parallel.worker import bind_to_device_node

    before = os.sched_getaffinity(0)
    cpu = min(before)
    (tmp_path / "devices/system/node/node1").mkdir(parents=True)
    (tmp_path / "devices/system/node/node1/cpulist").write_text(f"{cpu}\n")
    asked = []
    monkeypatch.setattr(numa_memory, "device_numa_node", lambda device, root: asked.append(str(device)) or 1)
    policies = []
    monkeypatch.setattr(numa_memory, "_set_mempolicy", lambda mode, node: policies.append((mode, node)) or True)
    try:
        assert bind_to_device_node(torch.device("cuda", 1), str(tmp_path)) == 1
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
    assert asked == ["cuda:1"] and policies == [(numa_memory.MPOL_PREFERRED, 1)]
    # CPU ranks keep the binding they inherited (the agent's placement of the engine)
    assert bind_to_device_node(torch.device("cpu"), str(tmp_path)) == 1
    assert os.sched_getaffinity(0) == before and len(policies) == 1


# --- two ranks over gloo ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_tp2_matches_tp1_under_preemption(engines, mode):
    tp1, tp2 = engines.tp1, engines.tp2()
    for llm in (tp1, tp2):
        llm.engine.reconfigure({"preemption_mode": mode})
    before = (tp2.engine.counters.swap_out_bytes, tp2.engine.counters.recompute_faults)
    tokens1, logits1 = greedy_run(tp1)
    tokens2, logits2 = greedy_run(tp2)
    assert tokens2 == tokens1
    assert_logits_close(logits1, logits2)
    c = tp2.engine.counters
    assert c.num_preemptions > 0
    if mode == "swap":
        assert c.swap_out_bytes > before[0] and c.swap_in_faults > 0
    else:
        assert c.recompute_faults > before[1]


@pytest.mark.slow
def test_tp2_matches_tp1_with_cold_int8_kv(engines):
    tp1, tp2 = engines.tp1, engines.tp2()
    changes = {"kv_cold_dtype": "int8", "kv_hot_window": 8, "preemption_mode": "swap"}
    for llm in (tp1, tp2):
        llm.engine.reconfigure(changes)
    try:
        tokens1, logits1 = greedy_run(tp1, max_tokens=32)
        tokens2, logits2 = greedy_run(tp2, max_tokens=32)
    finally:
        for llm in (tp1, tp2):
            llm.engine.reconfigure({"kv_cold_dtype": "none"})
    assert tp2.engine.counters.quantized_blocks["int8"] > 0
    assert tokens2 == tokens1
    assert_logits_close(logits1, logits2)


@pytest.mark.slow
def test_tp2_matches_tp1_with_qkv_bias_and_tied_embeddings(engines, model_factory):
    """Qwen2 has q/k/v biases (split with their heads); a tied LM head is the split embedding."""
    qwen = model_factory(preset="tiny", arch="qwen2", tie_word_embeddings=True)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [PROMPT] + NOISE[:3]
    expected = [o.outputs[0].token_ids for o in LLM(qwen, block_size=8, dtype="float32").generate(prompts, params)]
    engines.close()
    tp2 = LLM(qwen, block_size=8, dtype="float32", tensor_parallel_size=2)
    try:
        assert tp2.engine.model.lm_head.weight is tp2.engine.model.embed_tokens.weight
        assert tp2.engine.model.layers[0].self_attn.q_proj.bias is not None
        got = [o.outputs[0].token_ids for o in tp2.generate(prompts, params)]
    finally:
        tp2.engine.runner.shutdown()
    assert got == expected


@pytest.mark.slow
def test_workers_keep_multicast_off_and_hold_their_share_of_kv_heads(engines):
    tp2 = engines.tp2()
    (info,) = tp2.engine.runner.probe_workers()
    assert info["rank"] == 1 and info["pid"] != os.getpid()
    assert info["env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    assert info["num_kv_heads"] == 1
    assert tp2.engine.kv_cache.shape.num_kv_heads == 1  # rank 0's pool: its half too
    assert isinstance(tp2.engine.runner, ModelRunnerProtocol)  # everything the engine uses of a runner


@pytest.mark.slow
def test_fast_path_failure_on_rank0_reruns_every_rank_on_the_fallback(engines):
    tp1, tp2 = engines.tp1, engines.tp2()
    for llm in (tp1, tp2):
        llm.engine.reconfigure({"preemption_mode": "swap", "mode": "fast"})
    expected, _ = greedy_run(tp1, max_tokens=8)
    tp2.engine.runner.inject_fastpath_failure("test")
    try:
        got, _ = greedy_run(tp2, max_tokens=8)
        assert tp2.engine.counters.fastpath_failures["injected"] == 1
        assert tp2.engine.runner.mode == "fallback"
    finally:
        tp2.engine.reconfigure({"mode": "fast"})
    assert got == expected  # the failed step's K/V were rewritten on both ranks


def generate_in_thread(llm: LLM, prompts, params) -> dict:
    """Run generate on a thread; the result, or the exception it raised, or a hang."""
    box: dict = {}

    def run():
        try:
            box["result"] = llm.generate(prompts, params)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    box["hung"] = thread.is_alive()
    return box


def assert_engine_went_down(llm: LLM, box: dict) -> None:
    assert not box["hung"], "the engine hung after a worker died"
    assert isinstance(box.get("error"), TensorParallelError), box
    assert "tensor-parallel engine is down" in str(box["error"])
    runner = llm.engine.runner
    assert all(not p.is_alive() for p in runner.workers.procs)
    with pytest.raises(TensorParallelError):  # later calls fail the same way
        llm.engine.runner.execute([])


@pytest.mark.slow
def test_worker_killed_between_steps_takes_the_engine_down(engines):
    tp2 = engines.fresh_tp2()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    assert tp2.generate(PROMPT, params)[0].outputs[0].token_ids  # serving
    pid = tp2.engine.runner.workers.procs[0].pid
    os.kill(pid, signal.SIGKILL)
    box = generate_in_thread(tp2, [PROMPT], params)
    assert_engine_went_down(tp2, box)
    assert "exited with code -9" in str(box["error"])


@pytest.mark.slow
def test_worker_killed_inside_a_collective_takes_the_engine_down(engines):
    tp2 = engines.fresh_tp2()
    worker = tp2.engine.runner.workers.procs[0]
    calls = {"n": 0}

    def kill_on_fifth_call(module, args):
        calls["n"] += 1
        if calls["n"] == 5:  # rank 0 is about to all-reduce o_proj's partial sums
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(10)

    tp2.engine.model.layers[1].self_attn.o_proj.register_forward_pre_hook(kill_on_fifth_call)
    box = generate_in_thread(tp2, [PROMPT] + NOISE[:3], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert calls["n"] >= 5
    assert_engine_went_down(tp2, box)
    assert "exited with code -9" in str(box["error"])


@pytest.mark.slow
def test_worker_exception_is_reported_with_its_traceback(engines):
    tp2 = engines.fresh_tp2()
    tp2.engine.runner._send(("no-such-command",))
    box = generate_in_thread(tp2, [PROMPT], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert_engine_went_down(tp2, box)
    assert "unknown tensor-parallel command 'no-such-command'" in str(box["error"])


RANK0_SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
from inferd.engine import LLM
if __name__ == "__main__":
    llm = LLM(sys.argv[1], dtype="float32", block_size=8, tensor_parallel_size=2)
    print(llm.engine.runner.workers.procs[0].pid, flush=True)
    time.sleep(600)
"""


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_workers_exit_when_rank0_is_killed(tp_model, tmp_path):
    import subprocess
    import sys
    import time

    script = tmp_path / "rank0.py"
    script.write_text(RANK0_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), tp_model],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        worker_pid = int(proc.stdout.readline())
        assert pid_alive(worker_pid)
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + HANG_GUARD_S
        while pid_alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(worker_pid), "a worker outlived its rank 0"
    finally:
        proc.kill()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL); none or one here")
def test_tp2_matches_tp1_on_two_gpus_in_bf16(tp_model):
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tp1 = LLM(tp_model, dtype="bfloat16", device="cuda:0", kv_cache_bytes=64 << 20)
    expected = [o.outputs[0].token_ids for o in tp1.generate([PROMPT] + NOISE[:3], params)]
    tp2 = LLM(tp_model, dtype="bfloat16", device="cuda:0", kv_cache_bytes=64 << 20, tensor_parallel_size=2)
    try:
        got = [o.outputs[0].token_ids for o in tp2.generate([PROMPT] + NOISE[:3], params)]
    finally:
        tp2.engine.runner.shutdown()
    # bf16 partial sums in a different order may flip a near tie late in a sequence
    same = sum(a == b for e, g in zip(expected, got) for a, b in zip(e, g))
    assert same >= 0.9 * sum(map(len, expected))


@pytest.mark.slow
def test_tp_decode_benchmark_smoke_on_cpu(engines, tp_model, tmp_path):
    import json

    from inferd.engine.bench import tp_decode

    engines.close()  # the benchmark starts its own tensor-parallel engine
    assert (
        tp_decode.main(
            [
                "--device",
                "cpu",
                "--model",
                tp_model,
                "--out",
                str(tmp_path),
                "--requests",
                "4",
                "--input-len",
                "24",
                "--output-len",
                "8",
                "--prompt-len",
                "16",
                "--decode-len",
                "8",
                "--kv-gib",
                "0.05",
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "results.json").read_text())
    assert [r["tp"] for r in result["runs"]] == [1, 2]
    assert result["batch1_token_agreement"] == 1.0 and result["throughput_token_agreement"] == 1.0
    tp2 = result["runs"][1]
    assert 0 < tp2["allreduce_share_of_step"] < 1
    # per step: an all-reduce after the embedding, after each layer's attention and MLP,
    # the logits gather and the failure flag (tiny preset: 2 layers)
    assert tp2["collectives_per_step"] == 1 + 2 * 2 + 1 + 1
