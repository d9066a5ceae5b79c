"""The target table: how each concept is spelled in each torch_xla API generation.

Rules never hard-code a torch_xla spelling; they ask for a concept (``ctx.spell("device")``) and the chosen
target answers. A spelling is a template: ``{xm}`` and friends are replaced by the script's local name for
that module (an import is added when the script has none), ``{0}``, ``{1}``... by the rule's arguments.

Each spelling also carries the torch_xla releases it exists in, so the report can say on which releases the
migrated script runs: the intersection over the spellings the output actually uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Placeholder -> (module, alias used when the script has no import of it yet).
MODULE_PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "torch"),
    "torch_xla": ("torch_xla", "torch_xla"),
    "xm": ("torch_xla.core.xla_model", "xm"),
    "xr": ("torch_xla.runtime", "xr"),
    "pl": ("torch_xla.distributed.parallel_loader", "pl"),
    "xmp": ("torch_xla.distributed.xla_multiprocessing", "xmp"),
    "xla_amp": ("torch_xla.amp", "xla_amp"),
    "syncfree": ("torch_xla.amp.syncfree", "syncfree"),
    "xs": ("torch_xla.distributed.spmd", "xs"),
    "np": ("numpy", "np"),
    "fsdpv2": ("torch_xla.experimental.spmd_fully_sharded_data_parallel", "fsdpv2"),
    "os": ("os", "os"),
    "dist": ("torch.distributed", "dist"),
    "mp": ("torch.multiprocessing", "mp"),
    "dist_fn": ("torch.distributed.nn.functional", "dist_fn"),
}

Version = tuple[int, int]


def parse_version(text: str) -> Version:
    parts = text.split("+")[0].split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def format_version(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


@dataclass(frozen=True)
class Spelling:
    template: str
    since: Version = (1, 13)
    # First release without it (None: still present in the newest release we know).
    removed_in: Version | None = None


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    spellings: dict[str, Spelling]
    # The releases the output is proven on by the proof tier.
    verified_on: tuple[str, ...]
    # The torch_xla API generation it emits: an API exists there when since <= generation < removed_in.
    generation: Version = (1, 13)
    # Facts a rule may need that are not a single spelling.
    has_grad_scaler: bool = True
    autocast_dtype: str | None = None
    aliases: tuple[str, ...] = field(default=())
    # The data-parallel form a distributed script gets unless --data-parallel says otherwise (DESIGN.md
    # section 7): "ddp" keeps torch.distributed and DDP on the xla process group, "xm" is the seeds' recipe,
    # "auto" takes xm where every update is shown reduced and the replicas start equal, else ddp
    # (analysis/data_parallel.py).
    default_data_parallel: str = "auto"
    # torchrun can start the ddp form's workers: init_process_group("xla", init_method="xla://") reads its
    # variables (torch_xla 2.1+). Without it (the 1.13 API) the ddp form launches with xmp.spawn and joins the
    # group with the XLA ordinals and MASTER_ADDR/MASTER_PORT, as torch_xla 1.13's docs/ddp.md does.
    torchrun_rendezvous: bool = False
    # What to install for the output (the releases the proof tier runs it on; tools/xla_envs.sh).
    pins: tuple[str, ...] = ()
    # The runtime the output runs on: "torch_xla" (the spellings' releases are torch_xla's), or "torch_tpu"
    # (TorchTPU, DESIGN.md section 10: no torch_xla release applies, so none is chosen or warned about).
    runtime: str = "torch_xla"
    # Code already on torch_xla is migrated to this target too (torchtpu's upgrade, XLA703/XLA704), not left.
    upgrades_xla_code: bool = False

    def spelling(self, concept: str) -> Spelling:
        try:
            return self.spellings[concept]
        except KeyError:
            raise KeyError(f"target {self.name!r} has no spelling for {concept!r}") from None


def runs_on(target: Target, concepts: set[str]) -> tuple[Version, Version | None]:
    """The torch_xla releases [low, high) on which output using these concepts runs."""
    low: Version = (1, 13)
    high: Version | None = None
    for concept in concepts:
        spelling = target.spelling(concept)
        low = max(low, spelling.since)
        if spelling.removed_in is not None:
            high = spelling.removed_in if high is None else min(high, spelling.removed_in)
    return low, high


def api_releases() -> dict[str, tuple[str, Spelling]]:
    """Qualified name of each torch_xla API a target spells (``torch_xla.runtime.world_size``) -> (concept,
    its spelling with the releases it exists in), over every target: what XLA904 checks scripts against."""
    table: dict[str, tuple[str, Spelling]] = {}
    for target in TARGETS.values():
        for concept, spelling in target.spellings.items():
            placeholder, _, rest = spelling.template.partition("}.")
            module = MODULE_PLACEHOLDERS.get(placeholder.lstrip("{"), ("", ""))[0]
            attribute = rest.split("(")[0]
            if module.startswith("torch_xla") and attribute.replace(".", "").replace("_", "").isalnum():
                table.setdefault(f"{module}.{attribute}", (concept, spelling))
    return table


DATA_PARALLEL_FORMS = ("auto", "ddp", "xm", "spmd")
# The spmd form spells these concepts as ``spmd_<concept>`` (MigrationContext.spell): one process per host, so
# ranks are process indexes and the loader shards each batch over the mesh of this host's devices.
SPMD_CONCEPTS = ("world_size", "ordinal", "is_global_master", "device_loader")


def data_parallel_problem(target: Target, form: str) -> str | None:
    """Why ``form`` cannot be used with ``target`` (one line), or None. Every target has ddp and xm: the
    ``xla`` process group exists from torch_xla 1.13 (its ``xla_backend``), only ``xla://`` is 2.1+. Only
    targets whose table spells SPMD (2.x) have spmd."""
    if form not in DATA_PARALLEL_FORMS:
        return f"--data-parallel {form}: unknown form (known: {', '.join(DATA_PARALLEL_FORMS)})"
    if form == "spmd" and "use_spmd" not in target.spellings:
        return (f"--data-parallel spmd: the {target.name} target (torch_xla {format_version(target.generation)} "
                "API) has no SPMD; use --target 2.9")
    return None


def describe_releases(low: Version, high: Version | None, runtime: str = "torch_xla") -> str:
    if high is None:
        return f"{runtime} >= {format_version(low)}"
    return f"{runtime} >= {format_version(low)}, < {format_version(high)}"


# The torch_tpu release whose wheel the torchtpu target's names were checked against (tests/test_torchtpu.py).
TORCH_TPU_RELEASE: Version = (0, 2)


_SEEDS = {
    "device": Spelling("{xm}.xla_device()"),
    "step_barrier": Spelling("{xm}.mark_step()"),
    "optimizer_step": Spelling("{xm}.optimizer_step({0})"),
    "save": Spelling("{xm}.save"),
    "wait_device_ops": Spelling("{xm}.wait_device_ops()"),
    "set_rng_state": Spelling("{xm}.set_rng_state({0})"),
    # Seeds the XLA device's generator, which torch.manual_seed leaves alone (XLA110).
    "seed_device": Spelling("{xm}.set_rng_state({0})"),
    "add_step_closure": Spelling("{xm}.add_step_closure"),
    "device_loader": Spelling("{pl}.MpDeviceLoader({0}, {1})"),
    "device_hw": Spelling("{xm}.xla_device_hw({0})"),
    "world_size": Spelling("{xm}.xrt_world_size()", removed_in=(2, 7)),
    "ordinal": Spelling("{xm}.get_ordinal()", removed_in=(2, 7)),
    "local_ordinal": Spelling("{xm}.get_local_ordinal()"),
    "is_master": Spelling("{xm}.is_master_ordinal()"),
    "rendezvous": Spelling("{xm}.rendezvous({0})"),
    "fetch_gradients": Spelling("{xm}._fetch_gradients({0})"),
    "all_reduce": Spelling("{xm}.all_reduce"),
    "launch": Spelling("{xmp}.spawn({0}, args=({1}))"),
    # The global master (rank 0 of all replicas; is_master itself checks the local ordinal).
    "is_global_master": Spelling("{xm}.is_master_ordinal(local=False)"),
    "distributed_sampler": Spelling("{torch}.utils.data.DistributedSampler"),
    "autocast": Spelling("{xla_amp}.autocast({0})"),
    "grad_scaler": Spelling("{xla_amp}.GradScaler", removed_in=(2, 9)),
    "syncfree": Spelling("{syncfree}.{0}"),
    # Hugging Face TrainingArguments(optim=...): the syncfree AdamW on XLA (transformers' name for it).
    "hf_xla_optim": Spelling('"adamw_torch_xla"'),
    "all_gather": Spelling("{xm}.all_gather"),
    # In-place broadcast from one replica: every replica multiplies its tensors by a device-data 1 or 0 (the
    # same graph everywhere), then all-reduces them. In torch_xla since 1.13.0 (pytorch/xla #3952; 1.12 has
    # none), done the same way through 2.9.
    "collective_broadcast": Spelling("{xm}.collective_broadcast"),
    # The ddp form on the 1.13 API (torch_xla 1.13 docs/ddp.md): the xla process group joined with the XLA
    # ordinals (MASTER_ADDR/MASTER_PORT defaulted before it: the env:// rendezvous reads them).
    "xla_process_group": Spelling('"xla", rank={xm}.get_ordinal(), world_size={xm}.xrt_world_size()',
                                  removed_in=(2, 7)),
    # The XLA device as a plain value: names the device without starting the runtime, so it may be built
    # before the launcher (module level, default arguments, decorators). Each PJRT process's device is
    # xla:0; the index keeps it valid where torch_xla asks for one (xm.xla_device_hw, torch_xla.amp.autocast).
    # A device option's value is the type alone ("xla", device_type), as a user types it.
    "lazy_device": Spelling('{torch}.device("xla:0")'),
    # A device the user names in an option or a config: the seeds' API wants an index where it asks for the
    # device (torch_xla.amp.autocast(device), xm.xla_device_hw(device) raise "Invalid device format: xla").
    "device_name": Spelling('"xla:0"'),
    "device_type": Spelling('"xla"'),
    # Device memory figures (a dict; PJRT CPU has none: it raises).
    "memory_info": Spelling("{xm}.get_memory_info({0})"),
}

_CURRENT = {
    **_SEEDS,
    "device": Spelling("{torch_xla}.device()", since=(2, 3)),
    "step_barrier": Spelling("{torch_xla}.sync()", since=(2, 4)),
    # torch_xla.manual_seed calls xm.set_rng_state (checked on 2.6.1 and 2.9; earlier releases not checked).
    "seed_device": Spelling("{torch_xla}.manual_seed({0})", since=(2, 6)),
    "world_size": Spelling("{xr}.world_size()", since=(2, 1)),
    "ordinal": Spelling("{xr}.global_ordinal()", since=(2, 1)),
    "local_ordinal": Spelling("{xr}.local_ordinal()", since=(2, 1)),
    "launch": Spelling("{torch_xla}.launch({0}, args=({1}))", since=(2, 5)),
    "autocast": Spelling('{torch}.autocast("xla", dtype={torch}.bfloat16)', since=(2, 1)),
    # The persistent compilation cache (torch_xla 2.2's release notes, "persistent compilation cache").
    "compile_cache": Spelling("{xr}.initialize_cache({0}, readonly=False)", since=(2, 2)),
    # A scaler that scales nothing, for scripts that still read one (get_scale(), a checkpoint's state).
    "disabled_grad_scaler": Spelling('{torch}.amp.GradScaler("xla", enabled=False)', since=(2, 3)),
    # The current API's autocast takes the type ("xla"), not the device: the option's value is what users type.
    "device_name": Spelling('"xla"'),
    # The ddp form: torch.distributed on torch_xla's process group (``import torch_xla.distributed.xla_backend``
    # registers the "xla" backend and the xla:// init method, both 2.1+). Only targets of 2.1 or later have it.
    "xla_process_group": Spelling('"xla", init_method="xla://"', since=(2, 1)),
    # torch_xla's dynamo backend for torch.compile (2.1+; the 1.13 generation had "torchxla_trace_once", so
    # the sagemaker target drops torch.compile instead).
    "dynamo_backend": Spelling('"openxla"', since=(2, 1)),
    # The spmd form (DESIGN.md section 9, measured on torch_xla 2.9): one program per host over a mesh of
    # every device; the compiler inserts the collectives. The mesh is set globally, so a loader anywhere in
    # the program finds it.
    "use_spmd": Spelling("{xr}.use_spmd()", since=(2, 3)),
    "device_count": Spelling("{xr}.global_runtime_device_count()", since=(2, 1)),
    "spmd_data_mesh": Spelling('{xs}.set_global_mesh({xs}.Mesh({np}.arange({0}), ({0},), ("data",)))',
                               since=(2, 3)),
    # minibatch=True: each host's loader holds its part of the global batch (the sampler splits the data over
    # the hosts, xr.process_count()); on one host that part is the whole batch (measured: the same losses).
    "spmd_device_loader": Spelling(
        '{pl}.MpDeviceLoader({0}, {1}, input_sharding={xs}.ShardingSpec({xs}.get_global_mesh(), ("data", None), '
        'minibatch=True))', since=(2, 3)),
    # FSDPv2: the parameters sharded over the same devices, in the same order, as the "data" mesh (so the
    # batch sharded on "data" is sharded on "fsdp" too).
    "spmd_fsdp": Spelling('{fsdpv2}.SpmdFullyShardedDataParallel({0}, mesh={xs}.Mesh({np}.arange({1}), ({1}, 1), '
                          '("fsdp", "model")))', since=(2, 3)),
    "spmd_world_size": Spelling("{xr}.process_count()", since=(2, 1)),
    "spmd_ordinal": Spelling("{xr}.process_index()", since=(2, 1)),
    "spmd_is_global_master": Spelling("{xr}.process_index() == 0", since=(2, 1)),
}
del _CURRENT["grad_scaler"]

# TorchTPU (torch_tpu 0.2.0, DESIGN.md section 10): eager, so no step barrier, device loader or optimizer step
# of torch_xla; torch.accelerator for what torch.cuda did (the torch.tpu helpers raise from user code on
# torch >= 2.11), so the output also runs on the CPU where the original fell back to it. Only the rules whose
# targets name "torchtpu" run for it (transforms/torchtpu/).
_TORCHTPU = {
    # The current accelerator (tpu under torch_tpu), else the CPU: where the original fell back to the CPU
    # without CUDA, the output falls back without a TPU (it trains on the CPU here: tests/test_torchtpu.py).
    "device": Spelling('{torch}.accelerator.current_accelerator(check_available=True) or {torch}.device("cpu")'),
    "lazy_device": Spelling('{torch}.accelerator.current_accelerator(check_available=True) or {torch}.device("cpu")'),
    # `device = "cuda" if torch.cuda.is_available() else "cpu"`: the string, chosen the same way.
    "device_string": Spelling('{torch}.accelerator.current_accelerator().type if {torch}.accelerator.is_available() '
                              'else "cpu"'),
    # A device named in an option or a config: TorchTPU's device type.
    "device_name": Spelling('"tpu"'),
    "device_type": Spelling('"tpu"'),
    # torch.cuda.<name> -> torch.accelerator.<name> (availability, count, synchronize, memory statistics).
    "accelerator_api": Spelling("{torch}.accelerator.{0}"),
    "manual_seed": Spelling("{torch}.manual_seed({0})"),
    # The accelerator's type ("tpu" under TorchTPU), else the CPU's: a CPU-only torch has no "tpu" autocast, and
    # the CPU's (disabled, or bf16 where the original chose bf16 there) trains as the original did.
    "autocast": Spelling('{torch}.autocast({torch}.accelerator.current_accelerator().type if '
                         '{torch}.accelerator.is_available() else "cpu", dtype={torch}.bfloat16)'),
    # A scaler that scales nothing, for scripts that still read one (get_scale(), a checkpoint's state);
    # disabled, it touches no device (it builds on a CPU-only torch too).
    "disabled_grad_scaler": Spelling('{torch}.amp.GradScaler("tpu", enabled=False)'),
    "save": Spelling("{torch}.save"),
    "process_group_backend": Spelling('"tpu_dist"'),
    # Upgrading torch_xla code (XLA703, XLA704). Ranks from torchrun's environment: they hold before and after
    # the process group is joined (the sagemaker output passes them to init_process_group), and a lone process
    # (the CPU) is rank 0 of 1.
    "world_size": Spelling('int({os}.environ.get("WORLD_SIZE", 1))'),
    "ordinal": Spelling('int({os}.environ.get("RANK", 0))'),
    "local_ordinal": Spelling('int({os}.environ.get("LOCAL_RANK", 0))'),
    "is_global_master": Spelling('int({os}.environ.get("RANK", 0)) == 0'),
    "is_master": Spelling('int({os}.environ.get("LOCAL_RANK", 0)) == 0'),
    # xm.wait_device_ops(): the accelerator's synchronize, which raises without one (the CPU).
    "wait_device_ops": Spelling("{torch}.accelerator.synchronize()"),
    "accelerator_available": Spelling("{torch}.accelerator.is_available()"),
    "optimizer_class": Spelling("{torch}.optim.{0}"),
    # xm.xla_device_hw(d): the hardware's name in capitals, "TPU" or "CPU" (TorchTPU's device types).
    "device_hw": Spelling("{torch}.device({0}).type.upper()"),
    # The xm form's data parallelism upgraded to DDP (transforms/torchtpu/xm_form_ddp.py): each worker joins
    # the tpu_dist group (gloo without an accelerator: the CPU), the model is wrapped without device_ids, and
    # the launch sets TorchTPU's variables (on a TPU) before mp.spawn starts one worker per device.
    "join_process_group": Spelling('{dist}.init_process_group("tpu_dist" if {torch}.accelerator.is_available() '
                                   'else "gloo")'),
    # torch_xla's "xla" process group upgraded: tpu_dist, gloo without an accelerator (the CPU run here).
    "process_group_backend_or_cpu": Spelling('"tpu_dist" if {torch}.accelerator.is_available() else "gloo"'),
    "ddp_wrap": Spelling("{torch}.nn.parallel.DistributedDataParallel({0})"),
    "worker_count": Spelling("{torch}.accelerator.device_count() if {torch}.accelerator.is_available() else 1"),
    "on_tpu": Spelling('{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == '
                       '"tpu"'),
    "launch_env": Spelling("{torch}.tpu.distributed.set_tpu_launch_env(nproc_per_node={0})"),
    "spawn": Spelling("{mp}.spawn({0})"),
    "barrier": Spelling("{dist}.barrier()"),
    "all_reduce": Spelling("{dist}.all_reduce({0})"),
    "broadcast": Spelling("{dist}.broadcast({0}, src={1})"),
    # xm.all_gather(t): the ranks' tensors concatenated on dim 0 (torch.distributed.nn's keeps the gradient).
    "all_gather": Spelling("{torch}.cat({dist_fn}.all_gather({0}))"),
}

TARGETS: dict[str, Target] = {
    "sagemaker": Target(
        name="sagemaker",
        description="the SageMaker Training Compiler recipe (torch_xla 1.13 API generation), as in the seeds",
        spellings=_SEEDS,
        verified_on=("2.6.1",),
        aliases=("1.13",),
        pins=("torch==2.6.0", "torch-xla==2.6.1"),
    ),
    "2.9": Target(
        name="2.9",
        description="current torch_xla (2.9): torch_xla.device(), torch_xla.sync(), torch_xla.runtime, bf16 AMP",
        spellings=_CURRENT,
        verified_on=("2.9.0",),
        generation=(2, 9),
        has_grad_scaler=False,
        autocast_dtype="bfloat16",
        torchrun_rendezvous=True,
        pins=("torch==2.9.0", "torch-xla==2.9.0"),
    ),
    "torchtpu": Target(
        name="torchtpu",
        description="TorchTPU preview (torch_tpu 0.2.0): eager, torch.device(\"tpu\") through torch.accelerator, "
                    "bf16 autocast; nothing run on a TPU here",
        spellings=_TORCHTPU,
        verified_on=(),
        has_grad_scaler=False,
        autocast_dtype="bfloat16",
        torchrun_rendezvous=True,
        pins=("torch>=2.11", "torch_tpu==0.2.0"),
        runtime="torch_tpu",
        upgrades_xla_code=True,
    ),
}

DEFAULT_TARGET = "sagemaker"


def get_target(name: str) -> Target:
    for target in TARGETS.values():
        if name == target.name or name in target.aliases:
            return target
    known = ", ".join(TARGETS)
    raise ValueError(f"unknown target {name!r} (known: {known})")


def target_for_release(version: Version) -> Target | None:
    """The newest target whose full spelling set runs on this torch_xla release."""
    fitting = [
        t for t in TARGETS.values() if t.runtime == "torch_xla" and release_fits(version, *runs_on(t, set(t.spellings)))
    ]
    return fitting[-1] if fitting else None


def release_fits(version: Version, low: Version, high: Version | None) -> bool:
    return version >= low and (high is None or version < high)
