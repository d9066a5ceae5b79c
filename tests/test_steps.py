"""The step model (src/xla_migrate/analysis/steps/): what it sees in a loop, and what the loop rules do with it that
the goldens cannot show (which rule reports a read once another moves it, call paths, idempotence of the
runnable fixtures' migrations)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from xla_migrate import migrate
from xla_migrate.engine.context import MigrationContext
from xla_migrate.engine.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = ROOT / "fixtures" / "runnable"
STEP_SHAPES = ["stepper_object", "per_batch_method", "accumulation_clip", "eval_counts", "hidden_state",
               "finite_check"]


def model_of(source: str, target: str = "2.9", distributed: bool | None = None,
             data_parallel: str | None = None) -> MigrationContext:
    module = cst.parse_module(textwrap.dedent(source))
    return MigrationContext(cst.MetadataWrapper(module), get_target(target), distributed=distributed,
                            data_parallel=data_parallel)


def loops_by_line(ctx: MigrationContext) -> dict[int, object]:
    return {ctx.position(loop)[0]: step for loop, step in ctx.steps.loops.items()}


def code_at(ctx: MigrationContext, node: cst.CSTNode) -> str:
    return " ".join(cst.Module(body=[]).code_for_node(node).split())


STEPPER = """\
import torch

class NativeScaler:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        if clip_grad is not None:
            self._scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()

def train_one_epoch(model, criterion, loader, optimizer, loss_scaler):
    for samples, targets in loader:
        loss = criterion(model(samples), targets)
        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())
        print(loss.item())

def main():
    loss_scaler = NativeScaler()
"""


def test_a_loss_scaler_object_makes_its_loop_a_training_loop():
    ctx = model_of(STEPPER)
    (step,) = ctx.steps.loops.values()
    assert step.kind == "train" and ctx.position(step.loop)[0] == 16
    # backward, unscale, clip, step and update come from NativeScaler.__call__, through the call in the loop
    kinds = [(e.kind, ctx.position(e.node)[0], len(e.path)) for e in step.events if e.path]
    assert ("backward", 8, 1) in kinds and ("step", 12, 1) in kinds and ("scaler_update", 13, 1) in kinds
    assert ("unscale", 10, 1) in kinds and ("clip", 11, 1) in kinds
    assert step.batches.how == "loader" and step.accumulation is None
    # The barrier goes after the call that runs the update, so the print after it reads a computed value.
    assert code_at(ctx, step.barrier_site.statement).startswith("loss_scaler(loss, optimizer")


def test_accumulation_by_micro_steps_and_by_a_guard():
    ctx = model_of("""\
        def train(model, optimizer, get_batch, loader, accum):
            for it in range(100):
                for micro_step in range(accum):
                    x, y = get_batch("train")
                    loss = model(x, y) / accum
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                print(loss.item())
            for i, (x, y) in enumerate(loader):
                model(x, y).backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                scheduler.step()
        """)
    steps = loops_by_line(ctx)
    assert set(steps) == {2, 11}, "the micro-step loop is part of the outer loop's step"
    micro, guard = steps[2], steps[11]
    assert micro.accumulation == "micro-steps" and [ctx.position(m)[0] for m in micro.micro_loops] == [3]
    assert code_at(ctx, micro.barrier_site.statement) == "optimizer.zero_grad(set_to_none=True)"
    assert guard.accumulation == "guard" and code_at(ctx, guard.barrier_site.statement) == "optimizer.zero_grad()"
    # A guarded accumulation gets the barrier, not the device loader (which would mark every micro-step).
    assert guard.loader is not None and not ctx.steps.gets_device_loader(guard)
    # A read in the micro-steps runs in the step; the print after the update runs after the barrier.
    region = ctx.steps.region(ctx.steps.loops[micro.loop].backwards[0].node)
    assert region is not None and region.step is micro
    printed = [e for e in micro.events if e.kind == "read"][0]
    assert ctx.steps.after_step_end(printed.node, ctx.steps.region(printed.node))


def test_evaluation_loops_and_the_forward_part_of_a_step():
    ctx = model_of("""\
        def evaluate(model, data_source, get_batch):
            hidden = model.init_hidden(10)
            for i in range(0, data_source.size(0) - 1, 35):
                data, targets = get_batch(data_source, i)
                output, hidden = model(data, hidden)

        def encode(encoder, tokens, hidden, optimizer):
            for token in tokens:
                output, hidden = encoder(token, hidden)
            output.sum().backward()
            optimizer.step()

        def train(model, loader, val_loader, optimizer):
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
                for vx in val_loader:
                    model(vx)
            for p in model.parameters():
                p.data.zero_()
        """)
    steps = loops_by_line(ctx)
    assert steps[3].kind == "eval" and steps[3].batches.how == "function"
    assert code_at(ctx, steps[3].barrier_site.statement) == "output, hidden = model(data, hidden)"
    assert 8 not in steps, "a loop that a backward follows is the forward part of a training step"
    assert steps[14].kind == "train"
    assert steps[17].kind == "eval", "a validation loop after the update is an evaluation loop"
    assert 19 not in steps, "a loop with no forward is no step"


def test_calls_that_name_a_model_but_run_none_make_no_evaluation_loop():
    # ignite's distributed utils: a loop over computation-model classes, a helper that sets the model.
    ctx = model_of("""\
        def sync(classes, backend):
            for comp_model_cls in classes:
                model = comp_model_cls.create_from_context()
                _set_model(model)
            for model_class in classes:
                build_model(model_class(backend))

        def evaluate(model, batches):
            for x in batches:
                model(x)
        """)
    steps = loops_by_line(ctx)
    assert 2 not in steps and 5 not in steps, "class and helper calls are no forward"
    assert steps[9].kind == "eval"


def test_a_per_step_method_is_a_region_of_its_loop_with_a_call_path():
    ctx = model_of("""\
        class Trainer:
            def _run_batch(self, source, targets):
                loss = self.model(source)
                loss.backward()
                self.optimizer.step()
                return loss.item()

            def _run_epoch(self):
                for source, targets in self.train_data:
                    self._run_batch(source, targets)
        """)
    (step,) = ctx.steps.loops.values()
    ret = next(n for n in ctx.steps._c.where if isinstance(n, cst.Return))
    region = ctx.steps.region(ret)
    assert region.step is step and region.in_callee and region.function.name.value == "_run_batch"
    from xla_migrate.analysis.steps import describe_path
    assert describe_path(ctx, region) == (" in Trainer._run_batch (run every step by the loop at line 9: "
                                          "self._run_batch(...))")


def test_the_gradient_reduction_goes_in_the_callee_before_its_first_gradient_read():
    ctx = model_of(STEPPER.replace("import torch\n", "import torch\nimport torch.distributed as dist\n"
                                                     "dist.init_process_group('nccl')\n"), target="sagemaker",
                   data_parallel="xm")
    (reduction,) = ctx.steps.reductions
    assert isinstance(reduction.within, cst.FunctionDef) and reduction.within.name.value == "__call__"
    assert code_at(ctx, reduction.backward) == "self._scaler.scale(loss).backward()"
    assert code_at(ctx, reduction.first_touch) == "self._scaler.unscale_(optimizer)"
    assert reduction.optimizers == ("optimizer",)
    result = migrate(ctx.module.code, target="sagemaker", data_parallel="xm")
    lines = [line.strip() for line in result.code.splitlines()]
    backward = lines.index("self._scaler.scale(loss).backward()")
    assert lines[backward + 2].startswith("gradients = xm._fetch_gradients(optimizer)")
    assert lines[backward + 4] == "if clip_grad is not None:", "the reduction runs whether or not it clips"


def test_moved_reads_are_not_reported_and_reads_that_stay_are_with_their_path():
    source = (ROOT / "fixtures" / "XLA313" / "per_batch_method.in.py").read_text()
    everything = migrate(source, target="2.9")
    reported = [(f.line, f.code) for f in everything.findings]
    assert (16, "XLA311") not in reported, "XLA313 keeps _run_batch's loss on the device"
    assert (31, "XLA311") in reported, "train_step's result is kept in a list: the read stays and is reported"
    message = next(f.message for f in everything.findings if f.line == 31)
    assert "in train_step (run every step by the loop at line 36: train_step(...))" in message
    alone = migrate(source, target="2.9", select=["XLA311"])
    assert {f.line for f in alone.findings} == {16, 31}, "without XLA313 every read in the steps is reported"


def test_finite_check_moves_only_when_the_value_is_read_nowhere_else():
    source = (ROOT / "fixtures" / "XLA314" / "finite_check.in.py").read_text()
    result = migrate(source, target="2.9")
    assert result.code.count("def check_finite(loss):") == 1
    assert result.code.count("xm.add_step_closure(check_finite, args=(loss,))") == 1
    assert [(f.line, f.code) for f in result.findings if f.code == "XLA311"] == [(28, "XLA311")]
    compile(result.code, "finite_check.py", "exec")


@pytest.mark.parametrize("name", STEP_SHAPES)
@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_step_shape_fixtures_migrate_idempotently(name, target):
    source = (RUNNABLE / f"{name}.py").read_text()
    result = migrate(source, target=target)
    assert result.error is None and result.changes
    compile(result.code, f"{name}.py", "exec")
    again = migrate(result.code, target=target)
    assert again.code == result.code and again.changes == []
    assert not [f for f in result.findings if f.code == "XLA311"], "every per-step read of these shapes moves"
