"""XLA602 hf-mp-fn-entry-point: Hugging Face scripts get the _mp_fn(index) entry point the XLA launchers call.

What it does:
    In a script that imports transformers, trl or accelerate (``facts.is_hf_script``) and has a module-level
    ``main()`` that takes no required argument, adds ``def _mp_fn(index): main()`` right after ``main`` when
    the script has no ``_mp_fn`` yet. Trainer scripts and ``no_trainer`` (own loop) scripts alike. An HF
    training script without such a ``main()`` is reported. Scripts that import no HF library are left to
    the general distributed entry-point rule (XLA407 spawn-entry-point), which skips HF scripts: the two
    never both apply. Not in the ``--data-parallel spmd`` form: one process per host runs the script as it is.

Why:
    The seeds: for distributed training the SageMaker/XLA runtime (and ``xla_spawn.py``) imports the script
    and calls ``_mp_fn(index)`` once per worker; without it every worker trains its own model and no update
    is shared. The Trainer needs nothing else: it reads the worker's ordinal from torch_xla itself.

Example:
    def main():
        trainer.train()


    if __name__ == "__main__":
        main()

Use instead:
    def main():
        trainer.train()


    def _mp_fn(index):
        # Called once per XLA worker (index: the worker's ordinal).
        main()


    if __name__ == "__main__":
        main()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.syntax import patterns
from xla_migrate.engine.rule import Rule

_MP_FN = '''def _mp_fn(index):
    # Called once per XLA worker (index: the worker's ordinal).
    main()
'''
TRAINERS = ("transformers.", "trl.")


class HfMpFnEntryPoint(Rule):
    code = "XLA602"
    reports_on_xla_code = True  # a rerun on its own output keeps the findings (issue 33)
    name = "hf-mp-fn-entry-point"
    summary = "HF Trainer and no_trainer scripts get def _mp_fn(index): main() for the XLA launchers"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._trains = bool(ctx.steps.training_loops) or ctx.facts.uses_accelerate

    def visit_Call(self, node: cst.Call) -> None:
        if not self._trains and any(n.startswith(TRAINERS) and n.endswith(("Trainer", "TrainingArguments", "SFTConfig"))
                                    for n in self.ctx.qualnames(node.func)):
            self._trains = True

    def leave_Module(self, original_node: cst.Module) -> None:
        facts = self.ctx.facts
        # The spmd form is one process per host that runs the script as it is: no launcher calls _mp_fn.
        if self.ctx.data_parallel == "spmd" or not facts.is_hf_script or "_mp_fn" in facts.global_names:
            return
        main = facts.main_function
        if main is None or _required_params(main):
            if self._trains:
                where = main or facts.main_guard or (original_node.body[0] if original_node.body else original_node)
                what = "main() takes arguments" if main is not None else "the script has no main()"
                self.finding(where, f"{what}: the XLA launchers call _mp_fn(index), which needs a main() to call",
                             "put the training in main() and add def _mp_fn(index): main()")
            return
        function = patterns.parsed_statement(_MP_FN)
        function = function.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        self.insert_after(main, [function], "def _mp_fn(index): main(), the entry point the XLA launchers call")


def _required_params(function: cst.FunctionDef) -> list[cst.Param]:
    params = function.params
    return [p for p in [*params.posonly_params, *params.params, *params.kwonly_params]
            if p.default is None]
