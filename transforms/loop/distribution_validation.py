"""XLA319 distribution-validation-off: torch.distributions' argument checks in a step are turned off once.

What it does:
    Where a training or evaluation step (or a function one runs every step: a policy's ``act``, a model's
    ``forward`` called from another module's loop) builds a ``torch.distributions`` distribution
    (``Categorical(logits=...)``, ``Normal(mu, std)``, ``D.Bernoulli(probs=p)``), adds
    ``torch.distributions.Distribution.set_default_validate_args(False)`` once, right after the module's
    leading imports. Nothing is added where the module sets the default itself, nor for a distribution that
    no step builds (made once at start-up, its checks run once).

Why:
    ``Distribution._validate_args`` defaults to ``__debug__`` (True): ``__init__`` checks each parameter
    against its constraint and raises unless ``torch._is_all_true(valid)``, and ``log_prob`` checks the sample
    the same way. On XLA each check is a read of a device value to the host, which executes the pending graph:
    a graph cut in the middle of the forward and another before the loss, every step. Measured on a
    policy-gradient learner migrated for 2.9 (torch_xla 2.9, PJRT_DEVICE=CPU, 20 updates, the metrics report):
    ExecuteTime 60 and ``aten::_local_scalar_dense`` 41; with validation off, 20 and 1 (the final print).
    cleanrl's ppo.py ran 96 forced executions at its ``Categorical`` and 96 at its ``log_prob`` over 32 steps.
    The checks are debug checks of the arguments (a probability out of [0, 1], an action out of the support):
    the original keeps them on the CPU or GPU; on XLA they are off, and the values are the same.

Example:
    from torch.distributions import Categorical

    def act(self, x, action=None):
        dist = Categorical(logits=self.actor(x))
        return action, dist.log_prob(action), dist.entropy()

Use instead:
    from torch.distributions import Categorical
    torch.distributions.Distribution.set_default_validate_args(False)

    def act(self, x, action=None):
        dist = Categorical(logits=self.actor(x))
        return action, dist.log_prob(action), dist.entropy()
"""

from __future__ import annotations

import libcst as cst

from xla_migrate.engine.rule import Rule
from xla_migrate.syntax import patterns
from xla_migrate.transforms.common import statement_after_imports

_PACKAGE = "torch.distributions."
# Submodules of torch.distributions whose classes are not distributions (constraints, transforms).
_NOT_DISTRIBUTIONS = (".constraints.", ".transforms.", ".constraint_registry.", ".kl.", ".utils.")
SETTER = "set_default_validate_args"
WHY = ("torch.distributions' argument checks (each constructor's parameter constraints, log_prob's support "
       "check) are debug checks that read the device: on XLA each one executes the pending graph and copies "
       "the result to the host, every step; they stay on in the original")


def is_distribution(name: str) -> bool:
    """``torch.distributions.Categorical``, ``torch.distributions.normal.Normal``: a distribution class."""
    if not name.startswith(_PACKAGE) or any(part in name for part in _NOT_DISTRIBUTIONS):
        return False
    last = name.rsplit(".", 1)[-1]
    return last[:1].isupper() and not last.endswith(("Transform", "Constraint")) and last != "Distribution"


class DistributionValidationOff(Rule):
    code = "XLA319"
    name = "distribution-validation-off"
    summary = ("a step that builds torch.distributions objects turns their argument checks (host reads) off "
               "once after the imports")
    # The checks raise on an invalid argument; off, such an argument goes through (the original still raises).
    fix_safety = "review"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._built: cst.Call | None = None  # the first distribution a step builds
        self._set = False  # the module sets the default itself

    def visit_Call(self, node: cst.Call) -> None:
        if patterns.method_call(node, SETTER) is not None:
            self._set = True
            return
        if self._built is not None or not any(is_distribution(n) for n in self.ctx.qualnames(node.func)):
            return
        steps = self.ctx.steps
        if steps.region(node) is not None or steps.called_region(node) is not None or \
                steps.foreign_step(node) is not None:
            self._built = node

    def leave_Module(self, original_node: cst.Module) -> None:
        if self._built is None or self._set:
            return
        first = statement_after_imports(original_node)
        if first is None:
            return
        torch = self.ctx.local_name("torch", "torch")
        code = f"{torch}.distributions.Distribution.{SETTER}(False)"
        line = self.ctx.position(self._built)[0]
        comment = "# torch.distributions' argument checks read the device (a graph execution each): off on XLA."
        statement = self.ctx.statement(code).with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(comment))])
        self.insert_before(first, [statement],
                           f"{code}: the step builds a distribution (line {line}); {WHY}")
