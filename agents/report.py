"""The one summary.json schema of every `samm experiment` (docs/experiment-summary.md), and the
small helpers that write it and the tables of report.md.

    {
      "schema": "samm.experiment/1",
      "problem": "lra-placement",
      "paper": {"title": ..., "file": ...},
      "setting": {...},                       # what was run: cases, seeds, machine, differences
      "methods": {                            # per method, per metric: mean, std, number of seeds
        "lra-reinforce": {"score": {"mean": 0.91, "std": 0.01, "n": 5}, ...}, ...
      },
      "paper_figures": {"<method>": {"<metric>": value or text}},   # the paper's own numbers
      "targets": [{"name": ..., "value": ..., "goal": ">= 0.98", "met": true}, ...],
      "figures": ["curve.png", ...],
      "wall_seconds": 123.4,
      ...                                     # problem-specific extras (cases, per-app tables)
    }

`validate_summary` checks a summary against this shape (a test runs it on every problem's
quick experiment).
"""
from __future__ import annotations

import json
import math
import operator
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

SCHEMA = "samm.experiment/1"


@dataclass(frozen=True)
class Target:
    """One target of an experiment: `met` is judged on `value` as measured. With `digits`, the
    value is shown (in summary.json, and so in report.md) rounded to that many places, or to as
    many more as it takes to keep it on the same side of the goal's bound as the value judged:
    0.14996 against ">= 0.15" read "0.15 >= 0.15: not met" when rounded to 4."""

    name: str
    value: float | int | bool | None
    goal: str      # e.g. ">= 0.98 x optimum", "<= 60 s"
    met: bool
    digits: int | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "value": shown_value(self.value, self.goal, self.digits, self.met),
                "goal": self.goal, "met": self.met}


_GOAL_BOUND = re.compile(r"\s*(<=|>=|==|<|>)\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?![\d.])")
_HOLDS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "<": operator.lt, ">": operator.gt}


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def judged_places(value, goal: str, digits: int, met: bool | None = None) -> int:
    """The decimal places to show `value` with: `digits`, or as many more (17 at most) as keep the
    shown value on the side of the bound that opens `goal` (`<= 0.10`, `> 1.0 x best`) that the
    value itself is on, where the other side would contradict the verdict `met` (a goal judged
    with a tolerance, `v >= -1e-12` for ">= 0", keeps its rounded -0.0)."""
    bound = _GOAL_BOUND.match(goal)
    if bound is None or not _real(value):
        return digits
    holds, limit = _HOLDS[bound.group(1)], float(bound.group(2))

    def misleads(places: int) -> bool:
        shown = holds(round(value, places), limit)
        return shown != holds(value, limit) and (met is None or shown != met)

    while misleads(digits) and digits < 17:
        digits += 1
    return digits


def shown_value(value, goal: str, digits: int | None, met: bool | None = None):
    """`value` rounded to `judged_places`; as it is without digits (or where no rounding reads
    as judged)."""
    if digits is None or not _real(value):
        return value
    places = judged_places(value, goal, digits, met)
    return round(value, places) if places < 17 else value


def stats(values: Iterable[float]) -> dict:
    """mean, std (population, as numpy) and n of the finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(float(x))], dtype=np.float64)
    if v.size == 0:
        return {"mean": None, "std": None, "n": 0}
    with np.errstate(over="ignore", invalid="ignore"):
        mean, std = float(v.mean()), float(v.std())
    if not (math.isfinite(mean) and math.isfinite(std)):
        # finite values near the float limit overflow the sum (mean inf, std inf or NaN, written
        # as null); scaling by a power of two is exact, and ordinary values never reach this path
        exp = math.frexp(float(np.abs(v).max()))[1]
        scaled = np.ldexp(v, -exp)
        mean, std = math.ldexp(float(scaled.mean()), exp), math.ldexp(float(scaled.std()), exp)
    return {"mean": mean, "std": std, "n": int(v.size)}


def machine() -> dict:
    import os

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "system": platform.platform()}


def experiment_summary(problem: str, paper: Mapping, setting: Mapping, methods: Mapping[str, Mapping[str, Iterable]],
                       paper_figures: Mapping, targets: Iterable[Target], figures: Iterable[str] = (),
                       wall_seconds: float | None = None, **extra) -> dict:
    """`methods`: method -> metric -> per-seed values (turned into mean/std/n here)."""
    return {"schema": SCHEMA, "problem": problem, "paper": dict(paper), "setting": {**setting, "machine": machine()},
            "methods": {m: {k: stats(v) for k, v in metrics.items()} for m, metrics in methods.items()},
            "paper_figures": dict(paper_figures), "targets": [t.to_json() for t in targets],
            "figures": list(figures), "wall_seconds": wall_seconds, **extra}


def validate_summary(summary: Mapping) -> list[str]:
    """Problems with a summary's shape ([] when it follows the schema)."""
    if not isinstance(summary, Mapping):     # e.g. a JSON list read back: `in` passed, summary[...] raised
        return [f"summary: want a JSON object, got {type(summary).__name__}"]
    problems = []
    for key in ("schema", "problem", "paper", "setting", "methods", "paper_figures", "targets", "figures"):
        if key not in summary:
            problems.append(f"missing {key!r}")
    if problems:
        return problems
    if summary["schema"] != SCHEMA:
        problems.append(f"schema {summary['schema']!r} != {SCHEMA!r}")
    if not isinstance(summary["problem"], str):
        problems.append(f"problem: want a name, got {summary['problem']!r}")
    for key in ("paper", "setting", "paper_figures"):
        if not isinstance(summary[key], Mapping):
            problems.append(f"{key}: want an object, got {type(summary[key]).__name__}")
    figures = summary["figures"]
    if not isinstance(figures, (list, tuple)) or not all(isinstance(f, str) for f in figures):
        problems.append(f"figures: want a list of file names, got {figures!r}")
    # a wrong container is reported like any other shape problem, not raised from .items()
    if not isinstance(summary["methods"], Mapping):
        problems.append(f"methods: want method -> metric -> stats, got {type(summary['methods']).__name__}")
    else:
        for m, metrics in summary["methods"].items():
            if not isinstance(metrics, Mapping):
                problems.append(f"methods.{m}: want metric -> {{mean, std, n}}, got {type(metrics).__name__}")
                continue
            for k, st in metrics.items():
                if not _is_stats(st):
                    problems.append(f"methods.{m}.{k}: want {{mean, std, n}}, got {st!r}")
    if not isinstance(summary["targets"], (list, tuple)):
        problems.append(f"targets: want a list, got {type(summary['targets']).__name__}")
        return problems
    for i, t in enumerate(summary["targets"]):
        if (not isinstance(t, Mapping) or set(t) != {"name", "value", "goal", "met"} or not isinstance(t["met"], bool)
                or not isinstance(t["name"], str) or not isinstance(t["goal"], str)):
            problems.append(f"targets[{i}]: want {{name, value, goal, met}} with text name and goal and a boolean "
                            f"met, got {t!r}")
    return problems


def _is_stats(st) -> bool:
    """{mean, std, n} as `stats` writes them: numbers (null where not finite) and a whole n >= 0; a
    string or a list there passed the key check and broke `fmt` and every reader's arithmetic."""
    def number(x):
        return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))
    return (isinstance(st, Mapping) and set(st) == {"mean", "std", "n"} and number(st["mean"]) and number(st["std"])
            and isinstance(st["n"], int) and not isinstance(st["n"], bool) and st["n"] >= 0)


def refuse_repeats(values, what: str) -> None:
    """ValueError naming a value given twice (`--seeds 1,1`, `--variants osdec,osdec`): each was run
    again and counted again, so a row of one seed read n = 2 with a std of 0, as if measured twice."""
    seen: set = set()
    twice = [v for v in values if v in seen or seen.add(v)]
    if twice:
        raise ValueError(f"{what} names {twice[0]!r} more than once")


def writable_folder(out) -> Path:
    """`out` made and proved writable (OSError naming it otherwise), before any work: an --out
    that cannot take a file would otherwise fail only at the end, losing the whole run's results.
    Adds nothing to the folder: a trainer's --out may hold an experiment's files."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):   # "[Errno 17] File exists" named no option
        raise OSError(f"output folder {out} is a file (or lies under one): choose a folder") from None
    except OSError as exc:
        raise OSError(f"cannot make output folder {out}: {exc.strerror or exc}") from None
    probe = out / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(f"output folder {out} is not writable: {exc.strerror or exc}") from None
    return out


def prepare_out(out) -> Path:
    """The experiment's output folder (`writable_folder`). An earlier run's summary.json and
    report.md are moved aside to summary.previous.json and report.previous.md: a run that stops
    part-way (interrupted, failed) then leaves no summary or report that looks like its own
    beside its partial files."""
    out = writable_folder(out)
    for name, aside in (("summary.json", "summary.previous.json"), ("report.md", "report.previous.md")):
        if (out / name).is_file():
            os.replace(out / name, out / aside)
    return out


def write_summary(out: Path, summary: Mapping) -> None:
    problems = validate_summary(summary)
    if problems:
        raise ValueError("summary does not follow the schema: " + "; ".join(problems))
    write_json(Path(out) / "summary.json", summary)


def write_json(path: Path, obj, default=None) -> None:
    """`obj` as strict JSON: NaN and infinities become null (json.dumps would write NaN, which no
    strict JSON reader accepts), numpy values plain ones. Written beside and renamed over: an
    interrupted write leaves the earlier file whole, and a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite_json(obj), indent=2, default=default or json_default, allow_nan=False))
    os.replace(tmp, path)


def finite_json(o):
    """A copy of `o` with every non-finite float (NaN, inf) as None and numpy scalars and arrays as
    Python values."""
    if isinstance(o, Mapping):
        return {k: finite_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite_json(v) for v in o]
    if isinstance(o, np.ndarray):
        return finite_json(o.tolist())
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def json_default(o):
    """`json.dumps(default=...)` for numpy values (the one copy: saved policies use it too)."""
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def fmt(st: Mapping | None, digits: int = 4) -> str:
    """'0.9123 ± 0.0100' for a stats dict."""
    if not st or st.get("mean") is None:
        return "–"
    std = st.get("std")  # null in a summary read back when it was not finite
    return f"{st['mean']:.{digits}f} ± {'–' if std is None else f'{std:.{digits}f}'}"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
