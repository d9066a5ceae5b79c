"""XLA111 cuda-streams-removed: a side CUDA stream (a data prefetcher's) is removed; its code runs as it is.

What it does:
    Removes the stream code of a side-stream prefetcher, where every use of the stream is one it can remove:
    ``self.stream = torch.cuda.Stream()`` -> ``self.stream = None``; ``with torch.cuda.stream(self.stream):``
    -> its body, run in place; ``torch.cuda.current_stream().wait_stream(self.stream)``,
    ``self.stream.wait_stream(...)``, ``self.stream.synchronize()`` and ``t.record_stream(...)`` (of such a
    stream or of ``torch.cuda.current_stream()``) go. A stream used any other way (passed on, tested,
    returned) is left as it is, with every line of it reported by XLA103. A context that selects the CUDA
    device, ``with torch.cuda.device(args.gpu_index):`` (SimCLR), becomes its body too: a process has one XLA
    device, and on a host without CUDA the context raises where the original, given index -1, did nothing.

Why:
    A CUDA stream only overlaps a host-to-device copy with compute; XLA has no user streams (the device
    loader, ``MpDeviceLoader``, overlaps the transfer) and ``torch.cuda.Stream()`` raises on a host without
    CUDA ("Torch not compiled with CUDA enabled", or no NVIDIA driver), at the prefetcher's construction.
    Without the stream the prefetcher keeps its meaning: the batch is on the device when ``next()`` returns.

Example:
    self.stream = torch.cuda.Stream()
    with torch.cuda.stream(self.stream):
        self.batch = [t.to(self.device, non_blocking=True) for t in self.batch]
    torch.cuda.current_stream().wait_stream(self.stream)

Use instead:
    self.stream = None
    self.batch = [t.to(self.device, non_blocking=True) for t in self.batch]
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

STREAM_CLASSES = ("torch.cuda.Stream", "torch.cuda.streams.Stream")
STREAM_CONTEXTS = ("torch.cuda.stream", "torch.cuda.streams.stream")
CURRENT_STREAMS = ("torch.cuda.current_stream", "torch.cuda.default_stream")
# Contexts that select the current CUDA device (SimCLR's `with torch.cuda.device(args.gpu_index):`).
DEVICE_CONTEXTS = ("torch.cuda.device", "torch.cuda.device_of")
# Methods whose call, as a statement, only orders work between CUDA streams.
_ORDERING = ("wait_stream", "synchronize")


class CudaStreamsRemoved(Rule):
    code = "XLA111"
    name = "cuda-streams-removed"
    summary = "side CUDA streams (torch.cuda.Stream, with torch.cuda.stream, wait_stream, record_stream) removed"
    on_xla_code = True  # a CUDA stream in code that already runs on XLA fails the same way

    def visit_Module(self, node: cst.Module) -> None:
        if "stream" not in self.ctx.input_code and "cuda.device" not in self.ctx.input_code:
            return
        calls = patterns.find_all(node, lambda n: isinstance(n, cst.Call))
        for call in calls:
            if self.ctx.is_call_to(call, *STREAM_CLASSES):
                self._stream(call)
        for call in calls:
            if self.ctx.is_call_to(call, *STREAM_CONTEXTS):
                self._context(call, None)
            elif self.ctx.is_call_to(call, *DEVICE_CONTEXTS) and self._plain_argument(call):
                self._unwrap(call, f"with {patterns.code_of(call)}: -> its body: one XLA device per process, "
                                   "no CUDA device to select (on a host without CUDA the context raises)")
            elif patterns.method_call(call, "record_stream"):
                self._ordering(call, None)
            elif patterns.method_call(call, "wait_stream") and self._current(call.func.value):
                self._ordering(call, None)

    # A stream bound to a name or an attribute of self -------------------------------------------------------
    def _stream(self, creation: cst.Call) -> None:
        assign = self.ctx.parent(creation)
        if not (isinstance(assign, cst.Assign) and assign.value is creation and len(assign.targets) == 1):
            return
        target = assign.targets[0].target
        uses = self._uses(target, assign)
        if uses is None:
            return  # a stream this rule does not follow: XLA103 reports each torch.cuda line
        kept = sorted({self.ctx.position(use)[0] for use in uses if not self._removable_use(use, target)})
        if kept:
            self.finding(creation, f"{patterns.code_of(target)} = {patterns.code_of(creation)}: a CUDA stream used "
                         f"otherwise than this rule can remove (line{'s' if len(kept) > 1 else ''} "
                         f"{', '.join(map(str, kept))}); it raises on a host without CUDA",
                         "drop the stream: run the code of `with torch.cuda.stream(...)` in place, delete "
                         "wait_stream/record_stream/synchronize on it and treat the stream as absent at the "
                         "lines named (XLA orders device work itself; the device loader overlaps the copy)")
            return
        self.replace(creation, cst.Name("None"), f"{patterns.code_of(creation)} -> None: XLA has no CUDA streams "
                     "(the device loader overlaps the transfer)")
        for use in uses:
            call = self._call_around(use)
            if call is not None and self.ctx.is_call_to(call, *STREAM_CONTEXTS):
                self._context(call, target)
            elif call is not None:
                self._ordering(call, target)

    def _uses(self, target: cst.BaseExpression, assign: cst.Assign) -> list[cst.CSTNode] | None:
        """Every read of the stream: a local name in its function (the module for a global), ``self.<attr>`` in
        its class. None for a target this rule does not follow."""
        name = patterns.dotted_name(target)
        if isinstance(target, cst.Name):
            where = self._enclosing(assign, (cst.FunctionDef,)) or self.ctx.module
            if where is self.ctx.module and self._rebound_in_functions(name):
                return None
            matches = patterns.find_all(where, lambda n: isinstance(n, cst.Name) and n.value == name)
        elif name is not None and name.startswith("self.") and name.count(".") == 1:
            where = self._enclosing(assign, (cst.ClassDef,))
            if where is None or self._subclassed(where):
                return None  # a subclass may read the stream where this rule does not look
            matches = patterns.find_all(where, lambda n: isinstance(n, cst.Attribute)
                                        and patterns.dotted_name(n) == name)
        else:
            return None
        return [m for m in matches if m is not target and not self._other_write(m)]

    def _subclassed(self, cls: cst.ClassDef) -> bool:
        return bool(patterns.find_all(self.ctx.module, lambda n: isinstance(n, cst.ClassDef) and any(
            (patterns.dotted_name(base.value) or "").rsplit(".", 1)[-1] == cls.name.value for base in n.bases)))

    def _rebound_in_functions(self, name: str) -> bool:
        return bool(patterns.find_all(self.ctx.module, lambda n: isinstance(n, (cst.Global, cst.Nonlocal))
                                      and any(item.name.value == name for item in n.names)))

    def _other_write(self, node: cst.CSTNode) -> bool:
        """Another assignment of the name (``self.stream = None``): a write, not a use."""
        parent = self.ctx.parent(node)
        return isinstance(parent, cst.AssignTarget) and parent.target is node

    def _removable_use(self, use: cst.CSTNode, target: cst.BaseExpression) -> bool:
        call = self._call_around(use)
        if call is None:
            return False
        if self.ctx.is_call_to(call, *STREAM_CONTEXTS):
            return self._unwrappable(call)
        return self._ordering_statement(call) is not None

    def _call_around(self, use: cst.CSTNode) -> cst.Call | None:
        """The call that takes the stream: ``torch.cuda.stream(s)``, ``x.wait_stream(s)``,
        ``t.record_stream(s)``, or ``s.wait_stream(...)`` / ``s.synchronize()`` on it."""
        parent = self.ctx.parent(use)
        if isinstance(parent, cst.Arg) and parent.keyword is None:
            call = self.ctx.parent(parent)
            return call if isinstance(call, cst.Call) and len(call.args) == 1 else None
        if isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value in _ORDERING:
            call = self.ctx.parent(parent)
            return call if isinstance(call, cst.Call) and call.func is parent else None
        return None

    # The edits -------------------------------------------------------------------------------------------
    def _context(self, call: cst.Call, stream: cst.BaseExpression | None) -> None:
        """``with torch.cuda.stream(s):`` -> the body, in place. Without a known stream (``stream`` None) only
        for a stream made right there or none (``torch.cuda.stream(torch.cuda.Stream())``, ``(None)``)."""
        if not self._unwrappable(call):
            return
        if stream is None:
            arg = call.args[0].value if len(call.args) == 1 else None
            if not (patterns.dotted_name(arg) == "None"
                    or (isinstance(arg, cst.Call) and self.ctx.is_call_to(arg, *STREAM_CLASSES) and not arg.args)):
                return
        self._unwrap(call, f"with {patterns.code_of(call)}: -> its body: XLA has no CUDA streams")

    def _plain_argument(self, call: cst.Call) -> bool:
        """``torch.cuda.device(args.gpu_index)``: an argument whose evaluation does nothing else."""
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            return False
        value = call.args[0].value
        return isinstance(value, (cst.Integer, cst.Name, cst.SimpleString)) or (
            patterns.dotted_name(value) is not None) or (
            isinstance(value, cst.Subscript) and patterns.dotted_name(value.value) is not None)

    def _unwrap(self, call: cst.Call, note: str) -> None:
        if not self._unwrappable(call):
            return
        statement = self.ctx.parent(self.ctx.parent(call))
        if statement in self.ctx.edits.replace:
            return

        def unwrapped(updated: cst.With) -> cst.BaseStatement | cst.FlattenSentinel:
            suite = updated.body
            if isinstance(suite, cst.SimpleStatementSuite):
                body = [cst.SimpleStatementLine(body=suite.body, trailing_whitespace=suite.trailing_whitespace)]
            else:
                body = list(suite.body)
            first = body[0].with_changes(leading_lines=[*updated.leading_lines, *body[0].leading_lines])
            return cst.FlattenSentinel([first, *body[1:]]) if len(body) > 1 else first

        self.replace(statement, unwrapped, note)

    def _unwrappable(self, call: cst.Call) -> bool:
        """The only item of a ``with`` (no ``as``), whose block keeps no comment on its header or after it."""
        item = self.ctx.parent(call)
        statement = self.ctx.parent(item)
        if not (isinstance(item, cst.WithItem) and item.asname is None and isinstance(statement, cst.With)
                and len(statement.items) == 1 and statement.asynchronous is None):
            return False
        suite = statement.body
        return isinstance(suite, cst.SimpleStatementSuite) or (not suite.footer and suite.header.comment is None)

    def _ordering(self, call: cst.Call, stream: cst.BaseExpression | None) -> None:
        """``torch.cuda.current_stream().wait_stream(s)``, ``s.synchronize()``, ``t.record_stream(s)``: gone.
        Without a known stream only what names the current stream (``t.record_stream(
        torch.cuda.current_stream())``, ``torch.cuda.current_stream().wait_stream(torch.cuda.Stream())``)."""
        line = self._ordering_statement(call)
        if line is None:
            return
        if stream is None:
            args = [a.value for a in call.args]
            if not (len(args) == 1 and (self._current(args[0]) or self._current(call.func.value))):
                return
            if patterns.method_call(call, "wait_stream") and not self._current(args[0]) and not (
                    isinstance(args[0], cst.Call) and self.ctx.is_call_to(args[0], *STREAM_CLASSES)):
                return  # another stream, made elsewhere: removed with it when this rule removes it
        if line in self.ctx.edits.remove or any(small in self.ctx.edits.remove for small in line.body):
            return
        small = next(s for s in line.body if isinstance(s, cst.Expr) and s.value is call)
        loop = self._loop_around(line if len(line.body) == 1 else None)
        self.remove(loop or small, f"removed {patterns.code_of(call)}{' and its loop' if loop else ''}: XLA has no "
                    "CUDA streams to order")

    def _loop_around(self, line: cst.SimpleStatementLine | None) -> cst.For | None:
        """``for t in batch: t.record_stream(...)``: the loop whose whole body is the line, over a plain name."""
        block = self.ctx.parent(line) if line is not None else None
        loop = self.ctx.parent(block) if isinstance(block, cst.IndentedBlock) and len(block.body) == 1 else None
        if not (isinstance(loop, cst.For) and loop.orelse is None and loop.asynchronous is None
                and patterns.dotted_name(loop.iter) is not None and not block.footer
                and block.header.comment is None):
            return None
        return loop

    def _ordering_statement(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The line of ``call`` when the call is a statement of its own that orders streams."""
        method = patterns.method_call(call, "wait_stream", "record_stream", "synchronize")
        expr = self.ctx.parent(call)
        line = self.ctx.parent(expr)
        if method is None or not (isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine)):
            return None
        if method.attr.value == "synchronize" and call.args:
            return None
        return line

    def _current(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Call) and self.ctx.is_call_to(node, *CURRENT_STREAMS)

    def _enclosing(self, node: cst.CSTNode, kinds: tuple[type, ...]) -> cst.CSTNode | None:
        current = self.ctx.parent(node)
        while current is not None and not isinstance(current, kinds):
            current = self.ctx.parent(current)
        return current
