"""XLA312 dynamic-shapes-in-loop: what changes tensor shapes from step to step in training is reported.

What it does:
    Reports, with the line and the fix: a ``DataLoader`` that a training loop iterates without
    ``drop_last=True`` (its last batch is smaller when the dataset is not a multiple of the batch size), and
    Hugging Face ``TrainingArguments(...)`` without ``dataloader_drop_last=True`` (the Trainer's loader);
    in a training step (a training loop's body or a function it calls: a helper, a ``self`` method, named with the
    call in the step; a function of another project module the step calls, reported at the call with the line
    of its masked index, from the project index; the forward of a loss class of this module that a loop of another
    module calls every step, at the index, naming that loop's call), boolean-mask indexing (``x[x > 0]``, ``x[mask]`` with
    ``mask`` a comparison, ``x[~mask]``, a mask made with ``dtype=torch.bool``) and the calls whose result size
    depends on the data (``x.nonzero()``, ``torch.nonzero``, ``torch.masked_select``, ``torch.unique``,
    one-argument ``torch.where(cond)``). Also (``xla_migrate.analysis.shapes``), what XLA316 does not
    rewrite: a ``collate_fn`` (a function, or a collate object's ``__call__``) that pads each batch to its
    own longest sequence or largest image (``pad_sequence`` without a maximum length in the script,
    ``max(len(s) for s in batch)``); detection targets sized by the batch's box count (``transforms/loop/
    box_count_targets.py``: a collate that concatenates each image's boxes, ``torch.cat(targets, 0)``, or
    returns them as a list of per-image tensors), reported where the training loop moves them to the device
    (at the collate when a device loader moves them), with the fix: pad to a fixed maximum number of boxes
    with a validity mask; a corpus on the device sliced with Python offsets by a batch function, and any slice of a device tensor inside a step
    loop whose bounds come from the loop's variables (``data[i:i + bs]``), also through a helper the step calls
    with a device tensor and the loop's offset (TCN's ``get_batch(train_data, i, args)`` slicing ``source[:,
    i:i + seq_len]``; a function of this module, or of another project module from the project index): at the
    call, naming the slice; in a decode loop (an evaluation loop calling a model's submodules one by one), a slice
    to the rows still alive (``h[: len(alive)]``) is a new graph per live batch size, with the fix to keep the
    batch and mask the finished rows. Host-random geometry on the step's
    device tensors (``transforms/loop/host_random_geometry.py``): a slice whose bounds a ``random.*`` /
    ``np.random.*`` draw gives (a random crop in the step, or a helper the step calls: reported at the call,
    naming the slice; a helper of another project module too, from the project index), and timm's ``Mixup`` with CutMix (``cutmix_alpha`` not 0) or torchvision's
    ``v2.CutMix`` called on a batch already on the device (a device loader's, or one moved before the call):
    the box's corners are drawn on the host. A coin toss on the host in a loop the training step repeats (a
    decoder's time steps, in the step or the forward of its model) choosing what each iteration computes
    (teacher forcing: ``trg[t] if random.random() < ratio else pred``). Nothing is rewritten.

Why:
    XLA compiles one graph per set of input shapes. A shape that depends on the data (or a smaller last
    batch) is a new graph: the step compiles again (measured: ``drop_last=False`` cost one extra compile per
    epoch; a data-dependent shape can cost one per step). Keep shapes static: drop the last batch, and use
    masks arithmetically instead of selecting with them.

Example:
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for x, y in loader:
        loss = criterion(model(x)[y >= 0], y[y >= 0])

Use instead:
    loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True)
    for x, y in loader:
        mask = (y >= 0).float()
        loss = (criterion(model(x), y.clamp(min=0)) * mask).sum() / mask.sum()  # reduction="none"
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.analysis import shapes
from xla_migrate.analysis.facts import DATALOADERS, DEVICE_LOADERS
from xla_migrate.analysis.steps import Region
from xla_migrate.engine.rule import Rule
from xla_migrate.transforms.hf import hf_common
from xla_migrate.transforms.common import short
from xla_migrate.transforms.loop import box_count_targets as box_counts
from xla_migrate.transforms.loop import host_random_geometry as geometry
from xla_migrate.transforms.loop import static_batch_shapes

DATA_DEPENDENT = ("torch.nonzero", "torch.masked_select", "torch.unique", "torch.argwhere",
                  "torch.unique_consecutive")
MASK_CALLS = ("torch.isnan", "torch.isinf", "torch.isfinite", "torch.logical_and", "torch.logical_or",
              "torch.logical_not", "torch.logical_xor", "torch.eq", "torch.ne", "torch.gt", "torch.lt",
              "torch.ge", "torch.le")
PAD_FIX = ("pad every batch to one fixed length (the dataset's maximum: pad_sequence(...) then "
           "torch.nn.functional.pad(x, (0, MAX_LEN - x.size(1))), or padding='max_length'), or to a few bucket "
           "lengths; mask the padding in the model")
SLICE_FIX = ("keep the tensor on the host and move each slice to the device (x[i:i + n].to(device)): the batch "
             "then has the same shape every step and the slicing costs no graph")
DECODE_FIX = ("keep the batch at its full size and mask the finished rows (tokens = torch.where(done, END, tokens)): "
              "one graph for every token")
WINDOW_FIX = ("keep the corpus on the host and move each window (the helper slices the CPU tensor, then "
              ".to(device)), or gather with a device index (source.index_select(1, offsets + i_tensor)) so the "
              "offset is data, not a constant of the graph")
MASK_FIX = ("keep the shape: use the mask arithmetically (torch.where(mask, x, 0), x * mask, "
            "loss with reduction='none' times the mask, divided by mask.sum()); where each row keeps the same "
            "count (x[~torch.eye(n, dtype=torch.bool)].view(n, -1)), gather with indices built once "
            "(torch.gather(x, 1, idx))")


class DynamicShapesInLoop(Rule):
    code = "XLA312"
    name = "dynamic-shapes-in-loop"
    summary = "training loaders without drop_last, boolean-mask indexing and nonzero() in training loops are reported"
    on_xla_code = True  # it only reports, on code already on XLA too (its CUDA paths included)
    reports_only = True

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._iterated = self._training_loader_names() if ctx.steps.training_loops else set()
        self._training_args = hf_common.local_training_args_classes(ctx.module, ctx)
        # Names bound to boolean masks, per training loop and function.
        self._masks: dict[object, set[str]] = {}
        # Names bound to host random draws, per function (None: the module's code) or per loop (coin tosses).
        self._random: dict[cst.CSTNode | None, set[str]] = {}
        self._cutmix_bound = geometry.cutmix_bindings(ctx) if ctx.steps.training_loops else {}

    def _region(self, node: cst.CSTNode) -> Region | None:
        """Where ``node`` runs in a training step: the loop's body, a function the step model follows, or one
        the loop calls that holds no step event (``self.info_nce(features)``: issue 30), else None."""
        steps = self.ctx.steps
        region = steps.training_region(node)
        if region is None:
            region = steps.called_region(node)
        return region if region is not None and region.step.kind == "train" else None

    def _training_step(self, node: cst.CSTNode) -> object | None:
        """The training step ``node`` runs in, with the function holding it (where its masks are bound); for a
        function of this module that a loop of another module runs every step (``foreign_step``), that
        function alone; else None."""
        region = self._region(node)
        if region is not None:
            return (region.step.loop, region.function)
        if self.ctx.project is not None and self.ctx.steps.foreign_step(node):
            return (None, self.ctx.steps.function_of(node))
        return None

    # Loaders ---------------------------------------------------------------------------------------------
    def _training_loader_names(self) -> set[str]:
        """Spellings of the loaders the training loops iterate (through enumerate/tqdm and device loaders)."""
        names: set[str] = set()
        device_loader_args = self.ctx.facts.device_loader_sources
        for loop in self.ctx.steps.training_loops:
            if not isinstance(loop, cst.For):
                continue
            iterated = self.ctx.steps.loop_iterable(loop)
            if isinstance(iterated, cst.Call) and self.ctx.qualnames(iterated.func) & set(DEVICE_LOADERS):
                args = patterns.positional(iterated)
                iterated = args[0].value if args else iterated
            spelling = patterns.dotted_name(iterated)
            if spelling is not None:
                names.add(device_loader_args.get(spelling, spelling))
        return names

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and self.ctx.qualnames(node.value.func) & set(DATALOADERS):
            if any(patterns.dotted_name(t.target) in self._iterated for t in node.targets):
                self._loader(node.value)
        loop = self._training_step(node)
        if loop is not None and self._is_mask(node.value, loop):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self._masks.setdefault(loop, set()).add(target.target.value)

    def visit_For(self, node: cst.For) -> None:
        if node in self.ctx.steps.training_loops:
            iterated = self.ctx.steps.loop_iterable(node)
            if isinstance(iterated, cst.Call) and self.ctx.qualnames(iterated.func) & set(DATALOADERS):
                self._loader(iterated)

    def _loader(self, call: cst.Call) -> None:
        if patterns.keyword(call, "batch_sampler") is not None or any(a.star for a in call.args):
            return
        batch_size = patterns.keyword(call, "batch_size")
        if batch_size is not None and patterns.dotted_name(batch_size.value) == "None":
            return
        drop_last = patterns.keyword(call, "drop_last")
        if drop_last is None:
            what = "without drop_last=True"
        elif patterns.dotted_name(drop_last.value) == "False":
            what = "with drop_last=False"
        else:
            return
        self.finding(call, f"training DataLoader {what}: a smaller last batch has a new shape and compiles the "
                           "step again", "pass drop_last=True (or make the dataset a multiple of the batch size)")

    def _trainer_loader(self, call: cst.Call) -> None:
        drop_last = patterns.keyword(call, "dataloader_drop_last")
        if drop_last is None and hf_common.has_star_kwargs(call):
            return
        if drop_last is None or patterns.dotted_name(drop_last.value) == "False":
            what = "without dataloader_drop_last=True" if drop_last is None else "with dataloader_drop_last=False"
            self.finding(drop_last or call, f"{short(call.func)}(...) {what}: the Trainer's smaller last batch "
                                            "has a new shape and compiles the step again",
                         "pass dataloader_drop_last=True")

    # Masks and data-dependent sizes in the loop ----------------------------------------------------------------
    def _is_mask(self, node: cst.BaseExpression, loop: object) -> bool:
        if isinstance(node, cst.Comparison):
            return True
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return self._is_mask(node.expression, loop)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr)):
            return self._is_mask(node.left, loop) or self._is_mask(node.right, loop)
        if isinstance(node, cst.Call):
            dtype = patterns.keyword(node, "dtype")  # torch.eye(n, dtype=torch.bool): SimCLR's mask
            return bool(self.ctx.qualnames(node.func) & set(MASK_CALLS)) or bool(patterns.method_call(node, "bool")) \
                or (dtype is not None and patterns.dotted_name(dtype.value) in ("torch.bool", "bool"))
        return isinstance(node, cst.Name) and node.value in self._masks.get(loop, set())

    # Padding to each batch's longest, a device corpus sliced per step (what XLA316 does not rewrite) --------
    def visit_Module(self, node: cst.Module) -> None:
        ctx = self.ctx
        rewrites = ctx.runs("XLA316") and not ctx.facts.runs_on_xla
        for collate in shapes.padded_collates(ctx):
            if rewrites and static_batch_shapes.rewritable(collate):
                continue
            name = shapes.collate_name(ctx, collate.function)
            if collate.kind == "pad_sequence":
                why = ("no maximum length in the script to pad to" if collate.length is None
                       else "its sequences are not a plain list name" if not static_batch_shapes.rewritable(collate)
                       else "XLA316 is not part of this run")
                self.finding(collate.node, f"{short(collate.node)} in the collate function {name}(): pads each "
                                           f"batch to its own longest sequence ({why}): a new graph for every "
                                           "new length", PAD_FIX)
            else:
                self.finding(collate.node, f"{short(collate.node)} in the collate function {name}(): pads each "
                                           "batch to its own largest size: a new graph for every new size", PAD_FIX)
        for move in box_counts.counted_moves(ctx) if ctx.steps.training_loops else ():
            self.finding(move.node, box_counts.message(ctx, move), box_counts.BOX_FIX)
        corpora = shapes.device_corpora(ctx)
        reported: set[cst.CSTNode] = set()
        for corpus in corpora:
            if rewrites and static_batch_shapes.corpus_rewritable(ctx, corpus):
                reported.update(corpus.slices)
                continue
            for piece in corpus.slices:
                reported.add(piece)
                self.finding(piece, f"{short(piece)}: {corpus.slicer.name.value}() slices a corpus that "
                                    f"{corpus.producer.name.value}() put on the device, at a new offset every "
                                    "step: a new graph per offset", SLICE_FIX)
        for piece in shapes.offset_slices(ctx):
            region = ctx.steps.region(piece)
            if piece not in reported and region is not None and ctx.steps.is_decode_loop(region.step):
                self.finding(piece, f"{short(piece)}: a slice to a length that changes as rows finish (the decode "
                                    f"loop at line {ctx.position(region.step.loop)[0]}): a new graph per live "
                                    "batch size", DECODE_FIX)
            elif piece not in reported:
                self.finding(piece, f"{short(piece)}: a slice of a device tensor at an offset that changes every "
                                    "step: the offsets are constants of the graph, a new graph per offset",
                             SLICE_FIX)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        loop = self._training_step(node)
        if loop is None:
            return
        self._random_slice(node)
        for element in node.slice:
            if isinstance(element.slice, cst.Index) and self._is_mask(element.slice.value, loop):
                self.finding(node, f"{short(node)}{self._where(node)}: boolean-mask indexing gives a shape that "
                                   "depends on the data", MASK_FIX)
                return

    def _where(self, node: cst.CSTNode) -> str:
        """`` in info_nce() (called every step at line 25: self.info_nce(features))`` for a node in a function
        the step calls; the foreign step's description for one a loop of another module runs; else ""."""
        region = self._region(node)
        if region is None:
            return self.ctx.steps.foreign_step(node) or ""
        if not region.in_callee or region.function is None:
            return ""
        call = region.path[0]
        return (f" in {region.function.name.value}() (called every step at line {self.ctx.position(call)[0]}: "
                f"{short(call, 50)})")

    def _feeds_every_step(self, node: cst.Call) -> bool:
        """The call runs in every step and its value is used (``loss = criterion(...)``): not a statement of its
        own (``plot_images(...)``) nor under an ``if`` of the loop (a validation on the last batch), whose
        helpers are host code or run once an epoch (yolov5's plots and ``validate.run``)."""
        region = self._region(node)
        statement = self.ctx.enclosing_statement(node)
        if region is None or statement is None:
            return False
        if isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr):
            return False
        stop = region.function if region.in_callee else region.step.loop
        current = self.ctx.parent(statement)
        while current is not None and current is not stop:
            if isinstance(current, (cst.If, cst.Else)):
                return False
            current = self.ctx.parent(current)
        return True

    def _imported_mask_index(self, node: cst.Call) -> None:
        """A call in the step of a function of another project module that indexes with a boolean mask (an
        imported loss: the project index says where)."""
        if self.ctx.project is None or self.ctx.steps.callee(node) is not None or not self._feeds_every_step(node):
            return
        for name in sorted(self.ctx.qualnames(node.func)):
            found = self.ctx.project.mask_index(name)
            if found is not None:
                path, line, code = found
                self.finding(node, f"{short(node)}: {short(node.func)}() indexes with a boolean mask every step "
                                   f"({path}:{line}: {code[:60]}): a shape that depends on the data",
                             MASK_FIX)
                return

    def _random_slice(self, node: cst.Subscript) -> None:
        """A slice of a device tensor at offsets a host random draw gives (a random crop)."""
        ctx = self.ctx
        function = ctx.steps.function_of(node)
        if function not in self._random:
            self._random[function] = geometry.random_names(ctx, function if function is not None else ctx.module)
        names = self._random[function]
        if not names or not geometry.random_bounds(node, names):
            return
        region = ctx.steps.training_region(node)
        if region is None or not geometry.tensor_like(node, ctx.steps.tensor_names(region)):
            return
        where = f" in {function.name.value}()" if function is not None and region.in_callee else ""
        self.finding(node, f"{short(node)}{where}: a slice at offsets drawn on the host (random) every step: the "
                           "offsets are constants of the graph, a new graph per draw", geometry.CROP_FIX)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._coin_toss(node, node.test)

    def visit_If(self, node: cst.If) -> None:
        self._coin_toss(node, node.test)

    def _coin_toss(self, node: cst.IfExp | cst.If, test: cst.BaseExpression) -> None:
        """A host coin toss, in a loop the training step repeats (a decoder's time steps, in the step or in the
        forward of the model it runs), choosing what the next iteration computes (teacher forcing)."""
        ctx = self.ctx
        statement = node if isinstance(node, cst.If) else ctx.enclosing_statement(node)
        if statement is None:
            return
        statement = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else statement
        region = ctx.steps.region(statement) or ctx.steps.called_region(statement)
        if region is None or region.step.kind != "train":
            return
        loop = geometry.inner_loop(ctx, node, ctx.steps.function_of(statement))
        if loop is None:
            return  # once per step: two graphs in all
        if loop not in self._random:
            self._random[loop] = geometry.random_names(ctx, loop)  # tossed anew in each iteration
        if not geometry.tossed(ctx, test, self._random[loop]):
            return
        what = short(node) if isinstance(node, cst.IfExp) else f"if {short(test)}:"
        header = (f"for {short(loop.target, 20)} in {short(loop.iter, 40)}" if isinstance(loop, cst.For)
                  else f"while {short(loop.test, 40)}")
        self.finding(node, f"{what}: a coin toss on the host in a loop of the training step ({header}) chooses "
                           "what each iteration computes: a new graph for nearly every pattern of tosses, so "
                           "nearly every step compiles", geometry.TOSS_FIX)

    def _random_crop_call(self, node: cst.Call) -> None:
        """A call in the step of a function of this module that slices at host-random offsets (a crop helper
        the step model does not count as part of the step, since it runs no step work of its own)."""
        ctx = self.ctx
        target = ctx.steps.callee(node)
        if target is None and ctx.project is not None:
            self._imported_random_crop(node)
            return
        if target is None or target in ctx.steps.step_functions:
            return  # a step function: its slices are reported where they are
        if target not in self._random:
            self._random[target] = geometry.random_names(ctx, target)
        names = self._random[target]
        slices = [s for s in patterns.find_all(target, lambda n: isinstance(n, cst.Subscript))
                  if names and geometry.random_bounds(s, names) and geometry.tensor_like(s, set())]
        if not slices:
            return
        first = slices[0]
        self.finding(node, f"{short(node)}: {target.name.value}() slices at offsets drawn on the host every step "
                           f"(line {ctx.position(first)[0]}: {short(first)}): the offsets are constants of the "
                           "graph, a new graph per draw", geometry.CROP_FIX)

    def _imported_random_crop(self, node: cst.Call) -> None:
        """The same, for a helper of another module of the project (the project index)."""
        for name in sorted(self.ctx.qualnames(node.func)):
            found = self.ctx.project.random_slice(name)
            if found is not None:
                path, line, code = found
                self.finding(node, f"{short(node)}: {short(node.func)}() slices at offsets drawn on the host every "
                                   f"step ({path}:{line}: {code[:60]}): the offsets are constants of the graph, a "
                                   "new graph per draw", geometry.CROP_FIX)
                return

    def _offset_window_call(self, node: cst.Call) -> None:
        """A call in the step of a helper that slices a device tensor it is handed at the offset the loop hands
        it (``data, targets = get_batch(train_data, i, args)`` with ``source[:, i:i + seq_len]`` in get_batch:
        TCN's word_cnn), a function of this module or of another project module (the project index): reported
        at the call, naming the slice, as ``offset_slices`` reports the same slice written in the loop."""
        ctx = self.ctx
        region = self._region(node)
        if region is None or region.in_callee:
            return
        found = self._window_helper(node)
        if found is None:
            return
        where, sliced, offset, code = found
        args = patterns.positional(node)
        if len(args) <= max(sliced, offset) or any(a.star for a in args[:max(sliced, offset) + 1]):
            return
        corpus = args[sliced].value
        if not isinstance(corpus, cst.Name) or not self._loop_offset(args[offset].value, region.step.loop):
            return
        moved = self._device_binding(corpus)
        if moved is None:
            return
        self.finding(node, f"{short(node)}: {short(node.func)}() slices {corpus.value} (on the device: line "
                           f"{ctx.position(moved)[0]}) at an offset that changes every step ({where}: {code[:60]}): "
                           "the offsets are constants of the graph, a new graph per offset", WINDOW_FIX)

    def _window_helper(self, node: cst.Call) -> tuple[str, int, int, str] | None:
        """(where, sliced parameter's index, offset parameter's index, code) of the first slice the called
        helper takes of one parameter at an offset another gives (``source[:, i:i + seq_len]``)."""
        ctx = self.ctx
        target = ctx.steps.callee(node)
        if target is None:
            if ctx.project is None:
                return None
            for name in sorted(_project_names(ctx, node.func)):
                found = ctx.project.offset_slice(name)
                if found is not None:
                    path, sliced, offset, line, code = found
                    return f"{path}:{line}", sliced, offset, code
            return None
        if ctx.steps.class_of(target) is not None or any(c.slicer is target for c in shapes.device_corpora(ctx)):
            return None  # a method (self shifts the arguments); a batch function XLA316 or the corpus report covers
        params = [p.name.value for p in (*target.params.posonly_params, *target.params.params)]
        for piece in patterns.find_all(target.body, lambda n: isinstance(n, cst.Subscript)):
            if not (isinstance(piece.value, cst.Name) and piece.value.value in params):
                continue
            for element in piece.slice:
                bound = element.slice
                if not isinstance(bound, cst.Slice) or bound.lower is None or isinstance(bound.lower, cst.Integer):
                    continue
                offsets = [n.value for n in patterns.find_all(bound.lower, lambda n: isinstance(n, cst.Name))
                           if n.value in params and n.value != piece.value.value]
                if offsets:
                    return (f"line {ctx.position(piece)[0]}", params.index(piece.value.value),
                            params.index(offsets[0]), short(piece))
        return None

    def _loop_offset(self, value: cst.BaseExpression, loop: cst.CSTNode) -> bool:
        """``value`` mentions a variable of the step loop: its target or a name its body binds."""
        names: set[str] = set()
        if isinstance(loop, cst.For):
            names.update(n.value for n in patterns.find_all(loop.target, lambda n: isinstance(n, cst.Name)))
        for target in patterns.find_all(loop.body, lambda n: isinstance(n, (cst.AssignTarget, cst.AugAssign))):
            if isinstance(target.target, cst.Name):
                names.add(target.target.value)
        return any(n.value in names for n in patterns.find_all(value, lambda n: isinstance(n, cst.Name)))

    def _device_binding(self, name: cst.Name) -> cst.Assign | None:
        """The binding that puts ``name`` on the device: ``x = data.to(device)`` / ``.cuda()``, or a call of a
        function that returns such a move (this module's, or another project module's: TCN's ``batchify``)."""
        ctx = self.ctx
        scope = ctx.scopes.get(name)
        if scope is None:
            return None
        for assignment in scope[name.value]:
            target = getattr(assignment, "node", None)
            holder = ctx.parent(target) if isinstance(target, cst.CSTNode) else None
            assign = ctx.parent(holder) if isinstance(holder, cst.AssignTarget) else None
            if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
                continue
            value = assign.value
            if _device_move(value) or self._returns_on_device(value):
                return assign
        return None

    def _returns_on_device(self, call: cst.Call) -> bool:
        ctx = self.ctx
        target = ctx.steps.callee(call)
        if target is None:
            return ctx.project is not None and any(ctx.project.returns_on_device(n) for n in
                                                     _project_names(ctx, call.func))
        returns = patterns.find_all(target.body, lambda n: isinstance(n, cst.Return))
        moved = {t.target.value for a in patterns.find_all(target.body, lambda n: isinstance(n, cst.Assign))
                 if isinstance(a.value, cst.Call) and _device_move(a.value)
                 for t in a.targets if isinstance(t.target, cst.Name)}
        return bool(returns) and all(r.value is not None and (
            (isinstance(r.value, cst.Call) and _device_move(r.value))
            or (isinstance(r.value, cst.Name) and r.value.value in moved)) for r in returns)

    def _cutmix(self, node: cst.Call) -> None:
        """timm's Mixup with CutMix (torchvision's v2.CutMix) applied in the step to a device batch."""
        ctx = self.ctx
        if not geometry.is_cutmix_call(ctx, node, self._cutmix_bound):
            return
        region = ctx.steps.training_region(node)
        scope = region.function if region is not None and region.in_callee else (
            region.step.loop if region is not None else None)
        on_device = region is not None and (ctx.steps.iterates_device_loader(region.step) or (
            scope is not None and geometry.moved_to_device(ctx, node, scope)))
        if not on_device:
            return
        self.finding(node, f"{short(node)}: a CutMix batch augmentation on the device batch pastes a box drawn on "
                           "the host: its corners are constants of the graph, a new compilation for most steps",
                     geometry.CUTMIX_FIX)

    def visit_Call(self, node: cst.Call) -> None:
        if hf_common.is_training_args_class(self.ctx, node.func, self._training_args):
            self._trainer_loader(node)
        if self._training_step(node) is None:
            return
        self._cutmix(node)
        self._random_crop_call(node)
        self._offset_window_call(node)
        self._imported_mask_index(node)
        names = self.ctx.qualnames(node.func)
        one_arg_where = "torch.where" in names and len(node.args) == 1
        data_dependent = patterns.method_call(node, "nonzero", "masked_select", "unique")
        if names & set(DATA_DEPENDENT) or one_arg_where or data_dependent:
            self.finding(node, f"{short(node)}{self._where(node)}: the result's size depends on the data", MASK_FIX)


def _device_move(call: cst.Call) -> bool:
    """``x.cuda()``, ``x.to(device)``, ``x.to("cuda")`` (a name that says device, or a CUDA string)."""
    method = patterns.method_call(call, "to", "cuda")
    if method is None:
        return False
    if method.attr.value == "cuda":
        return True
    args = patterns.positional(call)
    if not args:
        return False
    text = patterns.string_value(args[0].value)
    if text is not None:
        return text.startswith("cuda")
    return "device" in (patterns.dotted_name(args[0].value) or "").lower()


def _project_names(ctx, func: cst.BaseExpression) -> frozenset[str]:
    """The qualified names of a callee, or its bare name where none resolves (``from utils import *``: the
    project index finds the module the star import takes it from)."""
    names = ctx.qualnames(func)
    if not names and isinstance(func, cst.Name):
        return frozenset({func.value})
    return names
