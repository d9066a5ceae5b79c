"""The losses ``xla-migrate verify`` reads from the two runs, and how it compares them.

The comparison fits the program:

- **fp32** (a deterministic program, no mixed precision): every value within 1e-3 of the original's, and as
  many values. torch_xla on the CPU computes what CPU torch computes (measured: within 3e-7 over 20 steps).
- **bf16** (mixed precision, deterministic): the curves, with a bf16 tolerance: relative L1 of the smoothed
  curves at most 0.03 and, where the original's curve has a trend, R² of one against the other at least 0.9.
- **stochastic** (the two runs draw different random numbers: dropout or other random ops on the XLA device,
  whose generator is not CPU torch's; torch, Python or NumPy generators used unseeded): the curves, relative
  L1 at most 0.1 and R² at least 0.8. Measured on a dropout MLP over 12-40 steps (15 dropout seeds against one):
  correct runs R² >= 0.88 and relative L1 <= 0.08; a learning rate off by 2x or a skipped step: R² <= 0.76 or
  relative L1 >= 0.09, and off by 10x: R² < 0 and relative L1 >= 0.33.

What draws the random numbers is seen in the runs (the loader's ``random`` events and torch_xla's counters of
random ops), not guessed from the source. The smoothing is a centred moving average over ``2h+1`` values,
``h = max(1, n // 10)``. The trend is judged only where the original's smoothed curve moves more than 8 times
what its own noise explains (its residual around the smoothing, over the window's square root); a flat curve is
judged by its level alone. A stochastic curve whose trend is under 17 noise units needs less R² (``NOISE_R2``):
each run's own noise then costs R² by itself. Runs whose parameters were initialized from other random
numbers (:func:`different_start`) are judged by the level alone. Loss lines are grouped by name (``loss``, ``val_loss``,
``Loss_D``) for the curves, so that interleaved series are compared each with its own.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

FP32_TOLERANCE = 1e-3  # largest |loss delta| against the original, fp32
# The difference of two printed decimals carries binary rounding: 3.434 - 3.433 is 0.0010000000000003
_ROUNDING = 1e-9


def within_fp32_tolerance(delta: float) -> bool:
    """Whether an fp32 run's loss is the original's: ``delta`` (their absolute difference) at most 1e-3."""
    return delta <= FP32_TOLERANCE + _ROUNDING
CURVE_TOLERANCES = {"bf16": (0.9, 0.03), "stochastic": (0.8, 0.1)}  # mode -> (least R², most relative L1)
TREND_OVER_NOISE = 8.0  # the original's smoothed curve must move this many noise units for R² to be judged
# Two stochastic runs each carry their own noise: with the original's trend T noise units, noise alone costs
# R² about 25/T² (simulated: median R² 0.67 at T 8-12 for correct runs). R² must reach min(0.8, 1 - 60/T²):
# correct runs fail it at most 21% of the time at T 8-12 (fixed 0.8: 74%), 12% at T 12-16; runs that learn
# at half the pace 97% and more. (A looser floor let a real skipped-step bug through at T 16: R² 0.46.)
NOISE_R2 = 60.0
MIN_CURVE_VALUES = 4  # shorter series are left out of a curve comparison
DEFAULT_LOSS_REGEX = (r"(?i)(?P<name>\b[a-z_]*loss(?:_[a-z0-9]+)?)\b[^0-9a-z\n+-]*(?:tensor\()?\s*"
                      r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)")


# Reading -----------------------------------------------------------------------------------------------------


def loss_matches(stdout: str, pattern: re.Pattern) -> list[tuple[str, float]]:
    """(series name, value) of every match: the ``value`` group (else the first group, else the match), the
    ``name`` group lower-cased (else one series, "loss")."""
    values = []
    named = "value" in pattern.groupindex
    for match in pattern.finditer(stdout):
        text = match.group("value") if named else (match.group(1) if pattern.groups else match.group(0))
        try:
            value = float(text)
        except (TypeError, ValueError):
            continue
        name = match.group("name") if "name" in pattern.groupindex else None
        values.append(((name or "loss").lower(), value))
    return values


def parse_losses(stdout: str, loss_regex: str = DEFAULT_LOSS_REGEX) -> list[float]:
    """The loss values a run printed, in order (every series)."""
    return [value for _, value in loss_matches(stdout, re.compile(loss_regex, re.MULTILINE))]


def parse_series(stdout: str, loss_regex: str = DEFAULT_LOSS_REGEX) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    for name, value in loss_matches(stdout, re.compile(loss_regex, re.MULTILINE)):
        series.setdefault(name, []).append(value)
    return series


def unmatched_lines(stdout: str, limit: int = 3) -> list[str]:
    """What a run printed, for a loss pattern that matched nothing: lines with a number first, else the last."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    numeric = [line for line in lines if re.search(r"\d", line)]
    chosen = (numeric or lines)[:limit]
    return [line if len(line) <= 120 else line[:117] + "..." for line in chosen]


def no_loss_warning(who: str, stdout: str, loss_regex: str) -> str:
    lines = unmatched_lines(stdout)
    count = len([line for line in stdout.splitlines() if line.strip()])
    if not lines:
        return f"{who} printed nothing on stdout: no loss values to compare"
    shown = "; ".join(repr(line) for line in lines)
    return (f"--loss-regex matched nothing in {who}'s {count} output line{'' if count == 1 else 's'} "
            f"(pattern {loss_regex!r}); it printed e.g. {shown}: pass --loss-regex with the loss in its first "
            f"group (or a group named value)")


# Curves ----------------------------------------------------------------------------------------------------------


def smooth(values: list[float], half: int) -> list[float]:
    """Centred moving average; the window shrinks at the ends."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - half):i + half + 1]
        out.append(sum(window) / len(window))
    return out


def _noise(values: list[float], smoothed: list[float]) -> float:
    residual = [a - b for a, b in zip(values, smoothed)]
    return math.sqrt(sum(r * r for r in residual) / max(1, len(residual) - 1))


@dataclass
class Curve:
    """One series compared as a curve."""

    name: str
    compared: int
    window: int
    r2: float | None  # None: not judged (a flat original curve)
    rel_l1: float
    trend_over_noise: float
    level_only: bool = False  # the runs started from other parameters: R² shown, not judged

    def least_r2(self, mode: str) -> float:
        """The R² this curve must reach: the mode's, lowered for a stochastic curve whose trend is only a few
        times its noise (both runs' noise then costs R² by itself)."""
        least = CURVE_TOLERANCES[mode][0]
        if mode == "stochastic":
            least = min(least, 1 - NOISE_R2 / max(self.trend_over_noise, 1e-12) ** 2)
        return least

    def within(self, mode: str) -> bool:
        most_l1 = CURVE_TOLERANCES[mode][1]
        return self.rel_l1 <= most_l1 and (self.r2 is None or self.level_only or self.r2 >= self.least_r2(mode))

    def to_json(self) -> dict:
        return {"name": self.name, "compared": self.compared, "window": self.window,
                "r2": None if self.r2 is None else round(self.r2, 4), "rel_l1": round(self.rel_l1, 4),
                "trend_over_noise": round(self.trend_over_noise, 2), "level_only": self.level_only}


def compare_curve(name: str, values: list[float], reference: list[float], *, level_only: bool = False) -> Curve:
    n = min(len(values), len(reference))
    values, reference = values[:n], reference[:n]
    half = max(1, n // 10)
    mine, theirs = smooth(values, half), smooth(reference, half)
    scale = sum(abs(v) for v in theirs)
    diff = sum(abs(a - b) for a, b in zip(mine, theirs))
    rel_l1 = diff / scale if scale else (0.0 if diff == 0 else 1.0)  # an all-zero original: any difference is 100%
    mean = sum(theirs) / n
    total = sum((v - mean) ** 2 for v in theirs)
    noise = max(_noise(reference, theirs), 1e-12) / math.sqrt(2 * half + 1)
    trend = (max(theirs) - min(theirs)) / noise
    r2 = None
    if total > 0 and trend >= TREND_OVER_NOISE:
        r2 = 1 - sum((a - b) ** 2 for a, b in zip(mine, theirs)) / total
    return Curve(name, n, 2 * half + 1, r2, rel_l1, trend, level_only)


def tolerance_text(mode: str) -> str:
    if mode == "fp32":
        return f"every value within {FP32_TOLERANCE:g}"
    least_r2, most_l1 = CURVE_TOLERANCES[mode]
    lowered = ", less for a trend within 17 noise units" if mode == "stochastic" else ""
    return (f"smoothed curves: R² >= {least_r2:g} (where the original trends{lowered}) and relative L1 <= "
            f"{most_l1:g}")


# Randomness ------------------------------------------------------------------------------------------------------


def _relative(where: str, cwd: str) -> str:
    path, _, line = where.rpartition(":")
    if not os.path.isabs(path):
        return where
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return where
    return f"{rel if not rel.startswith('..') else path}:{line}"


UNSEEDED_INIT = "torch's generator is not seeded before parameters initialized"


def different_start(random: list[str]) -> bool:
    """Whether the two runs initialized their parameters from other random numbers: two different models, whose
    curves differ in shape by more than their step-to-step noise (unseeded sr_resnet runs: R² -0.48 to 0.60
    between correct runs at 8-12 noise units), so only the level is judged."""
    return any(source.startswith(UNSEEDED_INIT) for source in random)


def random_sources(random_ops: dict, events: list[dict], cwd: str) -> list[str]:
    """Why the two runs draw different random numbers, one phrase per source, from the runs' records."""
    sources = []
    ops = {name: count for name, count in random_ops.items() if count}
    train_mode = {}
    for event in events:
        if event.get("event") == "random" and event["kind"] in ("dropout", "rrelu", "attention dropout"):
            train_mode.setdefault(f"{event['kind']} in train mode ({event.get('module', '?')})", []).append(
                _relative(event["where"], cwd))
    if ops or train_mode:
        phrase = "random ops on the XLA device"
        if ops:
            phrase += " (" + ", ".join(f"{name} x{count}" for name, count in sorted(ops.items())) + ")"
        if train_mode:
            phrase += ": " + "; ".join(f"{what} at {', '.join(sorted(set(where))[:3])}"
                                       for what, where in sorted(train_mode.items()))
        sources.append(phrase + " draw from XLA's generator, not CPU torch's")
    unseeded = {}
    for event in events:
        if event.get("event") == "random" and event["kind"].startswith("unseeded "):
            unseeded.setdefault(event["kind"][len("unseeded "):], (_relative(event["where"], cwd), event))
    for family, (where, event) in sorted(unseeded.items()):
        if family == "torch":
            sources.append(f"torch's generator is not seeded before {event.get('before', 'use')} (at {where}): "
                           f"each run draws other numbers")
        else:
            name = "Python's random" if family == "python" else "NumPy's global generator"
            sources.append(f"{name} draws unseeded ({event.get('call', '?')} at {where})")
    return sources


def amp_in_use(events: list[dict]) -> bool:
    """Mixed precision seen in the run: an autocast entered, enabled, with a 16-bit dtype."""
    return any(e.get("event") == "autocast" and e.get("enabled") and e.get("dtype") in ("bfloat16", "float16")
               for e in events)


# The comparison ----------------------------------------------------------------------------------------------------


@dataclass
class LossOutcome:
    losses: dict
    problems: list[str]  # each a "losses" problem's message
    cannot_run: str | None = None
    warnings: list[str] | None = None


def _first_bad(values: list[float]) -> str:
    index = next(i for i, v in enumerate(values) if not math.isfinite(v))
    return f"value {index} is {values[index]}"


def compare_losses(stdout: str, original, *, required: bool, amp: bool, random: list[str], loss_regex: str,
                   stopped: bool, crashed: bool) -> LossOutcome:
    """The XLA run's losses (``stdout``), against ``original`` (a finished Process, or None) when given."""
    values = parse_losses(stdout, loss_regex)
    losses = {"regex": loss_regex, "values": values, "original": None, "mode": None, "tolerance": None,
              "compared": 0, "max_delta": None, "curves": [], "random": list(random), "ok": None, "note": None}
    outcome = LossOutcome(losses, [], None, [])
    if values and not all(math.isfinite(v) for v in values) and not crashed:
        outcome.problems.append(f"losses not finite: {_first_bad(values)}")
    if not values and not crashed and not stopped:
        outcome.warnings.append(no_loss_warning("the script", stdout, loss_regex))
    if original is None:
        return outcome
    if original.returncode != 0 or original.timed_out:
        why = f"the original does not run on plain CPU torch ({original.last_error_line})"
        if required:
            outcome.cannot_run = why
        losses["note"] = f"not compared: {why}"
        return outcome
    reference = parse_losses(original.stdout, loss_regex)
    losses["original"] = reference
    mode = "stochastic" if random else ("bf16" if amp else "fp32")
    losses["mode"] = mode
    losses["tolerance"] = FP32_TOLERANCE if mode == "fp32" else tolerance_text(mode)
    if crashed:
        losses["note"] = "not compared: the script crashed"
        return outcome
    if not reference:
        outcome.warnings.append(no_loss_warning("the original", original.stdout, loss_regex))
        reason = f"no loss values in the original's output (--loss-regex {loss_regex})"
        if required:
            outcome.cannot_run = reason
        losses["note"] = f"not compared: {reason}"
        return outcome
    cut = stopped or original.stopped_early
    if stopped and not values:
        losses["note"] = ("not compared: the run, stopped by --steps, printed no loss (losses printed after the "
                          "loop are not seen)")
        return outcome
    count = min(len(values), len(reference)) if cut else len(values)
    if not values or (not cut and len(values) != len(reference)):
        losses["ok"] = False
        outcome.problems.append(f"{len(values)} loss values in the script's output, {len(reference)} in the "
                                f"original's")
        return outcome
    deltas = [abs(a - b) for a, b in zip(values[:count], reference[:count])]
    worst = max(deltas) if deltas else 0.0
    losses.update(compared=count, max_delta=worst if math.isfinite(worst) else None)
    if mode == "fp32":
        losses["ok"] = within_fp32_tolerance(worst)
        if not losses["ok"]:
            step = next(i for i, d in enumerate(deltas) if not within_fp32_tolerance(d))
            outcome.problems.append(f"losses differ from the original by up to {worst:.3g} (fp32 tolerance "
                                    f"{FP32_TOLERANCE:g}; first at value {step}: {values[step]:.6g} vs "
                                    f"{reference[step]:.6g})")
        return outcome
    _compare_curves(outcome, stdout, original.stdout, loss_regex, mode, cut, different_start(random))
    return outcome


def _compare_curves(outcome: LossOutcome, stdout: str, reference_stdout: str, loss_regex: str, mode: str,
                    cut: bool, level_only: bool = False) -> None:
    losses = outcome.losses
    mine, theirs = parse_series(stdout, loss_regex), parse_series(reference_stdout, loss_regex)
    curves, short = [], []
    for name in sorted(set(mine) & set(theirs)):
        if not cut and len(mine[name]) != len(theirs[name]):
            losses["ok"] = False
            outcome.problems.append(f"{len(mine[name])} {name} values in the script's output, {len(theirs[name])} "
                                    f"in the original's")
            return
        if min(len(mine[name]), len(theirs[name])) < MIN_CURVE_VALUES:
            short.append(name)
            continue
        if not all(math.isfinite(v) for v in mine[name] + theirs[name]):
            continue  # reported as not finite already (or the original's own problem)
        curves.append(compare_curve(name, mine[name], theirs[name], level_only=level_only))
    losses["curves"] = [curve.to_json() for curve in curves]
    if not curves:
        losses["note"] = (f"not compared: fewer than {MIN_CURVE_VALUES} values per series for a curve "
                          f"({', '.join(short) or 'no series in both runs'})")
        return
    losses["compared"] = sum(curve.compared for curve in curves)
    failed = [curve for curve in curves if not curve.within(mode)]
    losses["ok"] = not failed
    most_l1 = CURVE_TOLERANCES[mode][1]
    for curve in failed:
        parts = []
        if curve.r2 is not None and not curve.level_only and curve.r2 < curve.least_r2(mode):
            parts.append(f"R² {curve.r2:.3g} < {curve.least_r2(mode):.2g}: the trend differs")
        if curve.rel_l1 > most_l1:
            parts.append(f"relative L1 {curve.rel_l1:.3g} > {most_l1:g}: the level differs")
        outcome.problems.append(f"the {curve.name} curve differs from the original's ({mode} comparison over "
                                f"{curve.compared} values smoothed over {curve.window}: {', '.join(parts)})")
    if short:
        losses["note"] = f"{', '.join(short)}: fewer than {MIN_CURVE_VALUES} values, not compared as a curve"
