"""The second file of the loader ``xla-migrate verify`` puts into the processes it runs (copied beside
:mod:`xla_migrate.verify.child`, as ``xla_migrate_verify_hooks.py``; standard library, torch and NumPy only, each
patched after its import). It records, through the loader's ``_write``:

- what makes the run's random numbers differ from the original's (``random`` events): train-mode random modules
  on the XLA device (dropout, RReLU, attention dropout; a global forward pre-hook), torch's generator used before
  any ``torch.manual_seed`` (parameters initialized, or the first optimizer step), draws from Python's
  ``random`` or NumPy's global generator before their seed;
- where the trained parameters live (``optimizer`` events: a global optimizer step pre-hook, the first steps
  of each optimizer), mixed precision (``autocast`` events: device type, dtype, enabled) and what chose the
  device (``cuda-gate``: ``torch.cuda.is_available()`` / ``device_count()`` called from the script, with their
  answers; ``device-flags``: the device-like options argparse returned).

``$XLA_MIGRATE_VERIFY_NO_DROPOUT=1`` (``--deterministic``) puts train-mode random modules in eval mode and
switches the functional forms off (``F.dropout`` and its kin, ``rrelu``, attention's ``dropout_p``).
"""

import os
import sys

_NO_DROPOUT = os.environ.get("XLA_MIGRATE_VERIFY_NO_DROPOUT") == "1"
DEVICE_WORDS = ("cuda", "gpu", "device", "xla", "tpu", "cpu", "accel", "mps")  # argparse options about the device

_core = None  # the loader (its _write, _caller and skip folders), bound at start-up
_state = {"seeded": {"torch": False, "python": False, "numpy": False}, "noted": set(), "optimizer_steps": {},
          "optimizer_devices": {}, "flags_seen": False, "module_kinds": {}, "unseeded": set()}


def bind(core) -> None:
    global _core
    _core = core



def _note(kind: str, where: str, **extra) -> None:
    """One ``random`` event per kind and source line."""
    key = (kind, where)
    if key in _state["noted"]:
        return
    _state["noted"].add(key)
    _core._write({"event": "random", "kind": kind, "where": where, **extra})


def _user_call() -> bool:
    """Whether the function calling the wrapper that asks was called from the user's code (not torch's)."""
    filename = sys._getframe(2).f_code.co_filename
    return not any(filename.startswith(folder) for folder in _core._state["skip_dirs"])


def _random_module_kind(module):
    """'dropout' (or 'rrelu', 'attention dropout') for a module whose train mode draws random numbers."""
    cls = type(module)
    kinds = _state["module_kinds"]
    if cls not in kinds:
        import torch.nn as nn

        kind = None
        if isinstance(module, nn.modules.dropout._DropoutNd):
            kind = "dropout"
        elif isinstance(module, nn.RReLU):
            kind = "rrelu"
        elif isinstance(module, nn.MultiheadAttention):
            kind = "attention dropout"
        kinds[cls] = kind
    kind = kinds[cls]
    if kind == "dropout" and not getattr(module, "p", 0):
        return None
    if kind == "attention dropout" and not getattr(module, "dropout", 0):
        return None
    return kind


def _random_module_pre_hook(module, args):
    if not module.training:
        return None
    kind = _random_module_kind(module)
    if kind is None:
        return None
    if _NO_DROPOUT:
        module.training = False  # --deterministic: eval mode for this module (its only train-mode behaviour)
        return None
    first = args[0] if args else None
    if getattr(getattr(first, "device", None), "type", None) == "xla":
        _note(kind, _core._caller(), module=type(module).__name__)
    return None


# The functional forms --deterministic switches off: (name, index of the argument, its keyword, the "off" value).
_FUNCTIONAL_RANDOM = {
    "torch.nn.functional": [("dropout", 2, "training", False), ("dropout1d", 2, "training", False),
                            ("dropout2d", 2, "training", False), ("dropout3d", 2, "training", False),
                            ("alpha_dropout", 2, "training", False), ("feature_alpha_dropout", 2, "training", False),
                            ("rrelu", 3, "training", False), ("scaled_dot_product_attention", 4, "dropout_p", 0.0)],
    "torch": [("dropout", 2, "train", False), ("feature_dropout", 2, "train", False),
              ("alpha_dropout", 2, "train", False), ("feature_alpha_dropout", 2, "train", False)],
}


def _switched_off(function, index: int, keyword: str, off):
    def random_off(*args, **kwargs):
        if len(args) > index:
            args = args[:index] + (off,) + args[index + 1:]
        else:
            kwargs[keyword] = off
        return function(*args, **kwargs)

    random_off.__wrapped__ = function
    random_off.__name__ = getattr(function, "__name__", "random_off")
    random_off.__doc__ = getattr(function, "__doc__", None)
    return random_off


def _wrap_seed(family: str, function, seeds=lambda args, kwargs: True):
    def seed(*args, **kwargs):
        _state["seeded"][family] = bool(seeds(args, kwargs))
        return function(*args, **kwargs)

    seed.__wrapped__ = function
    seed.__name__ = getattr(function, "__name__", "seed")
    return seed


def _wrap_draw(family: str, function):
    """A draw from Python's or NumPy's global generator: noted when that generator was never seeded."""

    def draw(*args, **kwargs):
        if not _state["seeded"][family] and family not in _state["unseeded"]:
            _state["unseeded"].add(family)  # the first such draw is enough (and the rest cost nothing)
            _note(f"unseeded {family}", _core._caller(), call=getattr(function, "__name__", "?"))
        return function(*args, **kwargs)

    draw.__wrapped__ = function
    draw.__name__ = getattr(function, "__name__", "draw")
    draw.__doc__ = getattr(function, "__doc__", None)
    return draw


_PYTHON_DRAWS = ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample", "gauss",
                 "normalvariate", "getrandbits", "betavariate", "expovariate", "triangular", "lognormvariate",
                 "vonmisesvariate", "gammavariate", "paretovariate", "weibullvariate", "randbytes")
_NUMPY_DRAWS = ("rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice", "shuffle",
                "permutation", "uniform", "normal", "standard_normal", "binomial", "poisson", "beta", "exponential",
                "integers", "bytes")


def patch_python_random() -> None:
    import random

    for name in _PYTHON_DRAWS:
        if hasattr(random, name):
            setattr(random, name, _wrap_draw("python", getattr(random, name)))
    random.seed = _wrap_seed("python", random.seed, lambda args, kwargs: (args or [kwargs.get("a")])[0] is not None)
    random.setstate = _wrap_seed("python", random.setstate)


def patch_numpy_random(module) -> None:
    for name in _NUMPY_DRAWS:
        if callable(getattr(module, name, None)):
            setattr(module, name, _wrap_draw("numpy", getattr(module, name)))
    if callable(getattr(module, "seed", None)):
        module.seed = _wrap_seed("numpy", module.seed,
                                 lambda args, kwargs: (args or [kwargs.get("seed")])[0] is not None)
    if callable(getattr(module, "set_state", None)):
        module.set_state = _wrap_seed("numpy", module.set_state)


def _check_torch_seeded(what: str) -> None:
    if not _state["seeded"]["torch"] and "torch" not in _state["unseeded"]:
        _state["unseeded"].add("torch")
        _note("unseeded torch", _core._caller(2), before=what)


def _wrap_init(function):
    """nn.init's functions draw the initial parameters: torch's generator should be seeded by then."""

    def init(*args, **kwargs):
        _check_torch_seeded("parameters initialized")
        return function(*args, **kwargs)

    init.__wrapped__ = function
    init.__name__ = getattr(function, "__name__", "init")
    init.__doc__ = getattr(function, "__doc__", None)
    return init


def _optimizer_pre_hook(optimizer, args, kwargs):
    """Where the parameters an optimizer steps live, at its first steps (a device move may come late)."""
    steps = _state["optimizer_steps"]
    count = steps.get(id(optimizer), 0)
    steps[id(optimizer)] = count + 1
    if count == 0 and len(steps) == 1:
        _check_torch_seeded("the first optimizer step")
    if count >= 3:
        return None
    devices = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            kind = param.device.type
            devices[kind] = devices.get(kind, 0) + param.numel()
    if _state["optimizer_devices"].get(id(optimizer)) != devices:
        _state["optimizer_devices"][id(optimizer)] = devices
        _core._write({"event": "optimizer", "optimizer": type(optimizer).__name__, "step": count + 1,
                "devices": devices, "where": _core._caller(), "sharding": _sharding(optimizer)})
    return None


def _sharding(optimizer) -> dict | None:
    """Under SPMD, the parameter elements an optimizer steps that are split over devices and those every device
    holds whole (replicated, or no annotation): verify --devices. None when SPMD is off. When some are split
    (FSDPv2, an annotated weight) the whole ones are named too: a wrap missed them."""
    try:
        import torch_xla
        import torch_xla.runtime as xr

        if not xr.is_spmd():
            return None
        counts = {"sharded": 0, "replicated": 0}
        whole = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.device.type != "xla":
                    continue
                spec = torch_xla._XLAC._get_xla_sharding_spec(param)
                split = spec.startswith("{devices=") and "last_tile_dim_replicate" not in spec
                counts["sharded" if split else "replicated"] += param.numel()
                if not split:
                    whole.append(param)
        counts["whole"] = _names(whole) if counts["sharded"] and whole else []
        return counts
    except Exception:  # only informative: never break the user's run for it
        return None


WHOLE_NAMED = 8


def _names(params) -> list[str]:
    """`name [shape]` of the first parameters, named as the largest module holding each names it (the root, not
    a block); `[shape]` alone for one no module holds."""
    import gc

    import torch

    wanted = {id(p): p for p in params[:WHOLE_NAMED]}
    modules = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
    modules.sort(key=lambda m: sum(1 for _ in m.parameters()), reverse=True)
    names = {}
    for module in modules:
        for name, param in module.named_parameters():
            if id(param) in wanted and id(param) not in names:
                names[id(param)] = name.replace("_orig_module.", "")
        if len(names) == len(wanted):
            break
    return [f"{names[key]} {list(p.shape)}" if key in names else str(list(p.shape)) for key, p in wanted.items()]


def _wrap_gate(name: str, function):
    """torch.cuda.is_available() / device_count() called from the script: the answer decides the device."""

    def gate(*args, **kwargs):
        result = function(*args, **kwargs)
        if _user_call():
            where = _core._caller()
            if ("gate", where) not in _state["noted"]:
                _state["noted"].add(("gate", where))
                _core._write({"event": "cuda-gate", "call": f"torch.cuda.{name}()", "result": result, "where": where})
        return result

    gate.__wrapped__ = function
    gate.__name__ = name
    gate.__doc__ = getattr(function, "__doc__", None)
    return gate


def _patch_autocast(autocast) -> None:
    """Mixed precision as the run uses it: one ``autocast`` event per device type, dtype and enabled."""
    enter = autocast.__enter__

    def enter_observed(self, *args, **kwargs):
        try:
            key = ("autocast", str(getattr(self, "device", "?")), str(getattr(self, "fast_dtype", "?")),
                   bool(getattr(self, "_enabled", True)))
            if key not in _state["noted"]:
                _state["noted"].add(key)
                _core._write({"event": "autocast", "device_type": key[1], "dtype": key[2].replace("torch.", ""),
                        "enabled": key[3], "where": _core._caller()})
        except Exception:  # only informative
            pass
        return enter(self, *args, **kwargs)

    enter_observed.__wrapped__ = enter
    autocast.__enter__ = enter_observed


def patch_argparse() -> None:
    import argparse

    parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_known_args_observed(self, *args, **kwargs):
        result = parse_known_args(self, *args, **kwargs)
        if not _state["flags_seen"]:
            try:
                namespace = result[0]
                flags = {name: value for name, value in vars(namespace).items()
                         if any(word in name.lower() for word in DEVICE_WORDS)
                         and (value is None or isinstance(value, (bool, int, float, str)))}
                if flags:
                    _state["flags_seen"] = True
                    _core._write({"event": "device-flags", "flags": flags, "where": _core._caller()})
            except Exception:  # only informative
                pass
        return result

    parse_known_args_observed.__wrapped__ = parse_known_args
    argparse.ArgumentParser.parse_known_args = parse_known_args_observed


def patch_torch(torch) -> None:
    if "torch" in _core._state["patched"]:
        return
    _core._state["patched"].add("torch")
    for folder in [_core._package_dir(torch), *_core._library_dirs()]:
        if folder not in _core._state["skip_dirs"]:
            _core._state["skip_dirs"].append(folder)
    seeded = _wrap_seed("torch", torch.manual_seed)
    torch.manual_seed = seeded
    torch.random.manual_seed = seeded
    torch.set_rng_state = _wrap_seed("torch", torch.set_rng_state)
    torch.seed = _wrap_seed("torch", torch.seed, lambda args, kwargs: False)  # a seed from the OS: unseeded
    import torch.nn.init as init

    for name in ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "orthogonal_", "sparse_"):
        if hasattr(init, name):
            setattr(init, name, _wrap_init(getattr(init, name)))
    autocast = getattr(getattr(torch, "amp", None), "autocast_mode", None)
    if autocast is not None and hasattr(autocast, "autocast"):
        _patch_autocast(autocast.autocast)
    for name in ("is_available", "device_count"):
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, _wrap_gate(name, getattr(torch.cuda, name)))
    try:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_module_forward_pre_hook(_random_module_pre_hook)
        register_optimizer_step_pre_hook(_optimizer_pre_hook)
    except ImportError:  # torch older than 2.0: no global optimizer hooks (the runs report no optimizer)
        pass
    if _NO_DROPOUT:
        for module_name, entries in _FUNCTIONAL_RANDOM.items():
            owner = sys.modules.get(module_name)
            for name, index, keyword, off in entries:
                if owner is not None and callable(getattr(owner, name, None)):
                    setattr(owner, name, _switched_off(getattr(owner, name), index, keyword, off))
