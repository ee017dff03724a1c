"""The Grafana provisioning set: valid YAML with the fixed datasource uid, and a dashboard
whose every query returns data from a real Graphite fed with every series documented in
docs/metric-naming.md (so a renamed metric breaks this test, not a user's dashboard)."""
from __future__ import annotations

import fnmatch
import itertools
import json
import re
import time
from pathlib import Path

import pytest
import requests
import yaml

from samm.analyze.metrics import OBSERVATION_NAMES
from samm.monitor.graphite_client import GraphiteSender, RenderClient, post_event

pytestmark = pytest.mark.graphite

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "deploy" / "grafana"
PLACEHOLDERS = {"<group>": ["S", "M"], "<instance>": ["i-01"], "<name>": list(OBSERVATION_NAMES),
                "<stage>": ["monitor", "analyze", "plan", "execute"],
                "<status>": ["succeeded", "failed", "skipped", "dry_run"]}
NOT_ON_DASHBOARD = {"up"}  # the heartbeat feeds the Monitor stage, not a human


def documented_series(prefix: str) -> list[str]:
    names = []
    for line in (ROOT / "docs" / "metric-naming.md").read_text().splitlines():
        m = re.match(r"\|\s*`<prefix>\.([^`]+)`(?:\s*/\s*`\.([^`]+)`)?", line)
        if not m:
            continue
        stems = [m.group(1)] + ([m.group(1).rsplit(".", 1)[0] + "." + m.group(2)] if m.group(2) else [])
        for stem in stems:
            keys = [k for k in PLACEHOLDERS if k in stem]
            for combo in itertools.product(*(PLACEHOLDERS[k] for k in keys)):
                name = stem
                for k, v in zip(keys, combo):
                    name = name.replace(k, v)
                names.append(f"{prefix}.{name}")
    return names


def dashboard() -> dict:
    return json.loads((GRAFANA / "dashboards" / "samm.json").read_text())


def targets(dash: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["target"]) for p in dash["panels"] for t in p["targets"]]


def _glob_matches(pattern: str, name: str) -> bool:
    alternatives = [pattern]
    while any("{" in a for a in alternatives):
        expanded = []
        for a in alternatives:
            m = re.search(r"\{([^{}]*)\}", a)
            expanded += [a[:m.start()] + opt + a[m.end():] for opt in m.group(1).split(",")] if m else [a]
        alternatives = expanded
    return any(len(a.split(".")) == len(name.split(".")) and fnmatch.fnmatchcase(name, a) for a in alternatives)


def test_provisioning_yaml_is_valid():
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "samm-graphite.yaml").read_text())
    assert ds["apiVersion"] == 1
    [d] = ds["datasources"]
    assert (d["type"], d["uid"], d["jsonData"]["graphiteVersion"]) == ("graphite", "samm-graphite", "1.1")
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "samm.yaml").read_text())
    [p] = prov["providers"]
    assert p["type"] == "file" and p["options"]["path"]
    dash = dashboard()
    uids = {p["datasource"]["uid"] for p in dash["panels"]} | {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
    assert uids == {"samm-graphite"}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert [v["name"] for v in dash["templating"]["list"]] == ["prefix"]
    scaling = [a for a in dash["annotations"]["list"] if a.get("datasource", {}).get("uid") == "samm-graphite"]
    assert scaling and scaling[0]["target"]["tags"] == ["scaling"]


def test_every_documented_series_is_on_the_dashboard():
    patterns = [m.replace("$prefix", "samm") for _, t in targets(dashboard())
                for m in re.findall(r"\$prefix\.(?:[A-Za-z0-9_.*-]|\{[^}]*\})+", t)]
    missing = [n for n in documented_series("samm")
               if n.rsplit(".", 1)[1] not in NOT_ON_DASHBOARD and not any(_glob_matches(p, n) for p in patterns)]
    assert not missing, f"documented series no panel shows: {missing}"


def test_every_panel_query_returns_data(graphite, graphite_prefix):
    now = int(time.time())
    series = documented_series(graphite_prefix)
    assert len(series) > 30
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    for k, ts in enumerate((now - 120, now - 60, now - 30)):
        for name in series:
            sender.send(name, 10 * (k + 1), ts)  # increasing: counters' derivatives are non-empty too
    assert sender.flush() == 3 * len(series)
    assert post_event(graphite.render_url, "scale S 1->2", ["samm", "scaling", "S"], "dashboard test")

    render = RenderClient(graphite.render_url)
    todo = [(title, t.replace("$prefix", graphite_prefix)) for title, t in targets(dashboard())]
    deadline = time.monotonic() + 20
    while todo and time.monotonic() < deadline:
        todo = [(title, t) for title, t in todo
                if not any(s.values() for s in render.render(t, now - 600, now + 1))]
        if todo:
            time.sleep(0.2)  # new whisper files take about a second to appear
    assert not todo, f"panel queries without data: {todo}"
    ev = requests.get(f"{graphite.render_url}/events/get_data", params={"tags": "scaling", "from": "-10min"}, timeout=5)
    assert any(e["what"] == "scale S 1->2" for e in ev.json())
