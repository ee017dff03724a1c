"""A headroom ceiling over a trained Reclaimer policy (ours; the paper applies its agent's limits
as they come): each service's limit is capped by its mean use u over the seconds the agent sees
(action_map.cores_of), at H times u (`--rule multiple`, the default) or at u + β√u (`--rule sqrt`,
square-root staffing: more relative headroom for a lightly used, noisy service, less for a busy
one), and H or β is chosen after training on validation episodes.

Why: the trained policies keep a low load's services at 3-10 times their use (Social at 20 users:
2.08 cores for 0.48 used), where the cost term of the paper's reward pays a few hundredths a
second for the difference and the critics do not resolve it. A fixed rule of 2 times the 5-s mean
use breaks QoS in no second there (benchmarks/reclaimer_headroom.py) but holds far more cores than
the policy at the high loads. The ceiling keeps the policy's choice wherever it is below H times
the use (the high loads) and the rule's elsewhere (docs/microservice-cores.md, "A headroom ceiling
over the trained policies").

The choice (`choose_ceiling`): on a grid of values (H or β) from high to low, the smallest such
that the policy under it, and under every larger value of the grid, breaks QoS in at most
`max_violation` of the validation seconds (the experiment's protocol: its three load levels, one
episode per seed). Scanning down and stopping at the first value that breaks it is the same rule
and evaluates fewer. `pick="fewest"` keeps, of those clean values, the one with the fewest mean
cores instead: a ceiling that yields to latency (`release`) turns a value too low into lifted
seconds, so its cores stop falling before its violations start. `shape` gives every value of the
grid the same window and release (action_map.Ceiling; `--window 60 --release 0.8 --hold 60`), and
its panic (`--panic 2`), which cannot change the choice at `max_violation` 0 (without
`no_worse_than_policy`): a clean value then breaks no second, and the panic starts only after one.
None when even the largest breaks it: the policy is left without a ceiling. A margin raises the
rule's value (session 86's Social ceiling was the rule's H 2.0 on 70 validation seeds plus 0.2: at
2.0 its policy broke QoS in rare seconds of the held-out tail seeds; the shipped ceilings since
session 88 are the fewest-cores pick plus 0.01). The seeds must be apart from the experiment's (1-5)
and the check seeds (6-10), like the training's validation.

    python -m agents.microservice_cores.ceiling --policy DIR --out DIR2 [--eval-seeds 101-120] [--rule sqrt]
    samm reclaimer-ceiling --policy DIR --out DIR2          (the same, from the CLI)
    samm reclaimer-ceiling --policy DIR --out DIR2 --recipe shipped   (the shipped ceilings' recipe)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from samm.cli.seeds import require_apart_from_reported

from .action_map import Ceiling, check_ceiling
from .validation import evaluate

#: H from 3 down to 1.2 times the mean use: 3 is AutoScale's least headroom (it holds use / limit
#: under 0.3), and below 1.2 the grid's policies break QoS in most seconds (measured on both apps)
GRID = tuple(round(3.0 - 0.1 * i, 1) for i in range(19))
#: β of u + β√u (√cores): 0.3 holds about what H = 3 holds on Hotel's validation seeds, then by
#: 0.01 from 0.2 down to 0.05 (Hotel's policy breaks QoS on 70 validation seeds from 0.17; measured)
SQRT_GRID = (0.3, 0.25) + tuple(round(0.2 - 0.01 * i, 2) for i in range(16))
#: H of "at most H times the use" over a square-root ceiling (`--rule max-multiple --sqrt β`): 3 binds
#: little on either app, and Social's pair breaks QoS at 1.5 on 70 validation seeds (session 93)
MAX_MULTIPLE_GRID = (3.0, 2.5, 2.25, 2.0, 1.75, 1.5)
#: which field of the Ceiling a rule scans, its default grid and its smallest value
RULES = {"multiple": ("multiple", GRID, 1.0),
         "sqrt": ("sqrt", SQRT_GRID, 0.0),
         "max-multiple": ("max_multiple", MAX_MULTIPLE_GRID, 1.0)}
#: the 20 validation seeds of the shipped recipes (docs/microservice-cores.md, session 83)
CEILING_SEEDS = tuple(range(101, 121))
#: which clean value of the grid is chosen: the smallest, or the one with the fewest mean cores
PICKS = ("smallest", "fewest")
#: a ceiling's shape, the same for every value of the grid (action_map.Ceiling); a rule's own field
#: is the scanned value and cannot be part of it
SHAPE_KEYS = ("window", "release", "hold", "pinned", "panic", "sqrt", "max_multiple")
#: the command's options left out of its command line: its defaults (a ceiling without a memory, on
#: the 20 seeds of session 83), or with `--recipe shipped` the recipe of the ceilings shipped since
#: session 88 (docs/microservice-cores.md, "A ceiling that yields to latency"; the 2-s panic since
#: session 92, "What a jump costs any controller, and a panic at every cap"); an option given on
#: the command line wins over either
DEFAULTS = {"eval_seeds": f"{CEILING_SEEDS[0]}-{CEILING_SEEDS[-1]}", "rule": "multiple", "margin": 0.0,
            "pick": "smallest", "window": 0, "release": 0.0, "hold": 0, "pinned": 0.0, "panic": 0, "sqrt": 0.0,
            "max_multiple": 0.0}
RECIPES = {"shipped": {**DEFAULTS, "eval_seeds": "101-170", "rule": "sqrt", "margin": 0.01, "pick": "fewest",
                       "window": 60, "release": 0.8, "hold": 60, "panic": 2}}


def resolve_options(given: dict, recipe: str | None = None) -> dict:
    """Every option of DEFAULTS: the given value where it is not None, else the recipe's, else the default."""
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"the recipe must be one of {', '.join(RECIPES)}, not {recipe!r}")
    base = RECIPES[recipe] if recipe else DEFAULTS
    return {k: given[k] if given.get(k) is not None else base[k] for k in DEFAULTS}


def make_ceiling(rule: str, value: float, shape: dict | None = None) -> Ceiling:
    """The ceiling of a rule's grid value with the given shape (SHAPE_KEYS)."""
    field = RULES[rule][0]
    shape = dict(shape or {})
    if field in shape:
        raise ValueError(f"the rule {rule} scans {field}; it cannot also be fixed in the shape")
    if rule == "max-multiple" and not shape.get("sqrt"):
        raise ValueError("the rule max-multiple bounds a square-root ceiling: give its β (--sqrt)")
    return check_ceiling(replace(Ceiling(), **{field: value}, **shape))


def choose_ceiling(policy, topo, seeds: Sequence[int] = CEILING_SEEDS, grid: Sequence[float] | None = None,
                   max_violation: float = 0.0, on_row: Callable[[dict], None] | None = None,
                   evaluate_fn: Callable = evaluate, margin: float = 0.0, rule: str = "multiple",
                   shape: dict | None = None, pick: str = "smallest", no_worse_than_policy: bool = False) -> dict:
    """{"ceiling": H (or β) or None, "rule": rule, "rule_ceiling": the rule's value before the margin,
    "rows": [{"ceiling", "mean_cores", "violation_rate", "levels"}, ...], "without": the policy's own
    evaluation, "seeds", "max_violation", "margin"}; `policy` a ReclaimerPolicy (its own ceiling is
    ignored: every row is the policy under the row's value alone). `rule` "multiple" (H times the
    use, grid default GRID) or "sqrt" (u + β√u, SQRT_GRID). `margin` raises the rule's value by that
    much (capped at the grid's largest; every value above the rule's was clean), a distance from the
    edge where the rare violating second lives. `shape` ({"window", "release", "hold"}) applies to
    every value; `pick` "smallest" (the clean value lowest on the grid) or "fewest" (the clean value
    with the fewest mean cores). `no_worse_than_policy` also counts a value clean when it breaks no
    more seconds than the policy without a ceiling: a policy that already breaks rare validation
    seconds gets no ceiling otherwise (three of session 88's six Hotel runs). `evaluate_fn` is
    validation.evaluate (policy, topo, seeds) -> figures."""
    if rule not in RULES:
        raise ValueError(f"the rule must be one of {', '.join(RULES)}, not {rule!r}")
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {', '.join(PICKS)}, not {pick!r}")
    shape = dict(shape or {})
    if set(shape) - set(SHAPE_KEYS):
        raise ValueError(f"a ceiling's shape holds {', '.join(SHAPE_KEYS)}, not {sorted(set(shape) - set(SHAPE_KEYS))}")
    _, default_grid, least = RULES[rule]
    grid = sorted({float(h) for h in (default_grid if grid is None else grid)}, reverse=True)
    if not grid or grid[-1] < least:
        raise ValueError(f"the grid must hold values >= {least:g} ({'times the mean use' if rule == 'multiple' else 'β'})")
    if not margin >= 0.0:
        raise ValueError(f"the margin must be >= 0, not {margin!r}")
    if not 0.0 <= max_violation <= 1.0:   # NaN broke no comparison: every value was clean, the lowest chosen
        raise ValueError(f"max_violation must lie in [0, 1] (a share of the seconds), not {max_violation!r}")
    if not len(seeds):
        raise ValueError("choose_ceiling needs at least one validation seed")
    require_apart_from_reported(seeds, "the validation seeds")
    make_ceiling(rule, grid[0], shape)      # a bad shape is refused before any episode runs
    without = evaluate_fn(policy.with_ceiling(None), topo, seeds)
    allowed = max(max_violation, without["violation_rate"]) if no_worse_than_policy else max_violation
    rows, clean = [], []
    for h in grid:
        row = {"ceiling": h, **evaluate_fn(policy.with_ceiling(make_ceiling(rule, h, shape)), topo, seeds)}
        rows.append(row)
        if on_row:
            on_row(row)
        if row["violation_rate"] > allowed:
            break
        clean.append(row)
    if not clean:
        chosen = None
    elif pick == "smallest":
        chosen = clean[-1]["ceiling"]
    else:
        chosen = min(clean, key=lambda r: (r["mean_cores"], r["ceiling"]))["ceiling"]
    ceiling = None if chosen is None else round(min(chosen + margin, grid[0]), 6)
    return {"ceiling": ceiling, "rule": rule, "rule_ceiling": chosen, "rows": rows, "without": without,
            "seeds": [int(s) for s in seeds], "max_violation": max_violation, "margin": margin,
            "shape": shape, "pick": pick, "no_worse_than_policy": no_worse_than_policy}


def calibrated(policy, choice: dict, seconds: float | None = None):
    """The policy with the chosen ceiling (a new version; unchanged weights) and the choice in its
    training record; a ceiling it replaces stays there too, under "previous" (one level)."""
    training = dict(policy.training)
    rule = choice.get("rule", "multiple")
    old = training.get("ceiling")
    previous = None if old is None else {"version": policy.version, "headroom_ceiling": policy.ceiling_json(),
                                         **{k: v for k, v in old.items() if k != "previous"}}
    training["ceiling"] = {k: choice[k] for k in ("ceiling", "rule_ceiling", "margin", "seeds", "max_violation",
                                                  "rows", "without")}
    training["ceiling"].update(rule=rule, shape=choice.get("shape") or {}, pick=choice.get("pick", "smallest"),
                               no_worse_than_policy=bool(choice.get("no_worse_than_policy", False)))
    if seconds is not None:
        training["ceiling"]["seconds"] = round(seconds, 1)
    if previous is not None:
        training["ceiling"]["previous"] = previous
    base = policy.version.split("+ceiling")[0]
    ceiling = None if choice["ceiling"] is None else make_ceiling(rule, choice["ceiling"], choice.get("shape"))
    version = base if ceiling is None else f"{base}+ceiling{ceiling.label()}"
    out = policy.with_ceiling(ceiling)
    out.training, out.version = training, version
    return out


def _line(row: dict) -> str:
    levels = " | ".join(f"{u}: {v['mean_cores']:.2f} / {v['violation_rate']:.2%}" for u, v in row["levels"].items())
    return f"{levels} | mean {row['mean_cores']:.3f} cores, {row['violation_rate']:.4%} violating"


def parse_grid(text: str) -> list[float]:
    """--grid's values, or a ValueError naming the option: a word said only "could not convert string
    to float", and nan or inf a Ceiling's whole field list after the policy had loaded."""
    values = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            value = float(item)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise ValueError(f"--grid {text!r}: {item!r} is not a finite number")
        values.append(value)
    return values


def _check_writable(out: str) -> None:
    """ValueError naming --out when the chosen policy could not be saved there: an --out that is a
    file, or under one, failed only after every validation episode (minutes), the choice lost."""
    path = Path(out)
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a directory" if not existing.is_dir() else "is not writable"
        raise ValueError(f"--out {out}: {existing} {what}; the policy with its ceiling could not be saved there")


def main(argv=None) -> int:
    from samm.cli.seeds import parse_seeds

    from .policy import ReclaimerPolicy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True, help="a saved Reclaimer policy directory")
    ap.add_argument("--out", required=True, help="where the policy with its ceiling is saved")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default=None,
                    help="fill every option below that is left out from a recipe: 'shipped', the ceilings shipped "
                         "since session 88 (--eval-seeds 101-170 --rule sqrt --margin 0.01 --pick fewest --window 60 "
                         "--release 0.8 --hold 60 --panic 2; Social's adds --pinned 0.98)")
    ap.add_argument("--eval-seeds", default=None,
                    help=f"validation seeds, apart from the experiment's 1-5 and 6-10 (default: {DEFAULTS['eval_seeds']})")
    ap.add_argument("--rule", choices=sorted(RULES), default=None,
                    help="multiple: at most H times the mean use (the default); sqrt: at most u + β√u, square-root "
                         "staffing; max-multiple: at most the smaller of u + β√u (β from --sqrt) and H times u")
    ap.add_argument("--grid", default=None,
                    help="values to try, comma-separated (default: H from 3 down to 1.2 by 0.1; β 0.3, 0.25, then "
                         "0.2 down to 0.05 by 0.01; max-multiple's H 3, 2.5, 2.25, 2, 1.75, 1.5)")
    ap.add_argument("--sqrt", type=float, default=None,
                    help="with --rule max-multiple: the β of the square-root ceiling it bounds")
    ap.add_argument("--max-multiple", type=float, default=None,
                    help="with --rule sqrt: also at most this many times the use (default 0: no bound; ours)")
    ap.add_argument("--max-violations", type=float, default=0.0,
                    help="the largest share of violating validation seconds allowed (default 0)")
    ap.add_argument("--no-worse-than-policy", action="store_true",
                    help="also count a value clean when it breaks no more validation seconds than the policy "
                         "without a ceiling (for a policy that already breaks rare ones)")
    ap.add_argument("--margin", type=float, default=None,
                    help="raise the rule's value by this much (default 0; the shipped ceilings: 0.01)")
    ap.add_argument("--pick", choices=PICKS, default=None,
                    help="of the clean values: the smallest (default) or the one with the fewest mean cores")
    ap.add_argument("--window", type=int, default=None,
                    help="the use the ceiling scales: the larger of the 5-s mean and the mean over this many "
                         "seconds (default 0: the 5-s mean alone)")
    ap.add_argument("--release", type=float, default=None,
                    help="lift every service's ceiling after a second whose p99 reached this share of the QoS "
                         "target (default 0: never)")
    ap.add_argument("--hold", type=int, default=None, help="for this many seconds more (with --release or --pinned)")
    ap.add_argument("--pinned", type=float, default=None,
                    help="also lift one service's ceiling while its use reached this share of its limit "
                         "(default 0: never; Social's shipped ceiling: 0.98, Hotel's: 0)")
    ap.add_argument("--panic", type=int, default=None,
                    help="every service at its cap for this many seconds after a second whose p99 broke the QoS "
                         "target (default 0: never; ours, action_map.py)")
    a = ap.parse_args(argv)
    try:
        o = resolve_options(vars(a), a.recipe)
        try:
            seeds = parse_seeds(o["eval_seeds"])
        except ValueError:
            raise ValueError(f"--eval-seeds must be a list like 101,102 or a range like 101-120, "
                             f"not {o['eval_seeds']!r}") from None
        require_apart_from_reported(seeds, "--eval-seeds")
        grid = None if a.grid is None else parse_grid(a.grid)
        if not 0.0 <= a.max_violations <= 1.0:
            raise ValueError(f"--max-violations must lie in [0, 1], not {a.max_violations}")
        if o["panic"] < 0:
            raise ValueError(f"--panic must be whole seconds >= 0, not {o['panic']}")
        policy = ReclaimerPolicy.load(a.policy)
        _check_writable(a.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    print(f"{policy.version} on {policy.topo.name}, seeds {seeds[0]}..{seeds[-1]} ({len(seeds)})", flush=True)
    if not (o["release"] or o["pinned"]):
        # the validation episodes keep their load; a jump of it is where a ceiling without a release fails
        print("warning: without --release the ceiling does not yield when the load jumps: session 86's ceilings "
              "broke QoS 3 to 67 times as often as their policies after a jump (docs/microservice-cores.md, "
              "\"A ceiling that yields to latency\"); --recipe shipped gives the shipped ones' memory",
              file=sys.stderr, flush=True)
    try:
        name = "β" if o["rule"] == "sqrt" else "H"
        choice = choose_ceiling(policy, policy.topo, seeds, grid, a.max_violations,
                                on_row=lambda r: print(f"  {name} {r['ceiling']:g}: {_line(r)}", flush=True),
                                margin=o["margin"], rule=o["rule"], pick=o["pick"],
                                no_worse_than_policy=a.no_worse_than_policy,
                                shape={k: o[k] for k in SHAPE_KEYS if o[k]})
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"  without: {_line(choice['without'])}")
    out = calibrated(policy, choice, time.perf_counter() - t0)
    try:
        out.save(a.out)
    except OSError as e:
        print(f"error: cannot save the policy to {a.out}: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"rule": o["rule"], "ceiling": choice["ceiling"], "version": out.version, "out": a.out,
                      "seconds": out.training["ceiling"]["seconds"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
