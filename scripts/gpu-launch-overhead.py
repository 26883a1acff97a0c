"""What launching small kernels costs on this GPU machine, eagerly and replayed from a CUDA graph:
the floor under a decode step made of ~390 small kernels (cachet's Qwen2.5 0.5B step at batch 1).
Needs PyTorch with CUDA (the GPU machines' image has it). Run by scripts/gpu-check.sh.

    python3 scripts/gpu-launch-overhead.py [KERNELS_PER_STEP]
"""
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 390
x = torch.zeros(896, device="cuda")
y = torch.ones(896, device="cuda")


def step():
    for _ in range(n):
        x.add_(y)


def timed(f, reps):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
torch.cuda.synchronize()
eager = min(timed(step, 10) for _ in range(3))
graph = min(timed(g.replay, 100) for _ in range(3))
print(
    f"{n} small kernels per step: eager {eager * 1e3:.2f} ms ({eager / n * 1e6:.1f} us each), "
    f"CUDA graph replay {graph * 1e3:.3f} ms ({graph / n * 1e6:.2f} us each)"
)
