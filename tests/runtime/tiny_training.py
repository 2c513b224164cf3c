"""A tiny deterministic training run (CPU, or CUDA in the gpu tier) for the checkpoint tests.

Dropout, a shuffled order and an LR schedule make every piece of state matter
(weights, Adam moments, scheduler, torch and python RNG): a resume that drops
one of them diverges from the uninterrupted run.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from kubetrain.runtime.checkpoint import CheckpointManager

STEPS = 60
SAVE_EVERY = 4
BINDING = {"dataset_version": "v1", "code_version": "test", "params": {"lr": 0.01}}


def build(
    device: str = "cpu",
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)  # every device's generator, CUDA's too
    random.seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 1)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    return model, optimizer, scheduler


def data(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=generator).to(device)
    return x, x.sum(dim=1, keepdim=True)


def train(
    root: Path, losses: Path, *, blocking: bool = True, steps: int = STEPS, device: str = "cpu"
) -> None:
    """Trains to `steps`, resuming from `root`; appends `step loss` lines to `losses`.

    On "cuda" the dropout masks come from CUDA's generator, whose state the
    checkpoint must carry too (the tests of the `gpu` tier)."""
    torch.set_num_threads(1)
    if device != "cpu":
        # cuBLAS picks its algorithms per call unless told not to: bit-for-bit needs this
        # (read when its first handle is made, so before any CUDA work of this process).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    model, optimizer, scheduler = build(device)
    x, y = data(device)
    manager = CheckpointManager(root, keep_last=2, binding=BINDING)
    start = manager.resume(model=model, optimizer=optimizer, scheduler=scheduler) or 0
    with losses.open("a") as log:
        log.write(f"resumed {start}\n")
        log.flush()
        for step in range(start + 1, steps + 1):
            batch = torch.randperm(len(x))[:32].to(device)
            noise = random.random() * 1e-3  # noqa: S311 - state the resume must restore
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch]) + noise
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            scheduler.step()
            log.write(f"{step} {loss.item().hex()}\n")
            log.flush()
            if step % SAVE_EVERY == 0:
                manager.save(
                    step, model=model, optimizer=optimizer, scheduler=scheduler, blocking=blocking
                )
    manager.close()
    torch.save(model.state_dict(), root / "final.pt")
