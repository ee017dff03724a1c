"""The daemon's loop over the live path, every edge real: metrics in a real Graphite, the
inventory and actions through boto3 against moto's server, records in SQLite. Covers the
Monitor -> Analyze -> Plan -> Execute -> record chain, cool-downs that survive a restart
(on SQLite and on a real PostgreSQL),
no action on stale data, and what SAMM publishes back to Graphite."""
import pytest

from fixtures_graphite import last_boundary, publish_window, wait_for_points
from samm.config import SammConfig
from samm.daemon.build import build_daemon
from samm.execute.aws_asg import AwsAsgExecutor
from samm.execute.moto_server import MotoServer, create_paper_asgs
from samm.monitor.graphite_client import GraphiteSender, RenderClient

pytestmark = pytest.mark.graphite

ASGS = ("samm-m5a-large", "samm-m5a-xlarge", "samm-m5a-2xlarge")


@pytest.fixture(scope="module")
def moto():
    mp = pytest.MonkeyPatch()
    # as a user pointing SAMM at moto would: dummy credentials in the environment
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        mp.setenv(k, v)
    with MotoServer() as m:
        yield m
    mp.undo()


def make_config(tmp_path, graphite, prefix, moto, knowledge_url=None, **timing):
    groups = [{"name": n, "cores": c, "ram_gb": r, "price_per_hour": p, "min": lo, "max": 10, "asg_name": a}
              for n, c, r, p, lo, a in zip("SML", (2, 4, 8), (8, 16, 32), (0.2, 0.4, 0.8), (1, 0, 0), ASGS)]
    return SammConfig.model_validate({
        "groups": groups,
        "graphite": {"render_url": graphite.render_url, "carbon_host": graphite.carbon_host,
                     "carbon_port": graphite.carbon_port, "prefix": prefix, "lateness_s": 5},
        "agent": {"name": "threshold", "params": {"upper": 0.75, "lower": 0.2, "cooldown_steps": 0}},
        "executor": {"kind": "aws-asg", "endpoint_url": moto.endpoint_url, "max_attempts": 2},
        "timing": {"interval_s": 60, "warmup_s": 0, "cooldown_s": 300, **timing},
        "knowledge": {"url": knowledge_url or f"sqlite:///{tmp_path}/k.db"},
    })


def publish_busy_fleet(graphite, prefix, executor, window_end, cpu=95.0, submitted=(100, 40)):
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    inst = [(g, i.instance_id, cpu, 1.0, window_end - 600)
            for g, s in executor.inventory().items() for i in s.instances if i.state == "running"]
    n = publish_window(sender, prefix, window_end, inst,
                       queue={"submitted_total": submitted[0], "waiting": 30, "running": 10, "completed_total": 60,
                              "waiting_submitted_this_minute": 5},
                       queue_before={"submitted_total": submitted[0] - submitted[1], "waiting": 20, "running": 10,
                                     "completed_total": 50, "waiting_submitted_this_minute": 3},
                       history_start=window_end - 700)
    # every point graphite-web shows of the window (5 of its 6 in this render), CPU and RAM alike: a
    # reader that came while carbon had written an instance's RAM but not yet its CPU saw a partial
    # snapshot and held back (a flaky CI run)
    for metric in ("cpu_percent", "ram_used_gb"):
        wait_for_points(graphite.render_url, f"{prefix}.groups.*.instances.*.{metric}", window_end - 60,
                        window_end - 1, expect_series=len(inst), expect_points=5)
    wait_for_points(graphite.render_url, f"{prefix}.queue.*", window_end - 60, window_end - 1, expect_series=5)
    return n


def desired(moto):
    client = moto.client("autoscaling")
    groups = client.describe_auto_scaling_groups(AutoScalingGroupNames=list(ASGS))["AutoScalingGroups"]
    return {g["AutoScalingGroupName"]: g["DesiredCapacity"] for g in groups}


def test_live_loop_scales_records_and_honours_cooldown_across_restart(tmp_path, graphite, graphite_prefix, moto,
                                                                     knowledge_url):
    """On SQLite and on a real PostgreSQL: the cool-down written with the action's outcome is
    what the restarted daemon reads back."""
    moto.reset()
    create_paper_asgs(endpoint_url=moto.endpoint_url, desired=1)
    e1 = last_boundary(60, back=4)
    clock = {"now": e1 + 10.0}
    cfg = make_config(tmp_path, graphite, graphite_prefix, moto, knowledge_url)
    executor = AwsAsgExecutor.from_config(cfg)
    publish_busy_fleet(graphite, graphite_prefix, executor, e1)

    daemon = build_daemon(cfg, executor=executor, clock=lambda: clock["now"])
    try:
        rep = daemon.loop.run_once()
        assert rep.status == "ok", rep.reasons
        assert rep.key == str(e1)
        assert rep.features["cpu_mean"] == pytest.approx(0.95)
        assert rep.plan.action_name == "add S, add M, add L"
        assert sorted(a["status"] for a in rep.actions) == ["succeeded"] * 3
        assert desired(moto) == {a: 2 for a in ASGS}
        assert set(daemon.store.cooldowns()) == {"S", "M", "L"}

        # the next interval is inside the cool-down: the wish is recorded as blocked, nothing sent
        e2 = e1 + 60
        publish_busy_fleet(graphite, graphite_prefix, executor, e2)
        clock["now"] = e2 + 10.0
        rep = daemon.loop.run_once()
        assert rep.status == "ok", rep.reasons
        assert {a["status"] for a in rep.actions} == {"blocked"}
        assert desired(moto) == {a: 2 for a in ASGS}
        # running it again in the same interval never decides or acts twice
        again = daemon.loop.run_once()
        assert not again.decided and again.actions == []
    finally:
        daemon.close()

    # a restarted daemon reads the cool-downs back from the knowledge store
    e3 = e1 + 120
    publish_busy_fleet(graphite, graphite_prefix, AwsAsgExecutor.from_config(cfg), e3)
    clock["now"] = e3 + 10.0
    daemon = build_daemon(cfg, executor=AwsAsgExecutor.from_config(cfg), clock=lambda: clock["now"])
    try:
        rep = daemon.loop.run_once()
        assert {a["status"] for a in rep.actions} == {"blocked"}
        assert all("cooldown" in why for why in rep.blocked.values())
        assert desired(moto) == {a: 2 for a in ASGS}
        counts = daemon.store.counts()
        assert counts["decisions"] == 3
    finally:
        daemon.close()

    # SAMM published its metrics, decisions and a scaling event
    render = RenderClient(graphite.render_url)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.daemon.metrics.cpu_mean", e1 - 60, e3 + 1,
                    expect_points=3)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.daemon.actions.*.succeeded", e1 - 60, e3 + 1,
                    expect_series=3)
    assert render.render(f"{graphite_prefix}.daemon.groups.S.live", e1 - 60, e3 + 1)
    import requests

    events = requests.get(f"{graphite.render_url}/events/get_data",
                          params={"tags": "scaling", "from": str(e1 - 120), "until": str(e3 + 120)}, timeout=5).json()
    assert any("scale S 1 -> 2: succeeded" in e["what"] for e in events)


def test_stale_graphite_means_no_action_and_a_recorded_reason(tmp_path, graphite, graphite_prefix, moto):
    moto.reset()
    create_paper_asgs(endpoint_url=moto.endpoint_url, desired=1)
    cfg = make_config(tmp_path, graphite, graphite_prefix, moto)
    dead = cfg.model_copy(update={"graphite": cfg.graphite.model_copy(update={"render_url": "http://127.0.0.1:9"})})
    daemon = build_daemon(dead, executor=AwsAsgExecutor.from_config(cfg))
    try:
        rep = daemon.loop.run_once()
        assert rep.status == "stale" and rep.actions == []
        d = daemon.store.decisions()[-1]
        assert d.source == "none" and "Graphite unavailable" in d.reason
    finally:
        daemon.close()
    assert desired(moto) == {a: 1 for a in ASGS}


def test_missing_queue_counters_are_stale_not_a_guess(tmp_path, graphite, graphite_prefix, moto):
    moto.reset()
    create_paper_asgs(endpoint_url=moto.endpoint_url, desired=1)
    cfg = make_config(tmp_path, graphite, graphite_prefix, moto)
    executor = AwsAsgExecutor.from_config(cfg)
    e = last_boundary(60, back=2)
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    inst = [(g, i.instance_id, 95.0, 1.0, e - 600) for g, s in executor.inventory().items() for i in s.instances]
    publish_window(sender, graphite_prefix, e, inst, history_start=e - 700)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.*.instances.*.cpu_percent", e - 60, e - 1,
                    expect_series=len(inst))
    daemon = build_daemon(cfg, executor=executor, clock=lambda: e + 10.0)
    try:
        rep = daemon.loop.run_once()
        assert rep.status in ("stale", "partial") and rep.actions == []
        assert any("queue" in r for r in rep.reasons)
    finally:
        daemon.close()
    assert desired(moto) == {a: 1 for a in ASGS}
