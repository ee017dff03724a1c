"""The daemon's YAML config: strict keys with file lines, env overrides, secrets never shown."""
from pathlib import Path

import pytest

from samm.config import ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "configs" / "samm.example.yaml"


def test_example_config_loads():
    cfg = load_config(EXAMPLE, environ={})
    assert [g.name for g in cfg.groups] == ["S", "M", "L"] and cfg.executor.kind == "aws-asg"
    assert cfg.service.host == "127.0.0.1" and cfg.service.token is None


def test_unknown_key_names_key_and_line(tmp_path):
    text = EXAMPLE.read_text().replace("  prefix: samm", "  prefx: samm")
    p = tmp_path / "c.yaml"
    p.write_text(text)
    line = text.splitlines().index(next(l for l in text.splitlines() if l.startswith("  prefx"))) + 1
    with pytest.raises(ConfigError) as err:
        load_config(p, environ={})
    assert f"{p}:{line}: unknown key 'graphite.prefx'" in str(err.value)


def test_env_overrides_and_secret_is_hidden(tmp_path):
    env = {"SAMM_SERVICE__PORT": "9100", "SAMM_SERVICE__TOKEN": "hunter2", "SAMM_EXECUTOR__DRY_RUN": "true",
           "SAMM_KNOWLEDGE__URL": "postgresql://samm@127.0.0.1/samm", "OTHER": "x"}
    cfg = load_config(EXAMPLE, environ=env)
    assert cfg.service.port == 9100 and cfg.executor.dry_run is True
    assert cfg.service.token.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(cfg) and "hunter2" not in cfg.model_dump_json()
    with pytest.raises(ConfigError, match="service.port"):
        load_config(EXAMPLE, environ={"SAMM_SERVICE__PORT": "99999"})


def test_a_password_given_as_a_url_query_parameter_is_hidden_too():
    # libpq takes ?password= and ?sslpassword= beside the user-info password
    env = {"SAMM_KNOWLEDGE__URL": "postgresql://samm@db.example/samm?sslmode=require&password=hunter2&sslpassword=k3y"}
    dumped = load_config(EXAMPLE, environ=env).model_dump_json()
    assert "hunter2" not in dumped and "k3y" not in dumped
    assert "sslmode=require&password=***&sslpassword=***" in dumped


def test_ha_takes_the_postgres_alias_the_store_takes():
    env = {"SAMM_KNOWLEDGE__URL": "postgres://samm@db.example/samm", "SAMM_HA__ENABLED": "true"}
    assert load_config(EXAMPLE, environ=env).ha.enabled
    with pytest.raises(ConfigError, match="ha.enabled needs a PostgreSQL"):
        load_config(EXAMPLE, environ={"SAMM_KNOWLEDGE__URL": "postgresfake.db", "SAMM_HA__ENABLED": "true"})


@pytest.mark.parametrize("edit, message", [
    (("min: 1, max: 10, asg_name: samm-m5a-large", "min: 11, max: 10, asg_name: samm-m5a-large"), "min 11 > max 10"),
    ((", asg_name: samm-m5a-xlarge", ""), "asg_name for groups ['M']"),
    (("mode: in-process ", "mode: http "), "service_url"),
    # its action keys would not fit PostgreSQL's column (SQLite takes any length)
    (("{name: S, ", "{name: " + "S" * 51 + ", "), "at most 50 characters"),
])
def test_invalid_values_are_explained(tmp_path, edit, message):
    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text().replace(*edit))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(p, environ={})


def test_broken_yaml_and_missing_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("groups: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_cli_config_check(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from samm.cli.main import cli

    monkeypatch.setenv("SAMM_SERVICE__TOKEN", "hunter2")
    res = CliRunner().invoke(cli, ["config", "check", str(EXAMPLE)])
    assert res.exit_code == 0 and "hunter2" not in res.output and '"port": 8000' in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups: []\nbogus: 1\n")
    res = CliRunner().invoke(cli, ["config", "check", str(bad)])
    assert res.exit_code == 2 and "unknown key 'bogus'" in res.output


def test_an_asg_belongs_to_one_loop():
    """Cool-downs are per loop: two loops on one ASG would each act inside the other's."""
    from samm.config import SammConfig

    def loop(name, asgs, region="us-east-1"):
        return {"name": name, "executor": {"kind": "aws-asg", "region": region},
                "groups": [{"name": f"G{i}", "cores": 2, "ram_gb": 8, "price_per_hour": 0.1, "min": 0, "max": 5,
                            "asg_name": a} for i, a in enumerate(asgs)]}

    with pytest.raises(ValueError, match="ASG 'web-b' .* managed by loops 'web' and 'batch'"):
        SammConfig.model_validate({"loops": [loop("web", ["web-a", "web-b"]), loop("batch", ["web-b", "batch-a"])]})
    ok = SammConfig.model_validate({"loops": [loop("web", ["web-a"]), loop("batch", ["batch-a"]),
                                              loop("eu", ["web-a"], region="eu-west-1")]})
    assert [lp.name for lp in ok.control_loops()] == ["web", "batch", "eu"]


def test_a_binary_file_or_a_broken_environment_value_is_a_config_error(tmp_path):
    """Neither is an OSError nor a ValidationError: both once left `samm config check` with a traceback."""
    from click.testing import CliRunner

    from samm.cli.main import cli

    p = tmp_path / "c.yaml"
    p.write_bytes(b"groups: [\xff\xfe]\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(p, environ={})
    res = CliRunner().invoke(cli, ["config", "check", str(p)])
    assert res.exit_code == 2 and f"{p}: not UTF-8" in res.output and res.exception.__class__ is SystemExit
    with pytest.raises(ConfigError, match="SAMM_SERVICE__PORT: not a valid YAML value"):
        load_config(EXAMPLE, environ={"SAMM_SERVICE__PORT": "[1"})


@pytest.mark.parametrize("text, key", [
    ("  interval_s: 60 ", "  interval_s: .inf "),
    ("  interval_s: 60 ", "  interval_s: 1.0e+30 "),
    ("  misfire_grace_s: 30", "  misfire_grace_s: .inf"),
    ("  timeout_s: 5", "  timeout_s: .inf"),
])
def test_durations_the_scheduler_cannot_hold_are_rejected(tmp_path, text, key):
    """`gt=0` lets inf and huge values through, and `samm run` then died in APScheduler's timedelta."""
    p = tmp_path / "c.yaml"
    src = EXAMPLE.read_text()
    assert text in src
    p.write_text(src.replace(text, key))
    with pytest.raises(ConfigError, match="finite number|less than or equal"):
        load_config(p, environ={})


def test_a_problem_loops_interval_is_bounded_too():
    from samm.config import SammConfig

    loop = {"name": "batch", "problem": "deferrable-jobs", "queue": {"path": "/tmp/q.sqlite"},
            "capacity": {"kind": "fixed", "cores": 4}, "timing": {"interval_s": float("inf")}}
    with pytest.raises(ValueError, match="finite number"):
        SammConfig.model_validate({"loops": [loop]})
    loop["timing"] = {"interval_s": 1e30}
    with pytest.raises(ValueError, match="less than or equal"):
        SammConfig.model_validate({"loops": [loop]})


def test_two_loops_writing_their_agents_files_to_one_folder_are_refused():
    """An online learner's policy and log (or an explorer's samples) under one `out` for two loops:
    each overwrote the other's files."""
    import copy

    import yaml

    from samm.config import SammConfig

    d = yaml.safe_load((EXAMPLE.parent / "microservices.yaml").read_text())
    one = d["loops"][0]
    two = copy.deepcopy(one)
    two["name"], two["containers"]["name_prefix"] = "other", "other-"
    one["agent"] = {"name": "reclaimer-online", "params": {"out": "/srv/learn"}}
    two["agent"] = {"name": "sinan-explore", "params": {"out": "/srv/learn/"}}
    d["loops"] = [one, two]
    with pytest.raises(ValueError, match="loops 'hotel' and 'other' both write their agent's files to '/srv/learn/'"):
        SammConfig.model_validate(d)
    two["agent"]["params"]["out"] = "/srv/explore"
    assert len(SammConfig.model_validate(d).loops) == 2


@pytest.mark.parametrize("key", ["WARMUP_S", "COOLDOWN_S"])
@pytest.mark.parametrize("value", ["inf", "1e9"])
def test_a_warm_up_or_cool_down_past_a_week_is_refused(key, value):
    """An infinite warm-up measured no VM ever: CPU and RAM read 0, an idle fleet a rule scales in."""
    with pytest.raises(ConfigError, match=key.lower()):
        load_config(EXAMPLE, environ={f"SAMM_TIMING__{key}": value})
