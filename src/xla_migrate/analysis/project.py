"""The project index: a repository seen as one program (DESIGN.md section 3).

Built once at the start of a tree run (and by a single-file run given ``--project ROOT``, or whose root is
found as the config lookup finds ``pyproject.toml``), before any file is migrated. It is cheap: each Python
file under the root is parsed with the standard ``ast`` module (no libcst, no scope analysis) and only its
imports and top-level definitions are read. It holds plain data (tuples, dicts, strings), so it travels to
the worker processes with the run's options.

Per module it knows (the flow across modules, issue 30, is read by ``project_flow.py``):

- the local imports, resolved to files of the project (``from utils import NativeScaler``,
  ``from .engine import train_one_epoch``, ``import utils as U``);
- whether it is an entry file: a ``__main__`` block, a launcher call (``mp.spawn``, ``xmp.spawn``,
  ``torch_xla.launch``), or a script no other module of the project imports;
- its training-step helpers: module-level functions and methods that call ``backward`` and/or step an
  optimizer (``optimizer.step()``, ``scaler.step(opt)``, ``xm.optimizer_step(opt)``); a class whose
  ``__call__`` does is a stepper (timm's NativeScaler shape);
- its distributed setup (``init_process_group``, DDP, ``DistributedSampler``, ``mp.spawn``, torchrun's
  environment variables) and its save helpers (functions calling ``torch.save``/``xm.save``);
- the objects it makes from the project's own classes (``loss_scaler = NativeScaler()``), by name, so a
  module that is handed one as a parameter of the same name knows what calling it does.

The step analysis (steps/) asks it what a call into another module does; the entry-point rule (XLA407)
asks whether a file is an entry file; the run takes one distributed decision for the modules that import
each other.
"""

from __future__ import annotations

import ast
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

from .cpu_programs import never_placed
from .project_flow import dotted as _dotted
from .project_flow import (loop_model_calls, mask_index_helpers, own_calls, per_step_functions, random_slice_helpers,
                           reads_through_own_calls, torch_module_class, walk_ast)
from .truth_tests import first_truth_test, torch_aliases

# What a helper does: "backward", "step" (an optimizer update).
BACKWARD, STEP = "backward", "step"
_SCALER_OR_OPTIMIZER = ("optim", "opt", "scaler")
_DISTRIBUTED_CALLS = ("init_process_group", "DistributedDataParallel", "DistributedSampler")
_LAUNCHERS = ("spawn", "launch", "start_processes")
_LAUNCHER_MODULES = ("mp", "xmp", "multiprocessing", "xla_multiprocessing", "torch_xla", "torch.multiprocessing")
_TORCHRUN_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_SAVES = ("torch.save", "xm.save", "save")


@dataclass(frozen=True)
class ModuleInfo:
    path: str  # relative to the root, posix
    name: str  # dotted module name (``pkg.utils``)
    # local name -> (dotted module, attribute or "") for imports of the project's own modules
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    main_block: bool = False
    launcher: bool = False
    # helper -> what it does: "train_step" or "NativeScaler.__call__" -> ("backward", "step")
    step_helpers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (line, what) of the distributed setup it does
    distributed: tuple[tuple[int, str], ...] = ()
    save_helpers: tuple[str, ...] = ()
    # name -> class name (``loss_scaler = utils.NativeScaler()`` -> ("loss_scaler", "utils.NativeScaler"))
    instances: tuple[tuple[str, str], ...] = ()
    classes: tuple[str, ...] = ()
    error: str = ""  # it does not parse (the migration reports that itself)
    # helper -> (line, code) of its first read of a tensor's value to the host (``x.item()``, ``x.tolist()``,
    # ``x.numpy()``), with " in a loop" appended to the code when the read repeats inside the helper (issue 30)
    read_helpers: dict[str, tuple[int, str]] = field(default_factory=dict)
    # class -> the weights its methods tie (``self.a.weight = self.b.weight``), as (left, right) attribute
    # paths below the object (issue 36: the device move unties them on XLA)
    ties: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    # (loop line, callee as written, class as written) of each call, in a loop, of a name bound to an object
    # of a class (``model = Decoder().to(device)`` ... ``model(x)`` in a loop): the classes whose forward
    # runs every step (issue 30)
    loop_models: tuple[tuple[int, str, str], ...] = ()
    # function or method -> the calls of its own code: ("name", f) a plain call, ("self", m) a method of its
    # class, to follow the forward of a model into the helpers it calls
    calls: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # function -> (line, code) of its first tensor-style slice (several dimensions or ``...``) at offsets a
    # ``random.*`` / ``np.random.*`` draw gives: a random crop helper (issue 30, XLA312)
    random_slices: dict[str, tuple[int, str]] = field(default_factory=dict)
    # function or "Class.method" -> (line, code) of its first boolean-mask indexing (``x[~mask]``): a loss
    # helper the step calls gets a data-dependent shape (issue 30, XLA312)
    mask_indexes: dict[str, tuple[int, str]] = field(default_factory=dict)
    # function -> (sliced parameter's index, offset parameter's index, line, code) of its first slice of a
    # parameter at an offset another parameter gives (``source[:, i:i + seq_len]`` in ``get_batch(source, i,
    # ...)``): a step that passes a device tensor and the loop's offset gets a new graph per offset (XLA312)
    offset_slices: dict[str, tuple[int, int, int, str]] = field(default_factory=dict)
    # top-level functions that return a tensor moved to the device (``return data.to(device)``, ``data =
    # data.cuda()`` ... ``return data``): TCN's ``batchify`` (XLA312's device corpus)
    device_returns: tuple[str, ...] = ()
    # class -> its bases as written (``Ladder(BaseModel)`` -> ("BaseModel",)), to follow a model's base class
    # into the module it is imported from (issue 30: its methods are not script code)
    bases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # "Class.method" of the methods whose body only says a subclass defines them (``raise
    # NotImplementedError``, ``pass``, ``...``): stylegan2-ada's ``Loss.accumulate_gradients``
    abstract: tuple[str, ...] = ()
    # a word of CUDA or device placement anywhere in it (cpu_programs.PLACEMENT); unknown: True
    placed: bool = True
    # attributes its classes set to objects of classes (``self.cell = nn.GRUCell(...)``): the submodules a
    # decode loop of another module may call one by one (``decoder.cell(...)``, issue 30)
    submodules: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProjectIndex:
    root: str  # absolute
    modules: dict[str, ModuleInfo]  # by relative path
    by_name: dict[str, str]  # dotted module name -> relative path
    # relative path -> the relative paths it imports (resolved)
    edges: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The whole project is a CPU program (cpu_programs.py): no module places anything on a device, one has
    # a ``__main__`` block, and no notebook of the tree (not indexed) could place it.
    cpu_only: bool = False
    # name -> instance_class's answer, filled as asked (the step model asks for every call of a name).
    _instance_classes: dict[str, tuple[str, str] | None] = field(default_factory=dict, repr=False, compare=False)
    # (file, function) -> how a loop of another module runs it every step; filled on first use
    _per_step: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False)
    # the attributes every class of the project sets to objects (submodule_attributes); filled on first use
    _submodules: list[frozenset[str]] = field(default_factory=list, repr=False, compare=False)
    # method name -> the classes of the project that define it, as (file, "Class.method"); filled on first use
    _method_owners: dict[str, list[tuple[str, str]]] = field(default_factory=dict, repr=False, compare=False)

    # Queries ---------------------------------------------------------------------------------------------
    def relative(self, path: str) -> str | None:
        """The project's name for a file (None when it is not under the root)."""
        try:
            rel = Path(os.path.abspath(path)).relative_to(self.root).as_posix()
        except ValueError:
            return None
        return rel if rel in self.modules else None

    def importers(self, rel: str) -> list[str]:
        return sorted(other for other, targets in self.edges.items() if rel in targets)

    def is_entry(self, rel: str) -> bool:
        """An entry file: a ``__main__`` block or a launcher call, or a script no project module imports."""
        info = self.modules[rel]
        return info.main_block or info.launcher or not self.importers(rel)

    def component(self, rel: str) -> list[str]:
        """The modules of the programs ``rel`` belongs to, itself included: each module that imports ``rel``
        (directly or not) and ``rel`` itself, with everything they import. Two entry files that share only
        a helper (a logger, a replay buffer) are two programs: the helper belongs to both, neither entry to
        the other's (issue 33: cleanrl's single-process scripts took the torchrun script's decision)."""
        roots = self._closure([rel], lambda current: self.importers(current))
        return sorted(self._closure(sorted(roots), lambda current: self.edges.get(current, ())))

    def imported_launchers(self, rel: str) -> list[str]:
        """The modules ``rel`` imports (directly or not) that launch workers themselves (``mp.spawn``,
        ``mp.start_processes``: detectron2's engine.launch): such a program has its launch already."""
        imported = self._closure([rel], lambda current: self.edges.get(current, ())) - {rel}
        return sorted(other for other in imported if self.modules[other].launcher)

    def _closure(self, start: list[str], step) -> set[str]:
        seen, todo = set(start), list(start)
        while todo:
            for other in set(step(todo.pop())) - seen:
                seen.add(other)
                todo.append(other)
        return seen

    def distributed_setup(self, rel: str) -> list[tuple[str, int, str]]:
        """(file, line, what) of the distributed setup in the modules connected to ``rel``."""
        return [(other, line, what) for other in self.component(rel)
                for line, what in self.modules[other].distributed]

    def resolve(self, importer: str, dotted: str) -> str | None:
        """The project file a dotted module name imported by ``importer`` names (a sibling first, then from
        the root, then from a top-level ``src/`` folder: the src layout, whose packages are installed and
        imported without it, open_clip's ``open_clip_train``), or None for a module outside the project."""
        folder = str(Path(importer).parent.as_posix())
        candidates = [dotted] if folder in ("", ".") else [f"{folder.replace('/', '.')}.{dotted}", dotted]
        candidates.append(f"src.{dotted}")
        for candidate in candidates:
            if candidate in self.by_name:
                return self.by_name[candidate]
        return None

    def import_target(self, importer: str, module: str, attribute: str = "") -> str | None:
        """The project file an import names: ``from pkg import engine`` names pkg/engine.py when there is
        one (a submodule), else pkg/__init__.py."""
        if attribute:
            found = self.resolve(importer, f"{module}.{attribute}")
            if found is not None:
                return found
        return self.resolve(importer, module) if module else None

    def helper_reads(self, rel: str, qualified: str) -> tuple[str, int, str] | None:
        """Where calling ``qualified`` (as ``rel`` sees it) reads a tensor's value to the host: (file, line,
        code), or None."""
        module, _, name = qualified.rpartition(".")
        while module:
            target = self.resolve(rel, module)
            if target is not None:
                found = self.modules[target].read_helpers.get(name)
                return (target, *found) if found else None
            module, _, rest = module.rpartition(".")
            name = f"{rest}.{name}"
        return None

    def random_slice(self, rel: str, qualified: str) -> tuple[str, int, str] | None:
        """Where calling the function ``qualified`` (as ``rel`` sees it) slices at host-random offsets."""
        module, _, name = qualified.rpartition(".")
        target = self.resolve(rel, module) if module else None
        found = self.modules[target].random_slices.get(name) if target is not None else None
        return (target, *found) if found else None

    def mask_index(self, rel: str, qualified: str) -> tuple[str, int, str] | None:
        """Where calling the function ``qualified`` (as ``rel`` sees it) indexes with a boolean mask."""
        module, _, name = qualified.rpartition(".")
        target = self.resolve(rel, module) if module else None
        found = self.modules[target].mask_indexes.get(name) if target is not None else None
        return (target, *found) if found else None

    def offset_slice(self, rel: str, qualified: str) -> tuple[str, int, int, int, str] | None:
        """Where calling the function ``qualified`` (as ``rel`` sees it) slices a parameter at an offset another
        parameter gives: (file, sliced parameter's index, offset parameter's index, line, code)."""
        module, _, name = qualified.rpartition(".")
        target = self.resolve(rel, module) if module else self._star_source(rel, name, "offset_slices")
        found = self.modules[target].offset_slices.get(name) if target is not None else None
        return (target, *found) if found else None

    def returns_on_device(self, rel: str, qualified: str) -> bool:
        """The function ``qualified`` (as ``rel`` sees it) returns a tensor it moved to the device."""
        module, _, name = qualified.rpartition(".")
        target = self.resolve(rel, module) if module else self._star_source(rel, name, "device_returns")
        return target is not None and name in self.modules[target].device_returns

    def _star_source(self, rel: str, name: str, summary: str) -> str | None:
        """The module a star import of ``rel`` takes the helper ``name`` from (``from utils import *``: TCN's
        ``get_batch``), the first whose ``summary`` (a ModuleInfo field) holds it; a bare name only."""
        info = self.modules.get(rel)
        for key, (module, _) in info.imports.items() if info is not None and name and "." not in name else ():
            target = self.resolve(rel, module) if key.startswith("*") else None
            if target is not None and name in getattr(self.modules[target], summary):
                return target
        return None

    def class_ties(self, rel: str, qualified: str) -> tuple[tuple[str, ...], ...]:
        """The ties of the project class ``qualified`` names (as ``rel`` imports it), or ()."""
        module, _, name = qualified.rpartition(".")
        target = self.resolve(rel, module) if module else None
        return self.modules[target].ties.get(name, ()) if target is not None else ()

    def helper_effects(self, rel: str, qualified: str) -> tuple[str, ...]:
        """What calling ``qualified`` (a dotted name as the importing module ``rel`` sees it: ``utils.train_step``,
        ``NativeScaler.__call__`` of an imported class) does: backward and/or step; empty when nothing known."""
        module, _, name = qualified.rpartition(".")
        while module:
            target = self.resolve(rel, module)
            if target is not None:
                return self.modules[target].step_helpers.get(name, ())
            module, _, rest = module.rpartition(".")
            name = f"{rest}.{name}"
        return ()

    def save_helper(self, rel: str, qualified: str) -> str | None:
        """The project file whose function ``qualified`` (as ``rel`` sees it: ``utils.save_checkpoint``, or
        ``save_checkpoint`` after ``from utils import save_checkpoint``) writes a checkpoint, or None."""
        info = self.modules[rel]
        module, _, name = qualified.rpartition(".")
        head, _, tail = module.partition(".")
        if not module and name in info.imports:  # `from utils import save_checkpoint`
            module, name = info.imports[name]
            if not name:
                return None
        elif head in info.imports and not info.imports[head][1]:  # `import pkg.utils as U` then `U.save(...)`
            module = ".".join(filter(None, (info.imports[head][0], tail)))
        while module:
            target = self.resolve(rel, module)
            if target is not None:
                return target if name in self.modules[target].save_helpers else None
            module, _, rest = module.rpartition(".")
            name = f"{rest}.{name}"
        return None

    def instance_class(self, rel: str, name: str) -> tuple[str, str] | None:
        """The project class an object called ``name`` is made from elsewhere in the project, when only one
        class is (an object made in ``main.py`` and passed to ``engine.py`` as a parameter of the same name):
        (defining file, class name)."""
        if name not in self._instance_classes:
            found: set[tuple[str, str]] = set()
            for other, info in self.modules.items():
                for bound, class_name in info.instances:
                    if bound != name:
                        continue
                    defined = self._class_file(other, class_name)
                    if defined is not None:
                        found.add(defined)
            self._instance_classes[name] = next(iter(found)) if len(found) == 1 else None
        return self._instance_classes[name]

    def _class_file(self, rel: str, class_name: str) -> tuple[str, str] | None:
        info = self.modules[rel]
        if class_name in info.classes:
            return rel, class_name
        head, _, last = class_name.rpartition(".")
        local = head or last
        if local in info.imports:
            module, attribute = info.imports[local]
            # ``utils.LossScaler()`` after ``from pkg import utils``; ``LossScaler()`` after ``from utils import LossScaler``.
            target = self.import_target(rel, module, attribute) if head else self.resolve(rel, module)
            if target is None:
                return None
            return self._defined_in(target, last if head else attribute)
        if not head:  # ``from models import *``
            for key, (module, _) in info.imports.items():
                target = self.resolve(rel, module) if key.startswith("*") else None
                if target is not None and class_name in self.modules[target].classes:
                    return target, class_name
        return None

    def _defined_in(self, rel: str, class_name: str, depth: int = 0) -> tuple[str, str] | None:
        """Where the class ``class_name`` that module ``rel`` holds is defined: in ``rel`` itself, or in a module
        it re-exports it from (a package ``__init__.py`` with ``from .base import *``: PyTorch-VAE's
        ``from models import BaseVAE``)."""
        info = self.modules[rel]
        if class_name in info.classes:
            return rel, class_name
        if depth > 4:
            return None
        if class_name in info.imports and info.imports[class_name][1]:
            module, attribute = info.imports[class_name]
            target = self.resolve(rel, module)
            return self._defined_in(target, attribute, depth + 1) if target is not None else None
        for key, (module, _) in info.imports.items():
            target = self.resolve(rel, module) if key.startswith("*") else None
            found = self._defined_in(target, class_name, depth + 1) if target not in (None, rel) else None
            if found is not None:
                return found
        return None

    def submodule_attributes(self) -> frozenset[str]:
        """Every attribute a class of the project sets to an object of a class (``self.cell = nn.GRUCell(...)``)."""
        if not self._submodules:
            self._submodules.append(frozenset(a for info in self.modules.values() for a in info.submodules))
        return self._submodules[0]

    def per_step(self, rel: str, qualified: str) -> str | None:
        """How a loop of another module runs the function ``qualified`` of ``rel`` every step ("the loop at
        train.py:12: model(...)"), or None: the ``forward`` of a model class whose object a loop calls
        (imported from this module, also by a star import), and the project's functions and methods that
        forward calls (issue 30: its reads are reads of every step)."""
        if not self._per_step:
            self._per_step[("", "")] = ""  # computed (even when nothing runs per step)
            self._per_step.update(per_step_functions(self))
        return self._per_step.get((rel, qualified))

    def sole_method_effects(self, method: str) -> tuple[str, ...]:
        """What ``obj.method(...)`` does when the object's class is unknown (made by a factory from a class
        named by a string: stylegan2-ada's ``construct_class_by_name``) but only one class of the project
        defines a public method of that name (an abstract one a base class declares aside) (``PairLoss.accumulate_gradients``, whose backward the loop
        runs): that method's effects; else ()."""
        if method.startswith("_"):
            return ()
        if not self._method_owners:
            self._method_owners[""] = []  # computed
            for rel, info in self.modules.items():
                for key in info.calls:
                    if key.count(".") == 1 and key not in info.abstract:
                        self._method_owners.setdefault(key.split(".")[1], []).append((rel, key))
        owners = self._method_owners.get(method, [])
        if len(owners) != 1:
            return ()
        rel, key = owners[0]
        return self.modules[rel].step_helpers.get(key, ())

    def torch_module_class(self, rel: str, class_name: str) -> bool:
        """The class ``class_name`` (as ``rel`` spells it) is a project class whose bases reach a torch module
        through the project's own classes (``class BaseVAE(nn.Module)`` in models/base.py)."""
        return torch_module_class(self, rel, class_name)

    def view(self, path: str) -> ProjectFile | None:
        rel = self.relative(path)
        return ProjectFile(self, rel) if rel is not None else None

    def with_notebook(self, path: str, code: str) -> ProjectIndex:
        """This index with a notebook of the tree (``code``: its code cells as one program) indexed like a
        module that no other imports, so the notebook's calls into project modules are followed as a
        script's are. The index itself is unchanged (notebooks are migrated in parallel)."""
        try:
            rel = Path(os.path.abspath(path)).relative_to(self.root).as_posix()
        except ValueError:
            return self
        info = _index_module(rel, code.encode("utf-8"))
        local = {name: value for name, value in info.imports.items() if self.import_target(rel, *value) is not None}
        targets = {self.import_target(rel, module, attribute) for module, attribute in local.values()}
        modules = {**self.modules, rel: ModuleInfo(**{**info.__dict__, "imports": local, "name": ""})}
        edges = {**self.edges, rel: tuple(sorted(t for t in targets if t is not None))}
        return ProjectIndex(self.root, modules, self.by_name, edges, cpu_only=self.cpu_only)

    # Summary ---------------------------------------------------------------------------------------------
    def describe(self) -> dict:
        """What the index found, for the report."""
        return {
            "root": self.root,
            "modules": len(self.modules),
            "entry_files": sorted(r for r in self.modules if self.is_entry(r)),
            "step_helpers": sorted(f"{r}:{h}" for r, m in self.modules.items() for h in m.step_helpers),
            "distributed_setup": sorted(f"{r}:{line} {what}" for r, m in self.modules.items()
                                        for line, what in m.distributed),
            "save_helpers": sorted(f"{r}:{h}" for r, m in self.modules.items() for h in m.save_helpers),
        }


@dataclass(frozen=True)
class ProjectFile:
    """One file's view of the project (what the migration of that file asks)."""

    index: ProjectIndex
    rel: str

    @property
    def is_entry(self) -> bool:
        return self.index.is_entry(self.rel)

    @property
    def distributed(self) -> bool:
        return bool(self.index.distributed_setup(self.rel))

    def helper_effects(self, qualified: str) -> tuple[str, ...]:
        return self.index.helper_effects(self.rel, qualified)

    def helper_reads(self, qualified: str) -> tuple[str, int, str] | None:
        return self.index.helper_reads(self.rel, qualified)

    def save_helper(self, qualified: str) -> str | None:
        return self.index.save_helper(self.rel, qualified)

    def class_ties(self, qualified: str) -> tuple[tuple[str, ...], ...]:
        return self.index.class_ties(self.rel, qualified)

    def method_reads(self, class_name: str, method: str) -> tuple[str, int, str] | None:
        """Where ``obj.method()`` reads a tensor's value to the host, for an object of the project class
        ``class_name`` as this file spells it (``self.mp_trainer = MixedPrecisionTrainer(model)``): (file,
        line, code), or None."""
        found = self.index._class_file(self.rel, class_name)
        if found is None:
            return None
        defined, name = found
        read = self.index.modules[defined].read_helpers.get(f"{name}.{method}")
        return (defined, *read) if read else None

    def per_step(self, qualified: str) -> str | None:
        return self.index.per_step(self.rel, qualified)

    def torch_module_class(self, class_name: str) -> bool:
        return self.index.torch_module_class(self.rel, class_name)

    def random_slice(self, qualified: str) -> tuple[str, int, str] | None:
        return self.index.random_slice(self.rel, qualified)

    def mask_index(self, qualified: str) -> tuple[str, int, str] | None:
        return self.index.mask_index(self.rel, qualified)

    def offset_slice(self, qualified: str) -> tuple[str, int, int, int, str] | None:
        return self.index.offset_slice(self.rel, qualified)

    def returns_on_device(self, qualified: str) -> bool:
        return self.index.returns_on_device(self.rel, qualified)

    def instance_effects(self, name: str, method: str = "__call__") -> tuple[str, ...]:
        """What ``name(...)`` (or ``name.method(...)``) does for an object of a project class made elsewhere."""
        found = self.index.instance_class(self.rel, name)
        if found is None:
            return self.index.sole_method_effects(method)
        defined, class_name = found
        return self.index.modules[defined].step_helpers.get(f"{class_name}.{method}", ())


# Building ---------------------------------------------------------------------------------------------------


def module_name(rel: str) -> str:
    parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def build_index(root: str, files: list[str], notebooks: bool = False) -> ProjectIndex:
    """Index the Python files ``files`` (paths) under ``root``; ``notebooks``: the tree holds notebooks too."""
    root_abs = os.path.abspath(root)
    modules: dict[str, ModuleInfo] = {}
    for path in sorted(files):
        try:
            rel = Path(os.path.abspath(path)).relative_to(root_abs).as_posix()
        except ValueError:
            continue
        if not rel.endswith(".py"):
            continue
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        modules[rel] = replace(_index_module(rel, data), placed=not never_placed(data.decode("utf-8", "replace")))
    by_name = {info.name: rel for rel, info in modules.items() if info.name}
    index = ProjectIndex(root_abs, modules, by_name)
    edges = {}
    for rel, info in modules.items():
        targets = {index.import_target(rel, module, attribute) for module, attribute in info.imports.values()}
        edges[rel] = tuple(sorted(t for t in targets if t is not None and t != rel))
    # Only the imports of the project's own modules are kept.
    kept = {}
    for rel, info in modules.items():
        local = {name: value for name, value in info.imports.items() if index.import_target(rel, *value) is not None}
        kept[rel] = ModuleInfo(**{**info.__dict__, "imports": local})
    cpu_only = (not notebooks and bool(modules) and not any(info.placed for info in modules.values())
                and any(info.main_block for info in modules.values()))
    return ProjectIndex(root_abs, kept, by_name, edges, cpu_only=cpu_only)


def _index_module(rel: str, data: bytes) -> ModuleInfo:
    name = module_name(rel)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        return ModuleInfo(rel, name, error=str(error))
    package = name.rsplit(".", 1)[0] if "." in name else ""
    if rel.endswith("__init__.py"):
        package = name
    imports: dict[str, tuple[str, str]] = {}
    helpers: dict[str, tuple[str, ...]] = {}
    classes: list[str] = []
    saves: list[str] = []
    main_block = False
    reads: dict[str, tuple[int, str]] = {}
    ties: dict[str, tuple[tuple[str, ...], ...]] = {}
    calls_of: dict[str, tuple[tuple[str, str], ...]] = {}
    bases: dict[str, tuple[str, ...]] = {}
    abstract: list[str] = []
    aliases = torch_aliases(tree)
    for statement in tree.body:
        _imports_of(statement, package, imports)
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls_of[statement.name] = own_calls(statement)
            calls = _calls_in(statement)
            effects = _effects(calls)
            if effects:
                helpers[statement.name] = effects
            found = _first_read(statement, aliases)
            if found is not None:
                reads[statement.name] = found
            if _saves(calls):
                saves.append(statement.name)
        elif isinstance(statement, ast.ClassDef):
            classes.append(statement.name)
            bases[statement.name] = tuple(filter(None, (_dotted(base) for base in statement.bases)))
            tied = _ties(statement)
            if tied:
                ties[statement.name] = tied
            for item in statement.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    calls_of[f"{statement.name}.{item.name}"] = own_calls(item)
                    if _abstract(item):
                        abstract.append(f"{statement.name}.{item.name}")
                    calls = _calls_in(item)
                    effects = _effects(calls)
                    if effects:
                        helpers[f"{statement.name}.{item.name}"] = effects
                    found = _first_read(item, aliases)
                    if found is not None:
                        reads[f"{statement.name}.{item.name}"] = found
                    if _saves(calls):
                        saves.append(f"{statement.name}.{item.name}")
        elif isinstance(statement, ast.If) and _is_main_guard(statement.test):
            main_block = True
    # Nested imports (inside functions) bind project modules too.
    launcher = False
    # Distributed setup is torch's: torchrun's variables, an init_process_group or a spawn in a module that
    # never names torch (numpy over MPI, another framework's launcher) are that program's own business.
    torch_program = b"torch" in data
    distributed: list[tuple[int, str]] = []
    instances: list[tuple[str, str]] = []
    submodules: list[str] = []
    for node in walk_ast(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            _imports_of(node, package, imports)
        elif isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            last = dotted.rsplit(".", 1)[-1] if dotted else ""
            if not torch_program:
                continue
            if last in _DISTRIBUTED_CALLS or (dotted and dotted.rsplit(".", 1)[0] in ("DDP",)) or dotted == "DDP":
                distributed.append((node.lineno, last or dotted))
            elif last in _LAUNCHERS and dotted and dotted.rsplit(".", 1)[0] in _LAUNCHER_MODULES:
                launcher = True
                distributed.append((node.lineno, dotted))
            elif _environment_variable(node) in _TORCHRUN_VARIABLES:
                distributed.append((node.lineno, f"os.environ {_environment_variable(node)}"))
        elif torch_program and isinstance(node, ast.Subscript) and _environment_variable(node) in _TORCHRUN_VARIABLES:
            distributed.append((node.lineno, f"os.environ {_environment_variable(node)}"))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
            target, made = node.targets[0], _dotted(node.value.func)
            if made and made[:1].isupper() or (made and made.rsplit(".", 1)[-1][:1].isupper()):
                bound = target.id if isinstance(target, ast.Name) else (
                    target.attr if isinstance(target, ast.Attribute) else None)
                if bound is not None:
                    instances.append((bound, made))
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                        target.value.id == "self":
                    submodules.append(target.attr)
    reads_through_own_calls(reads, calls_of)
    return ModuleInfo(rel, name, imports, main_block, launcher, helpers, tuple(sorted(set(distributed))),
                      tuple(saves), tuple(dict.fromkeys(instances)), tuple(classes), read_helpers=reads,
                      ties=ties, loop_models=loop_model_calls(tree), calls=calls_of,
                      random_slices=random_slice_helpers(tree), mask_indexes=mask_index_helpers(tree), bases=bases,
                      abstract=tuple(abstract), offset_slices=_offset_slice_helpers(tree),
                      device_returns=_device_returns(tree), submodules=tuple(dict.fromkeys(submodules)))


def _offset_slice_helpers(tree: ast.Module) -> dict[str, tuple[int, int, int, str]]:
    """Top-level functions that slice a parameter at an offset another parameter gives (``source[:, i:i +
    seq_len]``, ``source[i + 1:i + 1 + n]`` in ``get_batch(source, i, ...)``): (sliced parameter's index,
    offset parameter's index, line, code) of the first."""
    found: dict[str, tuple[int, int, int, str]] = {}
    for function in tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in function.args.posonlyargs + function.args.args]
        for node in walk_ast(function):
            if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name) and node.value.id in params):
                continue
            elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            for element in elements:
                if not isinstance(element, ast.Slice) or element.lower is None or isinstance(element.lower,
                                                                                              ast.Constant):
                    continue
                offsets = [n.id for n in walk_ast(element.lower) if isinstance(n, ast.Name) and n.id in params
                           and n.id != node.value.id]
                if offsets:
                    candidate = (params.index(node.value.id), params.index(offsets[0]), node.lineno, ast.unparse(node))
                    if function.name not in found or candidate[2] < found[function.name][2]:
                        found[function.name] = candidate
                    break
    return found


def _device_move(node: ast.expr) -> bool:
    """``x.cuda()``, ``x.to(device)``, ``x.to("cuda")`` (a name that says device, or a CUDA string)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr == "cuda":
        return True
    if node.func.attr != "to" or not node.args:
        return False
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value.startswith("cuda")
    return "device" in (_dotted(first) or "").lower()


def _device_returns(tree: ast.Module) -> tuple[str, ...]:
    """Top-level functions whose every return gives a tensor moved to the device: the move itself, or a name
    the function binds to one (``if args.cuda: data = data.cuda()`` ... ``return data``)."""
    found: list[str] = []
    for function in tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = walk_ast(function)
        moved = {t.id for n in nodes if isinstance(n, ast.Assign) and _device_move(n.value)
                 for t in n.targets if isinstance(t, ast.Name)}
        returns = [n.value for n in nodes if isinstance(n, ast.Return)]
        if returns and all(v is not None and (_device_move(v) or (isinstance(v, ast.Name) and v.id in moved))
                           for v in returns):
            found.append(function.name)
    return tuple(found)


def _imports_of(statement: ast.stmt, package: str, imports: dict[str, tuple[str, str]]) -> None:
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.asname:
                imports.setdefault(alias.asname, (alias.name, ""))
            else:
                imports.setdefault(alias.name.split(".")[0], (alias.name.split(".")[0], ""))
    elif isinstance(statement, ast.ImportFrom):
        base = statement.module or ""
        if statement.level:
            parts = package.split(".") if package else []
            parts = parts[: len(parts) - (statement.level - 1)] if statement.level > 1 else parts
            base = ".".join([*parts, *([base] if base else [])])
        for alias in statement.names:
            if alias.name == "*":
                # No name to resolve, but an import all the same: ``from .dfcvae import *`` in a package's
                # __init__ makes dfcvae an imported module, not an entry file (XLA315 put the compile cache there).
                imports.setdefault(f"*{base}", (base, ""))
                continue
            local = alias.asname or alias.name
            # ``from pkg import module`` binds a module; ``from module import helper`` a name in it.
            imports.setdefault(local, (base, alias.name))


def _abstract(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The body only declares the method: a docstring, ``pass``, ``...``, ``raise NotImplementedError``."""
    for statement in function.body:
        if isinstance(statement, ast.Pass) or (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)):
            continue
        if isinstance(statement, ast.Raise) and statement.exc is not None and "NotImplementedError" in ast.unparse(statement.exc):
            continue
        return False
    return True


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _receiver_name(call: ast.Call) -> str:
    if isinstance(call.func, ast.Attribute):
        dotted = _dotted(call.func.value)
        if dotted is not None:
            return dotted.rsplit(".", 1)[-1].lower()
        if isinstance(call.func.value, ast.Call):  # scaler.scale(loss).backward()
            return ""
    return ""


def _calls_in(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
    """Every call in the function (nested functions and classes included), walked once for ``_effects`` and
    ``_saves``."""
    return [node for node in walk_ast(function) if isinstance(node, ast.Call)]


def _effects(calls: list[ast.Call]) -> tuple[str, ...]:
    """("backward",) / ("step",) / both: what one call of the function does to the model's gradients."""
    backward = step = False
    for node in calls:
        if not isinstance(node.func, ast.Attribute):
            continue
        method = node.func.attr
        if method == "backward":
            backward = True
        elif method == "step" and any(word in _receiver_name(node) for word in _SCALER_OR_OPTIMIZER) \
                and "sched" not in _receiver_name(node):
            step = True
        elif method == "optimizer_step":
            step = True
    return tuple(kind for kind, present in ((BACKWARD, backward), (STEP, step)) if present)


_READ_METHODS = ("item", "tolist", "numpy")
_PARAMETERS = ("weight", "bias")


def _self_path(node: ast.expr) -> str | None:
    dotted = _dotted(node)
    return dotted[len("self."):] if dotted and dotted.startswith("self.") else None


def _ties(cls: ast.ClassDef) -> tuple[tuple[str, ...], ...]:
    """``self.a.weight = self.b.weight`` / ``self._tie_or_clone_weights(self.a, self.b)`` in the class's methods
    (the same shapes as analysis/ties.py, read with ``ast``)."""
    found: list[tuple[str, ...]] = []
    # A tie made under an ``if`` gets a third part, "if": the call site cannot see the condition from here, so
    # the tie is reported rather than re-made (issue 36; analysis/ties.py maps the condition in one module).
    guarded = {id(inner) for node in walk_ast(cls) if isinstance(node, ast.If)
               for part in (*node.body, *node.orelse) for inner in ast.walk(part)}
    for node in walk_ast(cls):
        if isinstance(node, ast.Assign):
            right = _self_path(node.value)
            for target in node.targets:
                left = _self_path(target)
                if left and right and (left.rsplit(".", 1)[-1] in _PARAMETERS or right.rsplit(".", 1)[-1] in _PARAMETERS):
                    found.append((left, right, "if") if id(node) in guarded else (left, right))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "_tie_or_clone_weights" and len(node.args) >= 2:
            first, second = _self_path(node.args[0]), _self_path(node.args[1])
            if first and second:
                found.append((f"{first}.weight", f"{second}.weight"))
    return tuple(dict.fromkeys(found))


def _first_read(function: ast.FunctionDef | ast.AsyncFunctionDef, aliases: dict[str, str]) -> tuple[int, str] | None:
    """The first ``x.item()`` / ``x.tolist()`` / ``x.numpy()`` of a function's own code (nested functions are
    their own helpers), or truth test of a tensor (``if torch.min(y) < -1.:``, truth_tests.py), with " in a
    loop" when a loop of the function repeats it."""
    test = first_truth_test(function, aliases)
    found = (test[0], test[1] + (" in a loop" if test[2] else "")) if test is not None else None
    todo: list[tuple[ast.AST, bool]] = [(child, False) for child in function.body]
    while todo:
        node, looped = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _READ_METHODS \
                and not node.args:
            try:
                code = ast.unparse(node)
            except Exception:  # noqa: BLE001 (a node ast cannot write back: keep the method name)
                code = f"...{node.func.attr}()"
            candidate = (node.lineno, code + (" in a loop" if looped else ""))
            if found is None or candidate[0] < found[0]:
                found = candidate
        inner = looped or isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))
    return found


def _saves(calls: list[ast.Call]) -> bool:
    return any(_dotted(call.func) in ("torch.save", "xm.save") for call in calls)


def _environment_variable(node: ast.AST) -> str | None:
    if isinstance(node, ast.Subscript) and _dotted(node.value) == "os.environ":
        index = node.slice
        return index.value if isinstance(index, ast.Constant) and isinstance(index.value, str) else None
    if isinstance(node, ast.Call) and node.args and _dotted(node.func) in ("os.environ.get", "os.getenv"):
        first = node.args[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    return None
