"""Where the engine's batch-1 decode loses time against the bare graph replay: torch
profiler over 64 engine decode steps (async scheduling on), GPU ops between replays, and
the GPU's busy time against wall time."""
import time, torch
from torch.profiler import ProfilerActivity, profile
from engine import SamplingParams
from engine.bench.gpu_decode import build, new_engine, prompts

model_dir, model = build()
eng = new_engine(model_dir, model, "fast", kv_gib=40)
vocab = model.config.vocab_size
params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
def run(tag, steps_profiled=None):
    eng.add_request(tag, prompts(vocab, 1, 512, seed=hash(tag) % 1000)[0], params)
    n = 0
    while eng.has_unfinished():
        eng.step(); n += 1
    return n
run("warm")
eng.add_request("p", prompts(vocab, 1, 512, seed=5)[0], params)
for _ in range(8):  # prefill + a few decode steps before the window
    eng.step()
torch.cuda.synchronize()
t0 = time.perf_counter()
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(64):
        eng.step()
    torch.cuda.synchronize()
wall = time.perf_counter() - t0
print(f"64 steps: wall {wall*1e3:.2f} ms, {wall/64*1e3:.3f} ms/step")
events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
busy = sum(e.device_time_total for e in events) / 1e3 if hasattr(events[0], "device_time_total") else None
print("GPU busy (sum of device op times) ms:", busy)
table = prof.key_averages().table(sort_by="self_device_time_total" if True else "", row_limit=25)
print(table)
# gaps: sort device events by start, sum idle between them
ev = sorted(((e.time_range.start, e.time_range.end, e.name) for e in events), key=lambda x: x[0])
idle, big = 0.0, []
for (s0, e0, n0), (s1, e1, n1) in zip(ev, ev[1:]):
    g = s1 - e0
    if g > 0:
        idle += g
        if g > 20: big.append((round(g, 1), n0[:40], n1[:40]))
print(f"GPU idle between ops: {idle/1e3:.3f} ms over 64 steps ({idle/64:.1f} us/step); gaps > 20 us: {len(big)}")
from collections import Counter
print(Counter((b[1], b[2]) for b in big).most_common(8))
print(sorted(big, reverse=True)[:10])
