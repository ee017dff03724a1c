"""A hand-sized workload for the oversubscription tests: subscribers whose VMs arrive every step and
use a fixed, known share of their cores, so hotness and savings can be computed by hand."""
from __future__ import annotations

import numpy as np

from agents.oversubscription.workload import Workload


def toy_workload(n_subscribers=3, steps=48, per_step=2, cores=4.0, life=6, usage=None, seed=0) -> Workload:
    """`per_step` VMs per subscriber per step, each living `life` steps; subscriber n uses
    usage[n] of its cores (default 0.2, 0.5, 0.8, ...), plus a daily peak for the last one."""
    rng = np.random.default_rng(seed)
    if usage is None:
        usage = np.linspace(0.2, 0.8, n_subscribers)
    rows = [(n, t) for t in range(steps) for n in range(n_subscribers) for _ in range(per_step)]
    sub = np.array([n for n, _ in rows])
    arrive = np.array([t for _, t in rows])
    depart = arrive + life
    u = np.zeros((len(rows), steps), np.float32)
    for v, (n, t) in enumerate(rows):
        life_steps = np.arange(t, min(steps, t + life))
        base = usage[n] + 0.02 * rng.standard_normal(len(life_steps))
        u[v, life_steps] = np.clip(base, 0, 1)
    return Workload(n_subscribers=n_subscribers, steps=steps, sub=sub, arrive=arrive, depart=depart,
                    cores=np.full(len(rows), cores), mem=np.full(len(rows), 8.0), net=np.full(len(rows), 1.0),
                    usage=u, name="toy")


def views_at_rate_one(setting, workload) -> list:
    """Every view of one episode rolled at rate 1 (the usage history does not depend on the rates)."""
    from agents.oversubscription.sim import OversubSim

    sim = OversubSim(setting, workload)
    view, out = sim.reset(), []
    while view is not None:
        out.append(view)
        view, _ = sim.step(np.ones(setting.n_subscribers))
    return out
