"""XLA301 wrap-device-loader: loaders iterated by training and evaluation loops go through the device loader.

What it does:
    Where a training loop or an evaluation loop, as the step model sees them (``xla_migrate.analysis.steps``: a loop
    whose step runs a backward pass and an update, in its body or in functions it calls; a loop with no
    backward that runs a model forward per batch), iterates a DataLoader, directly or through
    ``enumerate()`` or ``tqdm()``, the loader is wrapped at the iteration site: ``for x, y in train_loader:`` becomes
    ``for x, y in pl.MpDeviceLoader(train_loader, device):``. A DataLoader is one the script builds, a name
    bound to one, or a name that says so (``train_loader``, ``self.val_loader``, ``train_dl``): loaders are
    often parameters. A loop that accumulates gradients under ``if (i + 1) % k == 0:`` is not wrapped: the
    device loader marks the step at every batch, one graph per micro-step; XLA302 gives it a barrier after the
    update instead. Loops over something that is already a device loader are left alone, and so are the
    ``.to(device)`` calls on the batches (redundant on a device loader, but harmless). So are the loops of
    a script that builds an ``accelerate.Accelerator``: its prepared loaders are device loaders (XLA605).

    Where the device may be the CPU at run time (a device option, ``torch.device("cuda" if use_cuda else
    "cpu")`` with a user flag: see ``xla_migrate.analysis.device_flow``), the loader is wrapped only when the
    device is XLA: ``pl.MpDeviceLoader(train_loader, device) if torch.device(device).type == "xla" else
    train_loader``, so ``--device cpu`` or ``--no-cuda`` still runs (a device loader fails on a CPU device).

    The wrap is at the iteration site rather than a rebinding (``train_loader = pl.MpDeviceLoader(...)``)
    so that the name keeps meaning the DataLoader everywhere else: ``len(train_loader)``,
    ``train_loader.sampler.set_epoch(epoch)`` and ``train_loader.dataset`` keep working, and a loader passed
    to several functions is wrapped exactly where it is iterated. Building the wrapper per epoch costs
    nothing measurable: MpDeviceLoader starts its loader threads on every iteration anyway.

Why:
    On XLA the device loader moves the next batches to the device in the background while the current step
    runs, and marks the step at each batch (one graph per training step), which the seeds' recipe requires
    (``pl.MpDeviceLoader(loader, device)``). Without it the step must be marked by hand (XLA302).

Example:
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(train_loader):
            loss = criterion(model(x.to(device)), y.to(device))
            loss.backward()

Use instead:
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(pl.MpDeviceLoader(train_loader, device)):
            loss = criterion(model(x.to(device)), y.to(device))
            loss.backward()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule


class WrapDeviceLoader(Rule):
    code = "XLA301"
    name = "wrap-device-loader"
    summary = "loaders iterated by training/eval loops -> pl.MpDeviceLoader(loader, device) at the loop"

    def visit_For(self, node: cst.For) -> None:
        step = self.ctx.steps.loop(node)
        if step is None or not self.ctx.steps.gets_device_loader(step):
            return
        loader = step.loader
        assert loader is not None
        device = self.ctx.device_reference(loader, self.code)
        wrapped = self.ctx.spell("device_loader", patterns.HOLE, device)
        if self.ctx.device_flow.cpu_capable(patterns.parsed_expression(device)):
            torch = self.ctx.local_name("torch", "torch")
            wrapped = (f"{wrapped} if {torch}.device({device}).type == {self.ctx.spell('device_type')} "
                       f"else {patterns.HOLE}")
        template = patterns.parsed_expression(wrapped)
        text = " ".join(patterns.code_of(loader).split())

        def wrap(updated: cst.BaseExpression) -> cst.BaseExpression:
            return patterns.fill(template, updated)

        self.replace(loader, wrap, f"{text} -> {patterns.code_of(template).replace(patterns.HOLE, text)}")
