"""Issue 29: CUDA gates decided by what their branches hold after migration, devices by where they come from,
and an honest report (the golden fixtures XLA104/decided_by_branches, XLA101/device_options, XLA108 and the
proof tier's tests/xla/test_gates_proof.py cover the shapes; these are the edges)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xla_migrate import migrate

ROOT = Path(__file__).resolve().parent.parent


def _code(source: str, target: str = "2.9", **options) -> tuple[str, list]:
    result = migrate(textwrap.dedent(source), target=target, **options)
    assert result.error is None, result.error
    compile(result.code, "out.py", "exec")
    return result.code, result.findings


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_gate_never_turns_a_cuda_only_path_on(target):
    code, findings = _code("""
        import torch

        def run(model, x):
            if torch.cuda.is_available():
                s = torch.cuda.Stream()
                with torch.cuda.stream(s):
                    y = model(x)
                print(s.query())  # a stream used otherwise than XLA111 can remove: the branch stays CUDA-only
            else:
                y = model(x)
            return y
        """, target)
    assert "torch.cuda" not in code and "y = model(x)" in code
    (finding,) = [f for f in findings if f.code == "XLA104"]
    assert "left out on XLA" in finding.message and "lines 6-9" in finding.message


def test_an_assert_is_never_given_the_value_that_fails_it():
    code, _ = _code("""
        import torch
        assert torch.cuda.is_available() or torch.cuda.get_device_capability()[0] > 7
        """)
    assert "assert False" not in code and "assert not" not in code


def test_both_branches_needing_cuda_keep_the_accelerator_value_and_the_leftovers_are_reported():
    code, findings = _code("""
        import torch
        if torch.cuda.is_available():
            print(torch.cuda.memory_allocated())
        else:
            print(torch.cuda.get_rng_state())
        """)
    assert "torch.cuda.memory_allocated()" in code and "get_rng_state" not in code
    assert any(f.code in ("XLA103", "XLA900") and f.line == 4 for f in findings), findings


def test_an_inner_decision_takes_its_cuda_branch_out_of_the_outer_one():
    code, findings = _code("""
        import torch

        def setup(model):
            if torch.cuda.is_available():
                model = model.cuda()
                if torch.cuda.device_count() > 1:
                    print(torch.cuda.get_device_properties(0))
            return model
        """)
    assert "model = model.to(device)" in code, code
    assert "get_device_properties" not in code
    assert not [f for f in findings if f.code == "XLA104"], findings  # device_count() > 1 is False on XLA


def test_a_flag_keeps_its_value_and_each_use_is_decided():
    code, findings = _code("""
        import torch
        cuda = torch.cuda.is_available()
        model = Net()
        if cuda:
            model.cuda()
        if cuda:
            state = torch.cuda.get_rng_state()
        """)
    assert "cuda = True" in code and "if cuda:\n    model.to(device)" in code, code
    assert "get_rng_state" not in code
    assert [f.line for f in findings if f.code == "XLA104"] == [7]


def test_a_user_flag_in_a_device_conditional_keeps_choosing():
    code, _ = _code("""
        import torch
        def pick(args):
            use_cuda = not args.no_cuda and torch.cuda.is_available()
            return torch.device("cuda" if use_cuda else "cpu")
        """)
    assert "use_cuda = not args.no_cuda\n" in code
    assert 'return torch_xla.device() if use_cuda else torch.device("cpu")' in code, code


def test_a_device_option_is_compared_with_xla_at_run_time():
    code, _ = _code("""
        import argparse
        import torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--device", default="cuda")
        args = parser.parse_args()
        device = torch.device(args.device)
        pin = device.type == "cuda"
        if args.device.startswith("cuda"):
            print("accelerated")
        """)
    assert 'default="xla"' in code and 'pin = device.type == "xla"' in code
    assert 'if args.device.startswith("xla"):' in code, code


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_nothing_makes_the_xla_device_before_the_launcher(target):
    code, _ = _code("""
        import torch
        import torch.multiprocessing as mp

        device = torch.device("cuda")
        model = Net().cuda()

        def step(x, device=torch.device("cuda")):
            return x.to(device)

        def train(rank):
            torch.cuda.manual_seed(0)
            step(torch.zeros(1), device)

        if __name__ == "__main__":
            torch.cuda.manual_seed(0)
            mp.spawn(train, nprocs=1)
        """, target)
    before_launch = code[:code.index("def train")]
    assert "xla_device()" not in before_launch and "torch_xla.device()" not in before_launch, code
    assert before_launch.count('torch.device("xla:0")') == 2, code  # the module's device, the default
    assert code.count("set_rng_state(0)") == 1, code  # the worker's seed stays; the launcher's goes


def test_a_helper_device_is_loaded_on_the_cpu():
    code, _ = _code("""
        import torch
        def resume(path, model, dist_util, gpu):
            loc = "cuda:{}".format(gpu)
            model.load_state_dict(torch.load(path, map_location=loc))
            model.load_state_dict(torch.load(path, map_location=dist_util.dev()))
        """)
    assert code.count('map_location="cpu"') == 2, code


def test_the_project_summary_counts_what_was_left_out(tmp_path):
    """Point 6: a dropped CUDA path is a finding, so the summary never says 0 left for a human."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(textwrap.dedent("""
        import torch

        def main(model, x):
            if torch.cuda.is_available():
                print(torch.cuda.max_memory_allocated())
            y = model(x.cuda())
            return y
        """))
    proc = subprocess.run([sys.executable, "-m", "xla_migrate", str(project), "--out", str(tmp_path / "out"),
                           "--target", "2.9"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 left for a human" in proc.stderr and "XLA104" in proc.stderr, proc.stderr
    assert "max_memory_allocated" not in (tmp_path / "out" / "train.py").read_text()


@pytest.mark.parametrize("bind", ["", "import torch\n"])
def test_torch_from_a_star_import_is_the_torch_module(bind):
    """`from utils import *` with no `import torch` in the file: the star import binds torch (review class
    29-star-import-device-kept: the device line stayed on CUDA while the loop moved to XLA), as an import
    of torch in the file is."""
    code, _ = _code(f"from helpers import *\n{bind}"
                    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n")
    assert "device = torch_xla.device()" in code, code


def test_a_device_name_bound_in_a_sibling_branch_is_not_reused():
    """Review class 29-device-name-from-sibling-branch: `.to("cuda")` in the `else` became `.to(gpu)`, a name
    only the `if` branch binds (UnboundLocalError on that path); a binding before the `if` is reused."""
    code, _ = _code("""
        import torch

        def place(model, shard):
            if shard:
                gpu = torch.cuda.current_device()
                model = model.to(gpu)
            else:
                model.to("cuda")
            return model

        def place_after(model, shard):
            gpu = torch.device("cuda")
            if shard:
                model.to("cuda")
            return model
        """)
    place, place_after = code.split("def place_after")
    assert "model.to(gpu)" not in place.split("else:")[1] and "model.to(device)" in place, code
    assert "model.to(gpu)" in place_after, code


def test_a_launch_on_a_left_out_path_is_reported():
    """`if torch.cuda.device_count() > 1: mp.spawn(...)` is False on XLA (one device per process): the launch
    goes with its branch, and the report says the program now runs one process (review class 28's shape)."""
    code, findings = _code("""
        import torch
        import torch.multiprocessing as mp

        def train(rank, world):
            model = torch.nn.Linear(2, 2).cuda()

        def main():
            if torch.cuda.device_count() > 1:
                mp.spawn(train, nprocs=2, args=(2,))
            else:
                train(0, 1)
        """)
    assert "spawn" not in code and "train(0, 1)" in code
    assert [f.line for f in findings if f.code == "XLA104" and "one process" in f.message] == [9], findings


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_an_early_return_guard_is_decided_by_the_code_after_it(target):
    """The code after `if not torch.cuda.is_available(): return` is the path the guard selects: an optional CUDA
    query after it keeps the early return (always taken on XLA, the query gone, its lines reported), while the
    function's own work after it (a model moved, which XLA runs) drops the guard instead."""
    code, findings = _code("""
        import torch

        def gpu_major(use_flash):
            if not torch.cuda.is_available() or not use_flash:
                return None
            return torch.cuda.get_device_properties(0).major

        def train(model, batches):
            if not torch.cuda.is_available():
                return
            model.cuda()
            for x in batches:
                model(x.cuda()).sum().backward()
            print(torch.cuda.max_memory_allocated())
        """, target)
    major = code.split("def gpu_major(use_flash):\n", 1)[1].split("\n\n", 1)[0]
    assert major.strip() == "return None", code
    assert "get_device_properties" not in code and "if not" not in code and "model(x" in code, code
    assert any(f.code == "XLA104" and f.line == 5 and "left out" in f.message for f in findings), findings


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_name_bound_only_on_a_left_out_path_is_reported_where_read(target):
    """qlora get_accelerate_model: `n_gpus` bound only under `torch.cuda.is_available()` (left out on XLA)
    and read by `range(n_gpus)`: the read is reported; a name also bound before the test or on the kept
    branch is not."""
    code, findings = _code("""
        import torch

        def plan(budget):
            if torch.cuda.is_available():
                n_gpus = torch.cuda.device_count()
            return {i: budget for i in range(n_gpus)}

        def bound_before(budget):
            n_gpus = 1
            if torch.cuda.is_available():
                n_gpus = torch.cuda.device_count()
            return {i: budget for i in range(n_gpus)}

        def bound_on_the_kept_branch(budget):
            if torch.cuda.is_available():
                n_gpus = torch.cuda.device_count()
            else:
                n_gpus = 1
            return {i: budget for i in range(n_gpus)}
        """, target)
    unbound = [f for f in findings if "UnboundLocalError" in f.message]
    assert [f.line for f in unbound] == [7] and "n_gpus" in unbound[0].message


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_a_module_name_bound_only_on_the_cuda_path_is_reported_at_its_read(target):
    # The corpus's vllm benchmark shape: at module level the gate keeps the `if` (its removal would leave the
    # name undefined), and XLA never takes it either: the read after it raises NameError there. The report names
    # the read (before: only the withdrawn fold at the `if`), and not a name bound on the kept path too.
    _, findings = _code("""
        import torch

        if torch.cuda.is_available():
            NUM_GPU = torch.cuda.device_count()
            print(f"{NUM_GPU} GPUs")
        if torch.cuda.is_available():
            SEEN = torch.cuda.device_count()
        else:
            SEEN = 0
        print(NUM_GPU, SEEN)
        """, target)
    unbound = [f for f in findings if "NameError" in f.message]
    assert [f.line for f in unbound] == [11] and "NUM_GPU" in unbound[0].message and "SEEN" not in unbound[0].message
