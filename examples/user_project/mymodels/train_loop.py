"""A training loop of the user's (``task.entrypoint: "mymodels.train_loop:train"``).

aistack calls ``train`` once per rank (``strategy: ddp`` runs it in every
rank, in the trial's process group) with the trial's context: its
parameters, its data, where to compute, and ``report``, ``restore`` and
``export``. The loop is the user's own; the platform does the rest.
"""

from __future__ import annotations

import torch
from torch import nn

import aistack
from mymodels.torch_model import build


def train(ctx: aistack.TrialContext) -> None:
    model = ctx.prepare_model(build(ctx.params, ctx.data))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(ctx.params.get("lr", 1e-2)))
    loss_fn = nn.CrossEntropyLoss()
    start = 1
    saved = ctx.restore()
    if saved is not None:  # a resumed trial: its last checkpoint
        state = saved.state()
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = saved.step + 1
    batches = ctx.data_loader("train", batch_size=int(ctx.params.get("batch_size", 32)))
    x_val = torch.as_tensor(ctx.data.x_val).to(ctx.device)
    y_val = torch.as_tensor(ctx.data.y_val).to(ctx.device)
    for epoch in range(start, (ctx.epochs or 10) + 1):
        model.train()
        for x, y in batches:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = float(loss_fn(logits, y_val))
            val_error = float((logits.argmax(dim=1) != y_val).float().mean())
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        ctx.report(epoch, {"val_loss": val_loss, "val_error": val_error}, checkpoint=state)
    ctx.export(model, ctx.data.x_val[:4])
