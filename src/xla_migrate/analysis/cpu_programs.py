"""Programs that never leave the CPU: no file of the program uses CUDA or places anything on a device.

Such a program (reinforcement-learning scripts whose models and tensors stay on the CPU, Hogwild workers that
update one shared-memory CPU model) is not a CUDA program to migrate: the step recipe on its CPU optimizers
would only start the XLA runtime in every process (on a TPU host each process claims the chips for a model
that stays on the CPU). It is left as it is, with one finding where it trains saying how to put it on XLA.

The test is wide on purpose: a word of CUDA, device placement, mixed precision, a launcher or a library that
places devices itself, anywhere in the program (code, string or comment), makes it a program the rules
migrate, as before. Only a program with an entry (a ``__main__`` block) qualifies: a snippet or a module
without one may be one part of a CUDA program.

A program that names the CPU as its device by its own choice (``device = "cpu"``, ``.to(device)``: a CPU
baseline beside torch_xla scripts, issue 36) is one too, when every device it places on is a CPU literal
(``"cpu"``, ``torch.device("cpu")``) or a name bound only to one, and no other word of the list appears.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

PLACEMENT = re.compile(
    r"cuda|device|\.to\(|\bxla\b|torch_xla|\bxm\b|\bmps\b|accelerat|transformers|lightning|deepspeed|"
    r"distributed|spawn\(|DataParallel|autocast|GradScaler|\.half\(|\bamp\b|apex|nccl|torchrun|launch",
    re.IGNORECASE)
# PLACEMENT without the words an explicit CPU placement uses (``device``, ``.to(``): checked on the tree instead.
OFF_CPU = re.compile(PLACEMENT.pattern.replace(r"device|\.to\(|", ""), re.IGNORECASE)
MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.MULTILINE)
TRAINING = re.compile(r"\.(?:step|backward)\(")

CODE = "XLA004"
MESSAGE = ("the program never uses CUDA and places nothing off the CPU (no file of it names CUDA, a device other "
           "than \"cpu\", mixed precision or a launcher): it is left as it runs, on the CPU; the step recipe on CPU "
           "optimizers would only start the XLA runtime in each process")
FIX = ("to train on XLA, place the model and each batch on a device (`device = \"cuda\"`, `model.to(device)`, "
       "`x.to(device)`) and migrate again, or write it with torch_xla.device() by hand")


def never_placed(text: str) -> bool:
    """No word of device placement anywhere in ``text``, or only placements on the CPU it names itself."""
    return PLACEMENT.search(text) is None or (OFF_CPU.search(_without_comments(text)) is None
                                              and _only_cpu_placements(text))


def _without_comments(text: str) -> str:
    """The code and its strings (a comment may say where the project's other scripts run)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    return " ".join(t.string for t in tokens if t.type != tokenize.COMMENT)


def _is_cpu(value: ast.expr, cpu_names: set[str]) -> bool:
    if isinstance(value, ast.Constant):
        return value.value == "cpu"
    if isinstance(value, ast.Name):
        return value.id in cpu_names
    return (isinstance(value, ast.Call) and ast.unparse(value.func) == "torch.device" and len(value.args) == 1
            and not value.keywords and _is_cpu(value.args[0], set()))


def _only_cpu_placements(text: str) -> bool:
    """Every ``.to(x)`` / ``device=x`` places on the CPU; names called ``device`` (and the names ``.to()`` is
    given) are bound only to CPU values; at least one CPU placement is there."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    bound: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        value = node.value if isinstance(target, ast.Name) else None
                        bound.setdefault(name.id, []).append(value)  # type: ignore[arg-type]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.With, ast.NamedExpr)):
            for name in ast.walk(getattr(node, "target", node)):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, []).append(None)  # type: ignore[arg-type]
        elif isinstance(node, ast.arg):
            bound.setdefault(node.arg, []).append(None)  # type: ignore[arg-type]
    cpu_names = {name for name, values in bound.items()
                 if all(v is not None and _is_cpu(v, set()) for v in values)}
    placements: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
                first = node.args[0]
                if not (isinstance(first, ast.Attribute) and ast.unparse(first).startswith("torch.")):  # a dtype
                    placements.append(first)
            placements += [k.value for k in node.keywords if k.arg == "device"]
        elif isinstance(node, ast.Name) and "device" in node.id.lower() and node.id not in cpu_names:
            return False  # a device name bound to something else (``device = args.device``)
    return bool(placements) and all(_is_cpu(p, cpu_names) for p in placements)


def has_entry(text: str) -> bool:
    return MAIN_GUARD.search(text) is not None


def cpu_only_script(text: str) -> bool:
    """A script migrated alone that is a whole CPU program, and trains (else the rules have nothing to step)."""
    return has_entry(text) and training_line(text) is not None and never_placed(text)


def training_line(text: str) -> int | None:
    """The line of the first ``.step(`` or ``.backward(`` (where the step recipe would have gone)."""
    match = TRAINING.search(text)
    return None if match is None else text.count("\n", 0, match.start()) + 1
