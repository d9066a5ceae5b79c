"""Defect classes found on the public corpus (docs/corpus.md), each on a self-written script of its shape."""
from pathlib import Path

from xla_migrate.api import migrate

REALISTIC = Path(__file__).resolve().parent.parent / "fixtures" / "realistic"


def _migrated(name: str, target: str):
    result = migrate((REALISTIC / name).read_bytes(), target=target, path=name)
    assert result.error is None, result.error
    compile(result.output_bytes, name, "exec", dont_inherit=True)
    return result


def test_literal_arguments_of_the_entry_call_stay_values():
    """O1: `main(x, None, True)` made `def _mp_fn(index, None, True)` (an internal error)."""
    result = _migrated("entry_literal_arguments.py", "sagemaker")
    assert "def _mp_fn(index, config_path, resume, verbose, seed):" in result.code, result.code
    assert "main(config_path, resume, verbose, seed=seed)" in result.code
    assert "args=(parser.parse_args().config, None, True, 1" in result.code, result.code


def test_a_backend_chosen_by_a_cuda_test_becomes_xla():
    """O5: `"gloo" if not cuda else "nccl"` was folded to a bare "nccl" with no finding."""
    for target in ("sagemaker", "2.9"):
        result = _migrated("dist_backend_by_cuda.py", target)
        assert 'backend = "xla"' in result.code, result.code
        assert "nccl" not in result.code


def test_function_local_cuda_amp_imports_are_reported():
    """O3: `from torch.cuda.amp import GradScaler` inside a method stayed with no finding."""
    for target in ("sagemaker", "2.9"):
        result = _migrated("amp_local_imports.py", target)
        lines = result.source.splitlines()
        local_imports = [n for n, line in enumerate(lines, 1) if line.strip().startswith("from torch.cuda.amp")]
        assert len(local_imports) == 2
        for line in local_imports:
            assert line in {f.line for f in result.findings} or lines[line - 1] not in result.code.splitlines()


def test_a_gate_in_front_of_a_cuda_call_that_raises_without_cuda_keeps_it_off():
    """O6: folding `if torch.cuda.is_available():` to True ran torch.cuda.get_rng_state() (RuntimeError without a
    CUDA driver) and get_device_properties() in select_device on the XLA host. Issue 29: such a test takes
    the value that keeps the CUDA-only code off, and says what it left out."""
    for target in ("sagemaker", "2.9"):
        result = _migrated("select_device_properties.py", target)
        for raising in ("get_device_properties(", "get_rng_state()", "set_rng_state(state", "memory_summary("):
            assert f"torch.cuda.{raising}" not in result.code, raising
        assert "cuda = not cpu\n" in result.code, result.code
        # select_device's CUDA path chooses the device: it stays (its device becomes XLA's) without the
        # property queries (review class 29-device-selector-folded-to-cpu); the other paths are left out.
        assert 'arg = "xla"' in result.code or 'arg = "xla:0"' in result.code, result.code
        findings = [f for f in result.findings if f.code == "XLA104"]
        left_out = [f.line for f in findings if "left out on XLA: it needs CUDA" in f.message]
        kept = [f.line for f in findings if "chooses the device, so it is kept on XLA" in f.message]
        assert left_out == [30, 37, 42] and kept == [16] and len(findings) == 4, findings
