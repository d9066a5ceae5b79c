"""The codes the engine itself reports (no rule makes them): each is listed by ``--list-rules``, documented by
``xla-migrate rule CODE`` and a page in docs/rules, and can be ignored (``--ignore``, ``# noqa``,
``per-file-ignores``) like a rule's. ``--select`` does not leave them out: they say that something the
selected rules tried was not done, which a narrower selection does not make less true.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rule import ALL_TARGETS


@dataclass(frozen=True)
class EngineCode:
    code: str
    name: str
    summary: str
    source: str  # the module that reports it, in a checkout
    doc: str  # ruff's sections, as a rule's module docstring has them
    fix_safety: str = "none"
    targets: tuple[str, ...] = ALL_TARGETS
    on_xla_code: bool = True


ENGINE_CODES: tuple[EngineCode, ...] = (
    EngineCode("XLA000", "rewrite-withdrawn", "A rule's rewrite broke the output and was withdrawn",
               "src/xla_migrate/engine/gate.py", """
What it does:
    Every output passes a gate before it is written: it must parse, keep the input's top-level names and
    bind what it uses. An edit that makes the output fail is withdrawn (the rest are kept) and reported
    with what it would have produced.

Why:
    A migration that breaks the script is worse than none; the line still needs the change, by hand.

Example:
    script.py:12:5: XLA000 rewrite withdrawn (XLA101: ...): it would have produced ... (fix: make this
    change by hand (the output gate found it breaks the script))
"""),
    EngineCode("XLA001", "notebook-cell-not-python", "A notebook code cell that is not Python was left out",
               "src/xla_migrate/cli/notebooks.py", """
What it does:
    Reports a notebook code cell that does not parse as Python (another kernel's language, a cell magic
    such as %%bash): the cell is kept as it is and the other cells migrate.

Why:
    CUDA code in such a cell is not migrated; a person has to look at it.

Example:
    train.ipynb:cell 4:line 1: XLA001 cell left out: ...
"""),
    EngineCode("XLA003", "cuda-in-ipython-line", "CUDA in a notebook's magic or shell line, which is not rewritten",
               "src/xla_migrate/cli/ipython_lines.py", """
What it does:
    Reports CUDA in a notebook's IPython lines (`%timeit torch.cuda.synchronize()`, `!nvidia-smi`,
    `%env CUDA_VISIBLE_DEVICES=0`) and in cells run by a shell cell magic (`%%bash`), with the cell and
    the line within it. Those lines are not Python, so no rule rewrites them.

Why:
    They still run on the XLA host: a CUDA call fails there, nvidia-smi finds no GPU.

Example:
    %timeit torch.cuda.synchronize()
    !nvidia-smi

Use instead:
    %timeit xm.wait_device_ops()
    !python -c "import torch_xla.core.xla_model as xm; print(xm.get_xla_supported_devices())"
"""),
    EngineCode("XLA004", "cpu-only-program", "A program that never uses CUDA or a device is left as it runs",
               "src/xla_migrate/analysis/cpu_programs.py", """
What it does:
    Leaves a program alone when none of its files names CUDA, a device, `.to()`, mixed precision, a
    launcher or a library that places devices itself (a word in a comment or a string counts too), and it
    has an entry (a `__main__` block); one finding goes where each file first steps or backpropagates. In a
    tree run the whole tree is the program; a file migrated alone is its own. A program that places things
    only on the CPU it names itself (`device = "cpu"`, `model.to(device)`, `torch.device("cpu")`, every
    device name bound only to those, no other word of the list outside comments) is one too (issue 36: a
    CPU baseline beside torch_xla scripts gets no device loader, xm.optimizer_step or xm.save).

Why:
    Such a program trains on the CPU on purpose (reinforcement-learning scripts, Hogwild workers that update
    one shared-memory model). The step recipe on CPU optimizers (xm.optimizer_step, a step barrier) moves
    nothing to the XLA device: it only starts the XLA runtime in every process, and on a TPU host each
    process would claim the chips for a model that stays on the CPU.

Example:
    train.py:40:9: XLA004 the program never uses CUDA and places nothing off the CPU ... (fix: to train on
    XLA, place the model and each batch on a device ... and migrate again)

Use instead:
    device = "cuda"
    model = Policy().to(device)
    states = states.to(device)
"""),
    EngineCode("XLA002", "unused-noqa", "A `# noqa` comment names an XLA code that suppressed nothing",
               "src/xla_migrate/engine/suppressions.py", """
What it does:
    Reports a `# noqa: XLA...` comment whose code suppressed no change or finding on its line (for a rule
    of this run), or names a code no rule has, as ruff's RUF100 does. A bare `# noqa` is shared with other
    tools and is never reported.

Why:
    A stale suppression hides the next real problem on its line.

Example:
    x = 1  # noqa: XLA501

Use instead:
    x = 1
"""),
)


ENGINE_CODES = tuple(sorted(ENGINE_CODES, key=lambda entry: entry.code))


def engine_code(code: str) -> EngineCode | None:
    for entry in ENGINE_CODES:
        if entry.code == code.upper() or entry.name == code.lower():
            return entry
    return None
