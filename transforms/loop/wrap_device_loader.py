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
    Likewise a script that hands its loaders to Lightning Fabric (``fabric.setup_dataloaders(...)``): Fabric's
    XLA strategies return them as device loaders, and a device loader around one yields no batch at all
    (issue 36); XLA302 marks the step after the update instead.

    A loop whose batch has an element the program never moves to the device and only collects or converts on
    the host (``labels.append(y)``, ``y.numpy()``: ``xla_migrate.analysis.steps.host_batch``) is not wrapped
    either: the device loader moves every element, and the collected labels would reach numpy, matplotlib or
    sklearn as XLA tensors ("can't convert xla:0 device type tensor to numpy"). It is reported, and XLA302
    marks its step instead.

    Nor is a loop that moves nothing to a device (no ``.to(...)``, ``.cuda()``, ``device=``) and runs before
    the program binds its device, in a module that binds one further down: a notebook that trains its first
    model on the CPU and only then defines ``device`` (mrdbourke's course notebooks). A device loader there
    handed XLA batches to the CPU model ("Expected XLA tensor. Got: torch.FloatTensor"). It is reported.
    Before the first such training loop (over a loader or not) the XLA device is acquired: torch's autograd
    engine sets up its device queues at its first backward, and a backward on XLA after a CPU one made
    before torch_xla had a device fails ("INTERNAL ASSERT FAILED ... device_ready_queues_").

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

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._acquired = False  # the XLA device is acquired before a CPU training loop (once)

    def visit_For(self, node: cst.For) -> None:
        step = self.ctx.steps.loop(node)
        if step is None:
            return
        before_device = self.ctx.steps.runs_before_the_device(step)
        if before_device and step.kind == "train":
            self._device_before_cpu_backward(node)
        if not self.ctx.steps.gets_device_loader(step):
            fits = self.ctx.steps.device_loader_fits(step)
            if fits and before_device:
                self.finding(node.iter, "this loop moves nothing to a device and runs before the program binds "
                             "its device: it trains or evaluates on the CPU, so its loader is not wrapped in the "
                             "device loader (which would hand XLA batches to a CPU model)",
                             "if this loop should run on XLA, move its model and batches to the device")
                return
            kept = self.ctx.steps.host_batch_elements(step) if fits else []
            if kept:
                names = ", ".join(f"`{name}`" for name in kept)
                them, stay = ("them", "stay") if len(kept) > 1 else ("it", "stays")
                self.finding(node.iter, f"{names} of this loop's batch {stay} on the host (the loop collects or "
                             f"converts {them} there, never moving {them}): the loader is not wrapped in the device "
                             f"loader, which would move {them} too; a step barrier marks the step instead",
                             f"to prefetch with the device loader, wrap it and take {names} to the host "
                             f"(`.cpu()`) where the loop collects {them}")
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

    def _device_before_cpu_backward(self, loop: cst.For) -> None:
        """Acquire the XLA device before the first CPU training loop's top-level statement (once): torch's
        autograd engine sizes its per-device queues at its first backward, and a backward on XLA after one
        on the CPU, before torch_xla had a device, fails with "INTERNAL ASSERT FAILED ... device_ready_queues_"
        (torch 2.9.0 + torch_xla 2.9.0 and 2.6.1, measured here; mrdbourke's workflow notebook)."""
        if self._acquired:
            return
        self._acquired = True
        statement = loop
        while self.ctx.parent(statement) is not self.ctx.module:
            statement = self.ctx.parent(statement)
        code = self.ctx.spell("device")
        new = self.ctx.statement(code).with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            "# The XLA device before the first backward on the CPU: torch's autograd engine sets up its "
            "device queues then."))])
        self.insert_before(statement, [new], f"{code} before the CPU training loop (an XLA backward after a CPU "
                                             "backward fails unless the XLA device existed then)")
