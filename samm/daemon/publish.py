"""SAMM publishes what it saw, decided and did back to Graphite (names: docs/metric-naming.md),
and posts a Graphite event per scaling action so dashboards can annotate them."""
from __future__ import annotations

import time

from samm.monitor.graphite_client import GraphiteSender, post_event, sanitize

OUTCOMES = ("succeeded", "failed", "skipped", "dry_run", "blocked")


class GraphitePublisher:
    def __init__(self, sender: GraphiteSender, render_url: str | None, prefix: str = "samm", events: bool = True):
        self.sender = sender
        self.render_url = render_url
        self.prefix = prefix
        self.events = events and render_url is not None

    def publish(self, rep) -> None:
        # simulated windows start at t = 0; Graphite would drop such points as too old
        ts = rep.window_end if rep.window_end and rep.window_end > 1e9 else time.time()
        p = f"{self.prefix}.daemon"
        pts = [(f"{p}.metrics.{sanitize(k)}", v, ts) for k, v in rep.features.items()]
        for g, inv in rep.inventory.items():
            pts += [(f"{p}.groups.{sanitize(g)}.desired", inv["desired"], ts),
                    (f"{p}.groups.{sanitize(g)}.live", inv["live"], ts)]
        action = rep.plan.action if rep.plan is not None else None
        pts.append((f"{p}.decision.action", float(action) if isinstance(action, int) else -1.0, ts))
        # a per-type agent's decision is a change per group, no single index (its action reads -1)
        for g, delta in (rep.plan.deltas if rep.plan is not None else {}).items():
            pts.append((f"{p}.groups.{sanitize(g)}.delta", float(delta), ts))
        pts.append((f"{p}.decision.noop", 0.0 if rep.acted else 1.0, ts))
        pts.append((f"{p}.snapshot.stale", 0.0 if rep.status == "ok" else 1.0, ts))
        pts.append((f"{p}.iteration_ms", rep.iteration_ms, ts))
        pts += [(f"{p}.stage_ms.{stage}", ms, ts) for stage, ms in getattr(rep, "stage_ms", {}).items()]
        if rep.plan is not None:
            pts.append((f"{p}.decision_ms", rep.plan.latency_ms, ts))
        for a in rep.actions:
            pts.append((f"{p}.actions.{sanitize(a['group'])}.{a['status']}", 1.0, ts))
        self.sender.send_many(pts)
        self.sender.flush()
        if self.events:
            for a in rep.actions:
                if a["status"] in ("succeeded", "failed"):
                    post_event(self.render_url, f"scale {a['group']} {a.get('from')} -> {a.get('target')}: {a['status']}",
                               ["samm", "scaling", sanitize(a["group"])], data=a.get("error") or "", when=ts)
