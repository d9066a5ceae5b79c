"""xla-migrate verify's loss comparison without torch_xla: the loss lines it reads (names, series, a pattern that
matches nothing), the comparison mode the runs' records choose (fp32 values, bf16 curves, stochastic curves) and
the curve figures. Recorded figures only; the real runs are in tests/xla/test_verify_xla.py."""

from __future__ import annotations

import json
import math
import random

import jsonschema
import pytest
from test_verify import ORIGINAL, SCHEMA, clean_markers, losses_text, observation

from xla_migrate.verify import core as v
from xla_migrate.verify import losses


# Reading --------------------------------------------------------------------------------------------------------


def test_the_default_pattern_reads_gan_style_names_each_as_its_own_series():
    text = ("[0/5][0/3] Loss_D: 1.3862 Loss_G: 0.6931 D(x): 0.5\n"
            "[0/5][1/3] Loss_D: 1.2000 Loss_G: 0.8000 D(x): 0.6\n"
            "epoch 0 train_loss=0.25 val_loss 0.5 lossless 3\n")
    assert v.parse_losses(text) == [1.3862, 0.6931, 1.2, 0.8, 0.25, 0.5]
    assert v.parse_series(text) == {"loss_d": [1.3862, 1.2], "loss_g": [0.6931, 0.8], "train_loss": [0.25],
                                    "val_loss": [0.5]}


def test_a_custom_pattern_with_a_value_group_and_no_name_is_one_series():
    text = "it 1 objective=0.5\nit 2 objective=0.25\n"
    assert v.parse_series(text, r"objective=(?P<value>\S+)") == {"loss": [0.5, 0.25]}


def test_a_pattern_that_matches_nothing_is_a_warning_with_the_lines_it_saw():
    stdout = "starting\nepoch 1 | D 0.51 | G 1.20\nepoch 2 | D 0.49 | G 1.10\n"
    report = v.assess(observation(clean_markers(), stdout=stdout), "gan.py")
    assert report.status == "clean" and report.exit_code == 0
    assert len(report.warnings) == 1
    warning = report.warnings[0]
    assert warning.startswith("--loss-regex matched nothing in the script's 3 output lines")
    assert "'epoch 1 | D 0.51 | G 1.20'; 'epoch 2 | D 0.49 | G 1.10'" in warning
    assert "  warning: " + warning in v.render_text(report)
    assert report.to_json()["warnings"] == [warning]
    silent = v.assess(observation(clean_markers(), stdout=""), "quiet.py")
    assert silent.warnings == ["the script printed nothing on stdout: no loss values to compare"]


def test_an_original_without_loss_lines_cannot_be_compared_and_shows_what_it_printed():
    run = observation(clean_markers(), stdout=losses_text(ORIGINAL))
    plain = v.Process(0, "Epoch 1 D 0.5 G 1.2\n", "", 1.0)
    report = v.assess(run, "t.py", original=plain, amp=False)
    assert report.status == "cannot-run" and report.exit_code == 2
    assert "no loss values in the original's output" in report.verdict
    assert report.warnings == [losses.no_loss_warning("the original", plain.stdout, v.DEFAULT_LOSS_REGEX)]
    assert "'Epoch 1 D 0.5 G 1.2'" in report.warnings[0]
    text = v.render_text(report)
    assert text[0].startswith("t.py: torch_xla 2.9.0") and text[-1] == report.verdict  # the figures are kept


# Curves -----------------------------------------------------------------------------------------------------------


def noisy(values, scale, seed):
    rng = random.Random(seed)
    return [x * (1 + rng.gauss(0, scale)) for x in values]


CURVE = [2.0 * math.exp(-i / 12) + 0.3 for i in range(36)]


def test_a_curve_with_the_same_trend_and_level_is_within_the_stochastic_tolerance():
    curve = losses.compare_curve("loss", noisy(CURVE, 0.08, 1), noisy(CURVE, 0.08, 2))
    assert curve.window == 7 and curve.compared == 36
    assert curve.r2 is not None and curve.r2 > 0.9 and curve.rel_l1 < 0.05
    assert curve.within("stochastic") and curve.trend_over_noise > losses.TREND_OVER_NOISE


@pytest.mark.parametrize("factor,why", [(0.5, "level"), (None, "trend")])
def test_a_curve_off_in_level_or_trend_is_not(factor, why):
    mine = [x * factor for x in CURVE] if factor else [CURVE[0] - (x - CURVE[-1]) * 0.2 for x in CURVE]
    curve = losses.compare_curve("loss", noisy(mine, 0.08, 1), noisy(CURVE, 0.08, 2))
    assert not curve.within("stochastic")
    if why == "level":
        assert curve.rel_l1 > 0.3
    else:
        assert curve.r2 < 0


def test_a_weak_trend_in_noisy_runs_lowers_the_r2_it_needs_but_still_catches_a_slower_run():
    # 12 values falling 7% with 1% noise in each run (dropout, say): the trend is about 11 noise units, so both
    # runs' noise alone costs R² (correct runs: 0.46-0.86, the fixed 0.8 failed more than half)
    weak = [0.35 - 0.025 * (1 - math.exp(-i / 6)) for i in range(12)]
    slower = [weak[0] - (weak[0] - x) * 0.3 for x in weak]
    original = noisy(weak, 0.01, 100)
    same = [losses.compare_curve("loss", noisy(weak, 0.01, seed), original) for seed in range(1, 13)]
    assert all(8 < c.trend_over_noise < 17 and c.least_r2("stochastic") < 0.8 for c in same)
    assert sum(c.within("stochastic") for c in same) >= 10
    assert sum(c.r2 >= 0.8 for c in same) <= 6
    assert same[0].least_r2("bf16") == 0.9  # deterministic runs share their noise: no lowering
    for seed in range(1, 13):
        slow = losses.compare_curve("loss", noisy(slower, 0.01, seed), original)
        assert slow.rel_l1 < 0.1 and slow.r2 < slow.least_r2("stochastic") and not slow.within("stochastic")
    strong = losses.compare_curve("loss", noisy(CURVE, 0.01, 1), noisy(CURVE, 0.01, 2))
    assert strong.trend_over_noise > 17 and strong.least_r2("stochastic") == 0.8


def test_runs_from_other_initial_parameters_are_judged_by_their_level_alone():
    # two unseeded runs: other weights, so the curves differ in shape beyond their step noise (a quick drop then
    # flat against a slow steady one, the same level): R² is shown, not judged; a level off by 30% still fails
    quick = [0.35, 0.336, 0.331, 0.336, 0.335, 0.327, 0.336, 0.329, 0.33, 0.329, 0.326, 0.327]
    steady = [0.354, 0.348, 0.349, 0.341, 0.342, 0.336, 0.339, 0.347, 0.336, 0.331, 0.328, 0.332]
    strict = losses.compare_curve("loss", quick, steady)
    assert strict.r2 < strict.least_r2("stochastic") and not strict.within("stochastic")
    level = losses.compare_curve("loss", quick, steady, level_only=True)
    assert level.r2 == strict.r2 and level.within("stochastic") and level.to_json()["level_only"] is True
    assert not losses.compare_curve("loss", [v * 1.3 for v in quick], steady, level_only=True).within("stochastic")
    unseeded = "torch's generator is not seeded before parameters initialized (at m.py:3): each run draws other"
    assert losses.different_start([unseeded]) and not losses.different_start(["random ops on the XLA device"])
    plain = v.Process(0, losses_text(steady), "", 1.0, events=[
        {"event": "random", "kind": "unseeded torch", "where": "/w/m.py:3", "before": "parameters initialized"}])
    report = v.assess(random_run(quick), "t.py", original=plain, cwd="/w")
    assert report.status == "clean" and report.losses["curves"][0]["level_only"], report.verdict
    assert "not judged (other initial parameters)" in report.verdict
    jsonschema.validate(json.loads(json.dumps(report.to_json(), allow_nan=False)), SCHEMA)


def test_a_flat_original_curve_is_judged_by_its_level_alone():
    flat = [1.0] * 30
    curve = losses.compare_curve("loss", noisy(flat, 0.05, 1), noisy(flat, 0.05, 2))
    assert curve.r2 is None and curve.trend_over_noise < losses.TREND_OVER_NOISE
    assert curve.within("stochastic")
    assert not losses.compare_curve("loss", [1.3] * 30, noisy(flat, 0.05, 2)).within("stochastic")


def random_run(values, ops=None, events=(), stopped=False):
    markers = clean_markers()
    for marker in markers:
        marker["random_ops"] = dict(ops or {})
    run = observation(markers, stdout=losses_text(values), stopped=stopped)
    run.events = list(events)
    return run


DROPOUT = {"event": "random", "kind": "dropout", "where": "/work/model.py:12", "module": "Dropout"}


def test_random_ops_on_the_device_compare_the_curves_and_say_why():
    values = noisy(ORIGINAL, 0.03, 3)
    run = random_run(values, ops={"bernoulli": 12}, events=[DROPOUT])
    report = v.assess(run, "train.py", original=v.Process(0, losses_text(ORIGINAL), "", 1.0), cwd="/work")
    assert report.status == "clean", report.verdict
    assert report.losses["mode"] == "stochastic" and report.losses["ok"] is True
    assert report.losses["random"] == ["random ops on the XLA device (bernoulli x12): dropout in train mode "
                                       "(Dropout) at model.py:12 draw from XLA's generator, not CPU torch's"]
    assert report.losses["max_delta"] > v.FP32_TOLERANCE  # step by step, the strict check would have failed
    assert "loss curves match the original (stochastic: R²" in report.verdict
    text = "\n".join(v.render_text(report))
    assert "vs the original on plain CPU torch (stochastic; smoothed curves: R² >= 0.8" in text
    assert "random numbers differ between the runs: random ops on the XLA device" in text
    jsonschema.validate(json.loads(json.dumps(report.to_json(), allow_nan=False)), SCHEMA)


def test_a_stochastic_run_that_learns_slower_is_a_divergence():
    slower = [ORIGINAL[0] - (ORIGINAL[0] - x) * 0.3 for x in ORIGINAL]
    report = v.assess(random_run(slower, ops={"uniform_": 24}), "t.py",
                      original=v.Process(0, losses_text(ORIGINAL), "", 1.0))
    assert report.status == "divergence" and report.exit_code == 1
    assert "the loss curve differs from the original's (stochastic comparison over 12 values" in report.verdict


@pytest.mark.parametrize("event,phrase", [
    ({"event": "random", "kind": "unseeded torch", "where": "/w/t.py:5", "before": "parameters initialized"},
     "torch's generator is not seeded before parameters initialized (at /w/t.py:5)"),
    ({"event": "random", "kind": "unseeded python", "where": "/w/t.py:9", "call": "shuffle"},
     "Python's random draws unseeded (shuffle at /w/t.py:9)"),
    ({"event": "random", "kind": "unseeded numpy", "where": "/w/t.py:9", "call": "rand"},
     "NumPy's global generator draws unseeded (rand at /w/t.py:9)"),
])
def test_unseeded_generators_in_either_run_compare_the_curves(event, phrase):
    plain = v.Process(0, losses_text(ORIGINAL), "", 1.0, events=[event])  # seen in the original's run
    report = v.assess(random_run(noisy(ORIGINAL, 0.03, 4)), "t.py", original=plain, cwd="/elsewhere")
    assert report.losses["mode"] == "stochastic" and report.status == "clean", report.verdict
    assert report.losses["random"][0].startswith(phrase)


def test_a_deterministic_program_keeps_the_strict_check():
    report = v.assess(random_run(noisy(ORIGINAL, 0.03, 4)), "t.py", original=v.Process(0, losses_text(ORIGINAL),
                                                                                       "", 1.0))
    assert report.losses["mode"] == "fp32" and report.losses["random"] == []
    assert report.status == "divergence" and "fp32 tolerance 0.001" in report.verdict


def test_values_printed_a_last_digit_apart_are_within_the_fp32_tolerance():
    """Printed to 3 decimals, 3.434 and 3.433 differ by 0.0010000000000003 in binary: the same loss to 1e-3
    (supcon's seeded run: verify said divergence where the values agree to their last printed digit)."""
    text = "".join(f"loss {value} (avg)\n" for value in (3.613, 3.444, 3.433))
    original = "".join(f"loss {value} (avg)\n" for value in (3.613, 3.444, 3.434))
    report = v.assess(observation(clean_markers(), stdout=text), "t.py", original=v.Process(0, original, "", 1.0),
                      loss_regex=r"loss ([-+\d.e]+) \(")
    assert report.losses["mode"] == "fp32" and report.losses["ok"] is True, report.losses
    assert report.status == "clean"
    assert losses.within_fp32_tolerance(3.434 - 3.433) and not losses.within_fp32_tolerance(0.0011)


def test_mixed_precision_is_read_from_the_runs_autocast_records():
    autocast = {"event": "autocast", "device_type": "xla", "dtype": "bfloat16", "enabled": True, "where": "t.py:3"}
    run = random_run([x * 1.004 for x in ORIGINAL], events=[autocast])
    report = v.assess(run, "t.py", original=v.Process(0, losses_text(ORIGINAL), "", 1.0))
    assert report.losses["mode"] == "bf16" and report.status == "clean"
    disabled = random_run([x * 1.004 for x in ORIGINAL], events=[{**autocast, "enabled": False}])
    strict = v.assess(disabled, "t.py", original=v.Process(0, losses_text(ORIGINAL), "", 1.0))
    assert strict.losses["mode"] == "fp32" and strict.status == "divergence"


def test_series_are_compared_each_with_its_own():
    d_values, g_values = noisy(CURVE[:12], 0.02, 5), noisy([1 + x / 10 for x in range(12)], 0.02, 6)
    mine = "".join(f"Loss_D: {d:.5f} Loss_G: {g:.5f}\n" for d, g in zip(d_values, g_values))
    theirs = "".join(f"Loss_D: {d:.5f} Loss_G: {g:.5f}\n" for d, g in zip(CURVE[:12], [1 + x / 10 for x in range(12)]))
    run = random_run([], ops={"normal_": 12})
    run.process.stdout = mine
    report = v.assess(run, "gan.py", original=v.Process(0, theirs, "", 1.0))
    assert [c["name"] for c in report.losses["curves"]] == ["loss_d", "loss_g"]
    assert report.status == "clean", report.verdict
    broken = mine.replace("Loss_G: ", "Loss_G: 9")
    run.process.stdout = broken
    diverged = v.assess(run, "gan.py", original=v.Process(0, theirs, "", 1.0))
    assert diverged.status == "divergence" and "the loss_g curve differs" in diverged.verdict


def test_short_series_are_left_out_of_a_curve_and_said_so():
    run = random_run([], ops={"bernoulli": 3})
    run.process.stdout = "loss 1.0\nloss 0.9\nloss 0.8\n"
    report = v.assess(run, "t.py", original=v.Process(0, "loss 1.0\nloss 0.9\nloss 0.8\n", "", 1.0))
    assert report.losses["ok"] is None and report.status == "clean"
    assert report.losses["note"].startswith("not compared: fewer than 4 values per series for a curve (loss)")
