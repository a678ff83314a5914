"""GPU check of the in-graph greedy head against torch, and its time against torch's argmax + isfinite."""
import json, torch, triton
from engine.fast_path.greedy_head import greedy_with_flag, greedy_with_flag_reference
dev = torch.device("cuda"); res = {}
g = torch.Generator(device=dev).manual_seed(0)
for rows in (1, 8, 32, 256):
    x = torch.randn(rows, 128256, device=dev, generator=g)
    x[:, 77] = x.max() + 1 if rows == 8 else x[:, 77]  # ties with a later column for rows == 8
    if rows == 8: x[:, 99000] = x[:, 77]
    ok = greedy_with_flag(x).tolist() == greedy_with_flag_reference(x).tolist()
    y = x.clone(); y[rows - 1, 12345] = float("nan")
    nan_ok = greedy_with_flag(y)[0].item() == 0
    live = torch.ones(rows, dtype=torch.long, device=dev); live[rows - 1] = 0
    pad_ok = rows == 1 or greedy_with_flag(y, live)[0].item() == 1
    t_new = triton.testing.do_bench(lambda: greedy_with_flag(x), warmup=20, rep=200, return_mode="median") * 1e3
    t_old = triton.testing.do_bench(lambda: (x.argmax(-1), torch.isfinite(x).all()), warmup=20, rep=200, return_mode="median") * 1e3
    res[rows] = dict(match=ok, nan_flag=nan_ok, padding_ignored=pad_ok, us_kernels=round(t_new, 1), us_torch=round(t_old, 1))
    print(rows, res[rows], flush=True)
print(json.dumps(res))
