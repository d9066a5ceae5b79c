"""Findings-only rules (XLA9xx): each construct is reported once, on its line, with what to do; the code is
left exactly as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_migrate import migrate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def findings(path: str, code: str, target: str = "sagemaker"):
    source = (FIXTURES / path).read_text()
    result = migrate(source, select=[code], target=target)
    assert result.code == source
    return [(f.line, f.message) for f in result.findings], result


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_custom_kernels(target):
    found, result = findings("XLA901/kernels.in.py", "XLA901", target)
    assert [line for line, _ in found] == [2, 3, 4, 5, 6, 8]
    assert found[2] == (4, "from numba import cuda: a Numba CUDA kernel cannot run on XLA")
    assert found[5] == (8, "load(...): a C++/CUDA extension cannot run on XLA")
    assert all("Pallas" in f.fix for f in result.findings)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_cuda_kernel_libraries(target):
    """Issue 29: flash_attn / xformers / rotary_emb imports fail on a TPU host and their kernels take CUDA
    tensors only: each import and each call no CUDA test guards is reported with the PyTorch form; the
    flash_attn call on the `device.type == "cuda"` branch and the liger import under `except ImportError`
    are the program's own fallbacks."""
    found, result = findings("XLA901/kernel_libraries.in.py", "XLA901", target)
    assert [line for line, _ in found] == [4, 5, 6, 19, 24, 30], found
    assert found[2][1].startswith("import rotary_emb: CUDA-only") and "ImportError" in found[2][1]
    assert found[4][1].startswith("rotary_emb.apply_rotary(...): CUDA-only")
    assert "scaled_dot_product_attention" in result.findings[0].fix
    assert "torch_xla.experimental.custom_kernel.flash_attention" in result.findings[0].fix
    assert "F.silu" in result.findings[3].fix and "x2 * sin" in result.findings[4].fix


def test_cpu_numba_and_torch_data_are_not_kernels():
    found, _ = findings("XLA901/no_kernels.in.py", "XLA901")
    assert found == []


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_packed_sequences(target):
    """Issue 29: packing has no XLA kernel (backward, packed RNNs). Packing for the loss (`.data`) gets the
    loss mask as its fix, a packed RNN the padded-batch RNN; pad_sequence (plain ops) is not reported."""
    found, result = findings("XLA905/packed.in.py", "XLA905", target)
    assert [line for line, _ in found] == [14, 16, 25, 26], found
    assert found[2][1].startswith("pack_padded_sequence(...).data: packed sequences do not run on XLA")
    assert [f.fix.startswith("mask the padded positions") for f in result.findings] == [False, False, True, True]
    assert "reduction=\"none\"" in result.findings[2].fix and "lengths - 1" in result.findings[0].fix


def test_apex():
    found, result = findings("XLA902/apex_amp.in.py", "XLA902")
    assert [line for line, _ in found] == [2, 3, 4, 8, 9, 10]
    assert found[4] == (9, "apex.amp.initialize(...) is an apex (CUDA-only) API")
    assert "torch.autocast" in result.findings[4].fix
    assert "torch.nn.LayerNorm" in result.findings[5].fix


def test_torch_compile():
    """XLA903 rewrites (issue 29): an inference-only script keeps torch.compile with the openxla backend on
    2.9 and drops it on sagemaker (whose 1.13 API has no openxla backend); a training script drops it, with a
    finding per call; code already on XLA only gets findings."""
    source = (FIXTURES / "XLA903/compile.in.py").read_text()
    current = migrate(source, select=["XLA903"], target="2.9")
    assert current.code.count('backend="openxla"') == 5 and "mode=" not in current.code, current.code
    assert current.findings == []
    seeds = migrate(source, select=["XLA903"], target="sagemaker")
    assert "compile" not in seeds.code.replace('torch.compile(model, backend="openxla")', ""), seeds.code
    assert [f.line for f in seeds.findings] == [5, 6, 10, 15]
    training = migrate((FIXTURES / "XLA903/training.in.py").read_text(), select=["XLA903"], target="2.9")
    assert "compile" not in training.code
    assert [f.line for f in training.findings] == [5, 11, 12, 14]
    assert all("4x the graph executions" in f.message for f in training.findings)
    on_xla = "import torch\nimport torch_xla\nmodel = torch.compile(torch.nn.Linear(2, 2)).to(torch_xla.device())\n"
    result = migrate(on_xla, select=["XLA903"], target="2.9")
    assert result.code == on_xla
    assert [(f.line, f.message) for f in result.findings] == [
        (3, "torch.compile with the default inductor backend does not produce XLA programs")]


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_deepspeed(target):
    """Issue 29: DeepSpeed's imports, calls into it and TrainingArguments(deepspeed=...) are reported with the
    XLA form (the Trainer's FSDP with xla=True, torchrun / torch_xla.launch); an import under
    ``except ImportError`` and deepspeed=None are not."""
    found, result = findings("XLA901/deepspeed.in.py", "XLA901", target)
    assert [line for line, _ in found] == [2, 3, 13, 18, 20], found
    assert found[3][1].startswith("deepspeed=config: CUDA-only (DeepSpeed's engine")
    assert all("DeepSpeed has no XLA accelerator" in message for _, message in found)
    assert all('fsdp_config {"xla": true}' in f.fix for f in result.findings)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_hf_quantized_loading_and_device_map(target):
    """Issue 29: bitsandbytes loading and accelerate's device_map never put the model on XLA; load_in_8bit=False
    and device_map=None are not reported."""
    found, result = findings("XLA906/quantized_and_placed.in.py", "XLA906", target)
    assert [line for line, _ in found] == [7, 8, 9, 10, 10], found
    assert found[1][1].startswith('device_map={"": local_rank}: accelerate places the weights')
    assert found[3][1].startswith("load_in_8bit=quantize: quantized loading needs CUDA")
    assert "torch.bfloat16" in result.findings[0].fix and "drop device_map" in result.findings[1].fix


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_hf_flash_attention_2(target):
    """Issue 29: the "flash_attention_2" choice (a default passed on to from_pretrained) and
    use_flash_attention_2=True are reported with sdpa; a comparison with the literal, "sdpa" and
    use_flash_attention_2=False are not."""
    found, result = findings("XLA906/flash_attention.in.py", "XLA906", target)
    assert [line for line, _ in found] == [5, 14], found
    assert found[0][1].startswith('"flash_attention_2": transformers\' FlashAttention needs the flash_attn package')
    assert all('attn_implementation="sdpa"' in f.fix for f in result.findings)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_lightning_devices(target):
    """Issue 29: a Lightning Trainer on gpus= / accelerator="gpu" with a DDP plugin or strategy name, and a torch
    FSDPStrategy built for Fabric, are reported with Lightning's XLA form; accelerator="tpu" with "xla",
    gpus=None and XLAFSDPStrategy are not."""
    found, result = findings("XLA908/trainer_and_fabric.in.py", "XLA908", target)
    assert [line for line, _ in found] == [8, 10, 17], found
    assert found[0][1].startswith("Trainer(gpus=[0], strategy=DDPPlugin(find_unused_parameters=False)): asks")
    assert found[2][1] == "FSDPStrategy(...): a Lightning strategy without an XLA backend"
    assert all('accelerator="tpu"' in f.fix and "XLAFSDPStrategy" in f.fix for f in result.findings)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_lightning_trainer_from_configuration(target):
    """Issue 29 (round 8): a Trainer built from configuration the tool cannot read (``**asdict(cfg)``, hydra's
    instantiate of a trainer config) is reported with the keys to set, naming this file's config defaults that
    ask for CUDA; an accelerator spelled at the call, and hydra building something else, are not."""
    found, result = findings("XLA908/trainer_from_config.in.py", "XLA908", target)
    assert [line for line, _ in found] == [16, 17], found
    assert found[0][1].startswith("pl.Trainer(**asdict(cfg)): a Lightning Trainer built from configuration")
    assert 'TrainerConfig.accelerator="gpu" (line 9), TrainerConfig.strategy="ddp" (line 11)' in found[0][1]
    assert found[1][1].startswith("hydra.utils.instantiate(cfg.trainer, logger=False): a Lightning Trainer")
    assert all('accelerator=\"tpu\"' in f.fix or 'accelerator="tpu"' in f.fix for f in result.findings)


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_lightning_accelerator_bound_to_a_cuda_name(target):
    """Review round 11: Fabric(accelerator=accelerator) with the name bound to "cuda" under a CUDA test is reported
    at the Fabric with the binding's line; a name bound to "tpu" is not."""
    found, result = findings("XLA908/accelerator_bound_to_cuda.in.py", "XLA908", target)
    assert [line for line, _ in found] == [13], found
    assert found[0][1].startswith("Fabric(accelerator=accelerator (bound to a CUDA name at line 10)): asks"), found
    assert 'accelerator="tpu"' in result.findings[0].fix


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_mpi_ranks(target):
    """Issue 29: the MPI import and each rank or world size read from a communicator (a name bound to
    MPI.COMM_WORLD, or COMM_WORLD itself) are reported with the XLA launchers to use."""
    found, result = findings("XLA907/mpi_ranks.in.py", "XLA907", target)
    assert [line for line, _ in found] == [5, 10, 11, 13], found
    assert found[1][1] == "comm.rank: the rank comes from MPI, not from the XLA launcher"
    assert all("torchrun" in f.fix and "mpiexec" in f.fix for f in result.findings)


def test_no_mpi_no_finding():
    source = "import torch\n\n\ndef f(comm):\n    return comm.rank, torch.zeros(1)\n"
    assert migrate(source, select=["XLA907"]).findings == []


def test_packed_sequence_lengths_kept_on_the_host():
    """Issue 29: a loop that moves some batch fields and keeps the lengths on the host for the packing: a device
    loader would move the lengths too; reported at the kept field (a tuple batch is not read that way)."""
    found, _ = findings("XLA905/host_lengths.in.py", "XLA905")
    assert [line for line, _ in found] == [6, 13], found
    assert found[1][1].startswith('batch["lengths"] stays on the host here')


@pytest.mark.parametrize("target", ["sagemaker", "2.9"])
def test_cuda_names_in_annotations_are_not_leftovers(target):
    """`scaler: amp.GradScaler` runs nothing (review class 33-false-findings-2): only the import that names
    torch.cuda is reported (run alone, XLA900 also reports the autocast and the constructor no rule migrated)."""
    found, _ = findings("XLA202/scaler_parameter_annotation.in.py", "XLA900", target)
    assert [line for line, _ in found] == [4, 8, 18] and "import" in found[0][1]
