"""Per-kernel GPU times of eager batch-1 decode steps (context 640) in launch order, grouped by
kernel name and by position in the layer (PDL off: run with INFERD_PDL=0)."""
import json, collections
import torch
from torch.profiler import ProfilerActivity, profile
from engine.bench import gpu_decode as g

model_dir, model = g.build()
fast = g.new_engine(model_dir, model, "fast", kv_gib=8)
graphs = g._load_rows(fast, 1, 640)
for _ in range(3):
    graphs._run(1)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        graphs._run(1)
    torch.cuda.synchronize()
kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
per_step = len(kernels) // 5
step = kernels[-per_step:]
names = [e.name[:40] for e in step]
by_name = collections.defaultdict(list)
for e in kernels:
    by_name[e.name[:40]].append(e.device_time if hasattr(e, "device_time") else e.cuda_time)
print("kernels per step", per_step)
print(json.dumps({n: [len(v) // 5, round(sum(v) / 5, 1)] for n, v in by_name.items()}, indent=0))
# layer position: the layer's 5 kernels after the first few
seq = [(e.name[:24], round(e.device_time if hasattr(e, "device_time") else e.cuda_time, 2)) for e in step]
print(seq[:14])
print(seq[-8:])
pos = collections.defaultdict(list)
layer = [i for i, (n, _) in enumerate(seq) if n.startswith("_qkv_rope")]
for a, b in zip(layer, layer[1:] + [len(seq)]):
    for j, (n, t) in enumerate(seq[a:b]):
        pos[(j, n)].append(t)
print({f"{j}:{n}": round(sum(v) / len(v), 2) for (j, n), v in pos.items()})
print("step kernel sum us", round(sum(t for _, t in seq), 1))
