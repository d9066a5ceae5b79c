"""Graphs per step (issue 30) and what a migration must not change (issue 36, points 1-2): what the goldens
cannot show. The findings (with their lines, call paths and costs), the decisions across modules of a project,
and the runnable fixtures of tests/xla/test_graphs_proof.py migrating idempotently."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from xla_migrate import migrate
from xla_migrate.cli.discovery import Ignorer, index_for

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = ROOT / "fixtures" / "runnable"
GRAPH_SHAPES = ["logging_closures", "step_end_and_evals", "module_loops", "padded_batches", "lm_corpus", "tied_gpt",
                "weight_normed"]


def run(source: str, target: str = "2.9", **options):
    result = migrate(textwrap.dedent(source), target=target, **options)
    assert result.error is None, result.error
    compile(result.code, "script.py", "exec")
    return result


def findings(result, code: str) -> list[tuple[int, str]]:
    return [(f.line, f.message) for f in result.findings if f.code == code]


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


# Barriers ----------------------------------------------------------------------------------------------------

MODULE_LOOPS = """\
import torch
import torch.nn as nn


class Decoder(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(Encoder(4))
        self.decoder = nn.GRUCell(4, 4)

    def forward(self, x):
        hidden = x
        for _ in range(3):
            hidden = self.decoder(x, hidden)
        return hidden


def main():
    device = torch.device("cuda")
    model = Decoder(2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        loss = model(torch.randn(2, 4, device=device)).sum()
        loss.backward()
        optimizer.step()
"""


def test_no_barrier_in_a_modules_methods_only_in_the_training_loop():
    result = run(MODULE_LOOPS)
    barriers = [c for c in result.changes if c.code == "XLA302"]
    assert [c.line for c in barriers] == [27], barriers  # after optimizer.step(), never at lines 10 or 17


def test_import_time_loops_of_a_helper_module_are_not_steps(tmp_path):
    helper = """\
    import torch
    model = torch.nn.Linear(2, 2)
    for x in torch.randn(3, 2):
        model(x)
    """
    write(tmp_path, {"helper.py": helper, "main.py": "import helper\nif __name__ == '__main__':\n    pass\n"})
    index = index_for(str(tmp_path), Ignorer(True, []))
    alone = run(helper)
    assert any(c.code == "XLA302" for c in alone.changes)  # alone it is a script that evaluates a model
    in_project = run(helper, path=str(tmp_path / "helper.py"), project=index)
    assert not any(c.code == "XLA302" for c in in_project.changes)


def test_the_barrier_follows_the_ema_update_and_an_eval_batch_gets_it_before_its_read():
    result = run((ROOT / "fixtures" / "XLA302" / "module_methods_and_step_end.in.py").read_text(),
                 select=["XLA302"])
    messages = {c.line: c.message for c in result.changes if c.code == "XLA302"}
    assert "before its first host read" in messages[53]  # losses[k] = loss.item() in estimate_loss
    assert "at the end of each evaluation batch" in messages[62]  # evaluate(): its read computes, so at the end
    assert "after the update" in messages[77]  # after loss_reduced = ..., past accumulate(ema_model, ...)
    assert "read 3 times (lines 80, 81, 82)" in messages[80]  # val_loss: scheduler.step, the print, the if


# Host reads --------------------------------------------------------------------------------------------------


def test_closures_keep_their_try_and_with_and_take_host_values_at_the_step():
    result = run((ROOT / "fixtures" / "XLA310" / "closures_kept_right.in.py").read_text())
    code = result.code
    assert "def log_step(loss, step):\n            try:" in code
    assert "def log_step_2(step, loss):\n            with open(log_file" in code
    assert "args=(step, loss, d_x, optimizer.param_groups[0]['lr'], time.time() - start)" in code
    assert "d_x = output.mean().detach()" in code
    # The line printed right before sys.exit(1) stays, and is not reported as a per-step read.
    assert 'print(f"non-finite loss {loss.item()} at step {step}")' in code
    assert not [line for line, _ in findings(result, "XLA311") if line == 32]
    again = migrate(code, target="2.9")
    assert again.code == code


def test_a_loop_that_can_break_runs_its_last_closures_before_what_follows():
    result = run("""\
        import torch

        def train(model, loader, optimizer, max_steps):
            for step, (x, y) in enumerate(loader):
                loss = model(x).sub(y).pow(2).mean()
                loss.backward()
                optimizer.step()
                print(f"step {step} loss {loss.item():.4f}")
                if step == max_steps:
                    break
            print("done")
        """)
    assert "            break\n    torch_xla.sync()\n    print(\"done\")" in result.code


def test_a_logging_statement_left_under_a_try_is_reported_with_the_reason():
    result = run("""\
        import torch

        def train(model, loader, optimizer, tracker):
            for x, y in loader:
                loss = model(x).sub(y).pow(2).mean()
                loss.backward()
                try:
                    tracker.log({"loss": loss.item()})
                    tracker.flush_to_disk(model)
                except Exception:
                    pass
                optimizer.step()
        """)
    (line, message), = findings(result, "XLA311")
    assert line == 8 and "under a `try` of the step" in message


def test_asserts_any_and_gradient_tests_are_reported_with_their_repetition():
    result = run((ROOT / "fixtures" / "XLA311" / "tests_asserts_and_helpers.in.py").read_text())
    found = dict(findings(result, "XLA311"))
    assert "Captioner.forward" in found[13] and "every step" in found[13]
    assert "every evaluation batch" in found[20]
    assert found[31].startswith("assert torch.isfinite(loss)")
    assert "once per iteration of the loop at line 33 over the parameters" in found[34]


def test_a_computation_read_after_the_barrier_is_reported_when_no_rule_moves_it():
    source = """\
        import torch

        def train(model, batches, optimizer, steps):
            for _ in range(steps):
                x, y = next(batches)
                out = model(x)
                loss = (out - y).pow(2).mean()
                loss.backward()
                optimizer.step()
                if out.argmax(1).sum().item() > 3:
                    print("many")
        """
    result = run(source, select=["XLA302", "XLA311"])
    (line, message), = [(line, m) for line, m in findings(result, "XLA311") if "after the step's barrier" in m]
    assert line == 10 and "one more graph every step" in message


def test_a_device_wait_in_every_step_is_reported():
    result = run("""\
        import time
        import torch

        def train(model, loader, optimizer):
            for x, y in loader:
                start = time.time()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                print(time.time() - start)
        """)
    (line, message), = [(line, m) for line, m in findings(result, "XLA311") if "waits for the device" in m]
    assert line == 10 and "every step" in message


def test_host_reads_in_another_module_are_reported_with_the_helpers_line(tmp_path):
    write(tmp_path, {
        "metrics.py": """\
        def loss_value(loss):
            return loss.item()


        def clip_grads(parameters, max_norm):
            total = 0.0
            for p in parameters:
                total += p.grad.norm(2).item() ** 2
            return total
        """,
        "train.py": """\
        import torch  # the caller puts the model on CUDA (XLA004 leaves CPU programs alone)

        import metrics


        def main(model, loader, optimizer):
            for x, y in loader:
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                metrics.clip_grads(model.parameters(), 1.0)
                optimizer.step()
                value = metrics.loss_value(loss)
                print(f"loss {value:.4f}")


        if __name__ == "__main__":
            main(None, None, None)
        """})
    index = index_for(str(tmp_path), Ignorer(True, []))
    result = run((tmp_path / "train.py").read_text(), path=str(tmp_path / "train.py"), project=index)
    found = dict(findings(result, "XLA311"))
    assert "metrics.py:8: p.grad.norm(2).item(), in a loop: once per iteration" in found[10]
    assert "metrics.py:2: loss.item()" in found[12]
    alone = run((tmp_path / "train.py").read_text())
    assert not findings(alone, "XLA311")  # without the project nothing is known of metrics.py


def test_truth_tests_in_functions_the_step_calls_are_reported():
    result = run((ROOT / "fixtures" / "XLA311" / "truth_tests_in_helpers.in.py").read_text())
    found = dict(findings(result, "XLA311"))
    # Not clamp_range's `y.size(0) > 1 and low < 0` (24), nor embed's `exists(advantages)`, `isinstance(...)` (43, 44).
    assert sorted(found) == [8, 15, 17]
    assert found[8].startswith("torch.min(y) < -1. in mel_spectrogram (run every step by the loop at line 28")
    assert "a condition on a tensor's value" in found[15] and "an assert on a tensor's value" in found[17]
    fixes = {f.line: f.fix for f in result.findings if f.code == "XLA311"}
    assert "xm.add_step_closure" in fixes[8] and "every N steps" in fixes[15]  # line 8 only prints: a check


def test_membership_tests_need_a_tensor_operand():
    result = run((ROOT / "fixtures" / "XLA311" / "membership_of_host_values.in.py").read_text())
    found = dict(findings(result, "XLA311"))
    # Not `"mask" in batch` (18) nor `i in ret_samples_ids` with i from tqdm(enumerate(loader)) (21).
    assert list(found) == [15] and found[15].startswith("torch.argmax(labels) in wanted")


def test_a_truth_test_in_a_helper_of_another_module_is_reported_at_the_call(tmp_path):
    write(tmp_path, {
        "meldataset.py": """\
        import torch


        def mel_spectrogram(y, n_fft):
            if y.size(0) > 1 and n_fft > 0:
                pass
            if torch.min(y) < -1.:
                print("min value is", torch.min(y))
            return torch.stft(y, n_fft, return_complex=True).abs()


        def unchecked(y, limit):
            if y.max() > limit:  # y may be a number or an array: no evidence of a tensor
                return y
            return y * 2
        """,
        "train.py": """\
        import torch.nn.functional as F

        from meldataset import mel_spectrogram, unchecked


        def main(generator, loader, optimizer, device):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                y_hat = unchecked(generator(x), 1.0)
                loss = F.l1_loss(mel_spectrogram(y_hat, 64), y)
                loss.backward()
                optimizer.step()


        if __name__ == "__main__":
            main(None, None, None, None)
        """})
    index = index_for(str(tmp_path), Ignorer(True, []))
    result = run((tmp_path / "train.py").read_text(), path=str(tmp_path / "train.py"), project=index)
    (line, message), = findings(result, "XLA311")
    assert line == 10 and "(meldataset.py:7: if torch.min(y) < -1.0:) every step" in message
    fix = [f.fix for f in result.findings if f.code == "XLA311"][0]
    assert "xm.add_step_closure" in fix and "CPU" in fix
    assert not findings(run((tmp_path / "train.py").read_text()), "XLA311")  # alone: nothing is known of the helper


# Shapes ------------------------------------------------------------------------------------------------------


def test_padding_without_a_maximum_length_is_reported_and_with_one_rewritten():
    source = """\
        import torch
        from torch.nn.utils.rnn import pad_sequence
        from torch.utils.data import DataLoader
        {constant}

        def collate(batch):
            seqs = [torch.tensor(s) for s in batch]
            return pad_sequence(seqs, batch_first=True)

        loader = DataLoader([[1, 2]] * 8, batch_size=4, collate_fn=collate)
        """
    without = run(source.format(constant=""))
    assert "no maximum length in the script" in findings(without, "XLA312")[0][1]
    with_length = run(source.format(constant="MAX_SEQ_LEN = 128"))
    assert "new_zeros((MAX_SEQ_LEN, *seqs[0].shape[1:]))], batch_first=True)[:-1]" in with_length.code
    assert not findings(with_length, "XLA312")


# Tied weights, dtype, the scaler's state ---------------------------------------------------------------------


def test_a_model_class_of_another_module_is_retied_after_the_move(tmp_path):
    write(tmp_path, {
        "model.py": """\
        import torch.nn as nn


        class Transformer(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok_embeddings = nn.Embedding(8, 4)
                self.output = nn.Linear(4, 8, bias=False)
                self.tok_embeddings.weight = self.output.weight
        """,
        "train.py": """\
        import torch
        from model import Transformer

        device = "cuda"
        model = Transformer()
        model.to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        """})
    index = index_for(str(tmp_path), Ignorer(True, []))
    result = run((tmp_path / "train.py").read_text(), path=str(tmp_path / "train.py"), project=index)
    assert "model.to(device)\nmodel.tok_embeddings.weight = model.output.weight\noptimizer" in result.code
    again = migrate(result.code, target="2.9", path=str(tmp_path / "train.py"), project=index)
    assert again.code.count("model.tok_embeddings.weight = model.output.weight") == 1


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_an_explicit_float32_autocast_stays_float32(target):
    result = run("""\
        import torch
        with torch.autocast("cuda", dtype=torch.float32):
            pass
        """, target=target)
    assert "bfloat16" not in result.code and "float16" not in result.code


# The runnable fixtures of the graphs proof -------------------------------------------------------------------


@pytest.mark.parametrize("name", GRAPH_SHAPES)
def test_graph_fixtures_migrate_idempotently_without_reads_left(name):
    source = (RUNNABLE / f"{name}.py").read_text()
    result = migrate(source, target="2.9")
    assert result.error is None and result.changes
    compile(result.code, f"{name}.py", "exec")
    again = migrate(result.code, target="2.9")
    assert again.code == result.code and again.changes == []
    assert not [f for f in result.findings if f.code in ("XLA311", "XLA312")], "every per-step read moves"
    handwritten = (RUNNABLE / "handwritten" / f"{name}_xla.py").read_text()
    compile(handwritten, f"{name}_xla.py", "exec")


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_host_random_geometry_on_device_tensors_is_reported(target):
    # Issue 30 (SRGAN's random_crop_torch after .to(device), Swin's timm Mixup on the device batch): offsets and
    # boxes drawn on the host are constants of the graph. The fixture's negatives: Mixup without CutMix, a list.
    source = (ROOT / "fixtures" / "XLA312" / "host_random_geometry.in.py").read_text()
    result = migrate(source, target=target, select="XLA312")
    found = findings(result, "XLA312")
    assert [line for line, _ in found] == [31, 33, 35], found
    assert "CutMix" in found[0][1] and "crop() slices at offsets drawn on the host" in found[1][1]
    assert "line 23: x[..., top:top + size" in found[1][1] and "a new graph per draw" in found[2][1]
    whole = findings(migrate(source, target=target), "XLA312")
    # With every rule the loader becomes a device loader: the batch mixed "before its move" is on the device too.
    assert [line for line, _ in whole] == [28, 31, 33, 35], whole


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_mask_indexing_in_step_callees_is_reported(target):
    # Issue 30 (SimCLR's info_nce, PyTorch-YOLOv3's build_targets): boolean-mask indexing in a function the step
    # calls (a helper of the module, a self method with a torch.eye(..., dtype=torch.bool) mask) is reported at
    # the index, naming the call. Negative: the same indexing in a function called after the loop.
    source = (ROOT / "fixtures" / "XLA312" / "mask_in_step_callees.in.py").read_text()
    found = findings(migrate(source, target=target, select="XLA312"), "XLA312")
    assert [line for line, _ in found] == [8, 8, 24], found
    assert "output[keep] in keep_valid() (called every step at line 32: keep_valid(features, y))" in found[0][1]
    assert "similarity[~mask] in info_nce() (called every step at line 33: self.info_nce(features))" in found[2][1]


def test_mask_indexing_in_an_imported_step_helper_is_reported_at_the_call(tmp_path):
    # Issue 30 (SimCLR, ssd.pytorch's loss modules): the masked index lies in another module of the project;
    # the project index says where, and the finding is at the step's call. Alone, nothing is known of it.
    write(tmp_path, {"losses.py": """\
        import torch


        def contrastive(features):
            eye = torch.eye(features.shape[0], dtype=torch.bool)
            return features[~eye].mean()


        def plain(features):
            return features.mean()
        """, "train.py": """\
        import torch
        from losses import contrastive, plain


        def main(model, loader, optimizer, device):
            for x, y in loader:
                features = model(x.to(device))
                loss = contrastive(features) + plain(features)
                loss.backward()
                optimizer.step()
        """})
    index = index_for(str(tmp_path), Ignorer(True, []))
    result = run((tmp_path / "train.py").read_text(), path=str(tmp_path / "train.py"), project=index)
    (line, message), = findings(result, "XLA312")
    assert line == 8 and "contrastive() indexes with a boolean mask every step (losses.py:6: features[~eye])" in message
    assert not findings(run((tmp_path / "train.py").read_text()), "XLA312")


def test_mask_indexing_in_an_imported_loss_module_is_reported_at_its_line(tmp_path):
    # Issue 30 (ssd.pytorch's MultiBoxLoss.forward: loc_data[pos_idx]): a loss class of another module that a
    # loop calls every step; the finding is in that module, at the index, naming the loop's call.
    write(tmp_path, {"multibox.py": """\
        import torch.nn as nn


        class MultiBoxLoss(nn.Module):
            def forward(self, loc, conf, targets):
                pos = conf > 0
                return (loc[pos] - targets[pos]).abs().sum() / pos.sum()
        """, "train.py": """\
        from multibox import MultiBoxLoss


        def main(model, loader, optimizer, device):
            criterion = MultiBoxLoss()
            for x, y in loader:
                loc, conf = model(x.to(device))
                loss = criterion(loc, conf, y.to(device))
                loss.backward()
                optimizer.step()
        """})
    index = index_for(str(tmp_path), Ignorer(True, []))
    result = run((tmp_path / "multibox.py").read_text(), path=str(tmp_path / "multibox.py"), project=index)
    found = findings(result, "XLA312")
    assert [line for line, _ in found] == [7, 7], found
    assert "loc[pos] in MultiBoxLoss.forward (run every step by the loop at train.py:6: criterion(...))" in found[0][1]
    assert not findings(run((tmp_path / "multibox.py").read_text()), "XLA312")


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_targets_sized_by_the_box_count_are_reported_where_they_move(target):
    # Issue 30 (PyTorch-YOLOv3's collate_fn + targets.to(device), ssd.pytorch's detection_collate + [ann.cuda()
    # for ann in targets]): one compilation per distinct box count. Negatives: a collate whose concatenated
    # items are one row each (a stack), the file names the ssd collate returns (never moved).
    source = (ROOT / "fixtures" / "XLA312" / "box_count_targets.in.py").read_text()
    found = [f for f in migrate(source, target=target, select="XLA312").findings if f.code == "XLA312"]
    assert [f.line for f in found] == [43, 49], found
    assert "yolo_collate() (the images' boxes concatenated into one tensor at line 20" in found[0].message
    assert "first dimension is the batch's box count" in found[0].message
    assert "ssd_collate() (a list of per-image box tensors at line 29" in found[1].message
    assert "MAX_BOXES" in found[0].fix and "mask" in found[1].fix


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_coin_toss_per_time_step_is_reported(target):
    # Issue 30 (pytorch-seq2seq's teacher forcing): a host coin toss per decoder step picks the next input, a
    # new graph for nearly every pattern of tosses. Negatives: one toss per batch, the tosses drawn on the
    # device, the toss in the training loop itself (two graphs in all).
    source = (ROOT / "fixtures" / "XLA312" / "teacher_forcing_coin_toss.in.py").read_text()
    found = [f for f in migrate(source, target=target, select="XLA312").findings if f.code == "XLA312"]
    assert [f.line for f in found] == [23], found
    assert "coin toss on the host in a loop of the training step (for t in range(1, trg.shape[0]))" in found[0].message
    assert "torch.where(tf[t], trg[t], pred)" in found[0].fix


@pytest.mark.parametrize("target", ["2.9", "sagemaker"])
def test_collate_classes_padding_to_the_batch_max_are_reported(target):
    # Issue 30 (vits TextAudioCollate, tacotron2 TextMelCollate): a collate object whose __call__ pads to the
    # batch's longest item, given as collate_fn=PadCollate() or through a name bound to one, or named a collate
    # class that another module hands to its loader. Negative: a collate class that pads to a fixed length.
    source = (ROOT / "fixtures" / "XLA312" / "collate_classes.in.py").read_text()
    found = findings(migrate(source, target=target, select="XLA312"), "XLA312")
    assert [line for line, _ in found] == [12, 21, 41], found
    assert "in the collate function PadCollate.__call__(): pads each batch" in found[0][1]
    assert "FrameCollate.__call__()" in found[1][1]
