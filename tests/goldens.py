"""Golden fixtures: ``fixtures/<CODE>/<case>.in.py`` with one ``<case>.out-<target>.py`` per target.

Distributed cases (every case of a distributed rule's folder, XLA4xx, and every other case the tool
migrates as a distributed script) are also migrated in the data-parallel form that the default does not give
them (DESIGN.md section 7): ``<case>.out-<target>.py`` is the default, ``--data-parallel auto`` (which picks
``xm`` or ``ddp`` per program), ``<case>.out-<target>-<form>.py`` the other form, asked for by name. So the
suffix of the second file says which form auto chose (``-ddp``: it chose xm). A rule whose class names
``golden_forms`` (the spmd form's rules) has its cases migrated in those forms too (``-spmd``).

Rule folders (``XLA101``...) run that rule alone, so adding a rule never churns another rule's goldens;
``fixtures/scripts/`` holds whole scripts migrated by every rule. To (re)write expected outputs after a
deliberate change, run ``python tests/goldens.py [FOLDER...]`` and review the diff before committing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
WHOLE_SCRIPTS = "scripts"
# torch_xla scripts (this tool's sagemaker and 2.9 outputs of the runnable fixtures) upgraded to TorchTPU by
# every rule: torchtpu only (the torch_xla targets leave code on XLA as it is).
UPGRADES = "upgrades"
# Folders that are not golden pairs.
NOT_GOLDEN = {"runnable", "examples", "realistic"}


@dataclass(frozen=True)
class Case:
    folder: str
    name: str
    target: str
    # The data-parallel form, "" for the target's default.
    form: str = ""

    @property
    def input(self) -> Path:
        return FIXTURES / self.folder / f"{self.name}.in.py"

    @property
    def expected(self) -> Path:
        suffix = f"-{self.form}" if self.form else ""
        return FIXTURES / self.folder / f"{self.name}.out-{self.target}{suffix}.py"

    @property
    def data_parallel(self) -> str | None:
        return self.form or None

    @property
    def select(self) -> list[str] | None:
        return None if self.folder in (WHOLE_SCRIPTS, UPGRADES) else [self.folder]

    @property
    def id(self) -> str:
        return f"{self.folder}/{self.name}[{self.target}{'-' + self.form if self.form else ''}]"


def golden_folders() -> list[Path]:
    return sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name not in NOT_GOLDEN)


def cases(folders: list[str] | None = None) -> list[Case]:
    from xla_migrate.engine.targets import TARGETS

    found = []
    for folder in golden_folders():
        if folders and folder.name not in folders:
            continue
        targets = _targets_of(folder.name, list(TARGETS))
        for source in sorted(folder.glob("*.in.py")):
            name = source.name[: -len(".in.py")]
            distributed = _is_distributed(folder.name, source)
            for target in targets:
                case = Case(folder.name, name, target)
                found.append(case)
                if distributed:
                    found.extend(Case(folder.name, name, target, form) for form in _other_forms(case))
                found.extend(Case(folder.name, name, target, form) for form in _named_forms(folder.name, target))
    return found


def cases_on_disk() -> list[Case]:
    """The cases as the expected files on disk name them, without migrating anything: what the test modules
    parametrize over at collection (every xdist worker collects the whole suite, and ``cases()`` migrates
    each input to learn its forms). test_goldens checks that this list is ``cases()``."""
    from xla_migrate.engine.targets import TARGETS

    found = []
    for folder in golden_folders():
        for source in sorted(folder.glob("*.in.py")):
            name = source.name[: -len(".in.py")]
            for target in _targets_of(folder.name, list(TARGETS)):
                found.append(Case(folder.name, name, target))
                prefix = f"{name}.out-{target}-"
                found.extend(Case(folder.name, name, target, path.name[len(prefix):-len(".py")])
                             for path in sorted(folder.glob(f"{prefix}*.py")))
    return found


def _named_forms(folder: str, target: str) -> list[str]:
    """Forms a rule asks its own cases to be migrated in too (``golden_forms``: the spmd form's rules), where
    the target has them."""
    from xla_migrate.engine.registry import all_rules
    from xla_migrate.engine.targets import TARGETS, data_parallel_problem

    rule = next((r for r in all_rules() if r.code == folder), None)
    forms = getattr(rule, "golden_forms", ())
    return [form for form in forms if data_parallel_problem(TARGETS[target], form) is None]


def _other_forms(case: Case) -> list[str]:
    """The form the default (auto) did not choose for this case (none when it is not migrated as distributed:
    no form applies)."""
    chosen = run_case(case).data_parallel
    return [form for form in ("ddp", "xm") if chosen and form != chosen]


def _is_distributed(folder: str, source: Path) -> bool:
    """The case's migration depends on the data-parallel form: a distributed rule's case (XLA4xx), or any
    case the tool migrates as a distributed script (its rule or every rule, for whole scripts)."""
    if folder.startswith("XLA4"):
        return True
    from xla_migrate import migrate

    if folder == UPGRADES:
        return False  # only torchtpu, which has no data-parallel forms
    select = None if folder == WHOLE_SCRIPTS else [folder]
    return bool(migrate(source.read_bytes(), target="2.9", select=select, path=source.name).data_parallel)


def _targets_of(folder: str, all_targets: list[str]) -> list[str]:
    if folder == WHOLE_SCRIPTS:
        return all_targets
    if folder == UPGRADES:
        return ["torchtpu"]
    from xla_migrate.engine.registry import all_rules

    for rule in all_rules():
        if rule.code == folder:
            return list(rule.targets)
    return all_targets


def run_case(case: Case, source: bytes | None = None):
    from xla_migrate import migrate

    data = case.input.read_bytes() if source is None else source
    return migrate(data, target=case.target, select=case.select, path=case.input.name,
                   data_parallel=case.data_parallel)


def regenerate(folders: list[str] | None) -> None:
    every = cases(folders)
    expected = {case.expected for case in every}
    for folder in {case.folder for case in every}:
        for stale in sorted((FIXTURES / folder).glob("*.out-*.py")):
            if stale not in expected:
                stale.unlink()
                print(f"removed {stale.relative_to(ROOT)} (no case writes it: the default form changed)")
    for case in every:
        result = run_case(case)
        if result.error is not None:
            print(f"{case.id}: error {result.error}", file=sys.stderr)
            continue
        old = case.expected.read_bytes() if case.expected.exists() else None
        if old != result.output_bytes:
            case.expected.write_bytes(result.output_bytes)
            print(f"wrote {case.expected.relative_to(ROOT)}")


if __name__ == "__main__":
    regenerate(sys.argv[1:] or None)
