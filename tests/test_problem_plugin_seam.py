"""Audit of the problem plug-in seam: a problem in a distribution of its own (a real
`*.dist-info/entry_points.txt` on the path, group `samm.problems`) is listed, served, trained,
run as an experiment and driven by the daemon without editing the service, the store or the
daemon; a broken plug-in is one line naming it and hides nothing; the catalogue refuses specs
that would take over another problem's agents or env id.

Every plug-in runs in a subprocess (`samm ...` with the plug-ins on PYTHONPATH), so this test
process's catalogue stays as shipped."""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from agents.registry import ProblemSpec, get_problem, load_entry_point, problem_names, register_problem
from samm.localproc import free_port

ROOT = Path(__file__).resolve().parents[1]

TOY = {
    "__init__.py": '''
        from agents.registry import ProblemSpec, register_problem

        PROBLEM = register_problem(ProblemSpec(
            name="toy-plugin", title="a problem from its own distribution", paper="-",
            env_id="sammtoy/Toy-v0", env_entry_point="sammtoy.policy:ToyEnv",
            agents={"toy-pick": "sammtoy.policy:make"}, default_agent="toy-pick", learner="toy-pick",
            policy_loader="sammtoy.policy:load", make_policy="sammtoy.policy:make",
            experiment="sammtoy.policy:experiment", train="sammtoy.policy:train",
            loop_config="sammtoy.loop:ToyLoop", build_loop="sammtoy.loop:build"))
        ''',
    "policy.py": '''
        import json
        from pathlib import Path

        import gymnasium as gym
        import numpy as np
        from gymnasium import spaces

        from agents.policy import Decision
        from agents.spaces import space_to_json

        OBS, ACT = spaces.Box(0.0, 1.0, (3,), np.float32), spaces.Discrete(3)


        class ToyEnv(gym.Env):
            observation_space, action_space = OBS, ACT


        class Pick:
            problem, kind, version, stateful = "toy-plugin", "toy-pick", "toy-1", False
            observation_space, action_space = OBS, ACT

            def initial_state(self, batch=1):
                return None

            def decide(self, observation, state=None, *, mask=None, deterministic=True):
                return Decision(int(np.argmax(observation)), None, {}), state

            def metadata(self):
                return {"problem": self.problem, "kind": self.kind, "version": self.version,
                        "observation_space": space_to_json(OBS), "action_space": space_to_json(ACT)}


        def make(agent, policy_dir=None, **params):
            return Pick()


        def load(directory):
            return Pick()


        def experiment(out, quick=False, progress=True, **kw):
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "report.md").write_text("toy\\n")
            return {"targets": [{"quick": quick}]}


        def train(argv):
            out = Path(argv[argv.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / "argv.json").write_text(json.dumps(argv))
            return 0
        ''',
    "loop.py": '''
        import time
        from pathlib import Path
        from typing import Literal

        from pydantic import BaseModel

        from agents.registry import make_policy
        from samm.config import AgentConfig, Strict, TimingConfig
        from samm.daemon.loop import IterationReport


        class ToyExecutor(Strict):
            kind: Literal["sim"] = "sim"
            dry_run: bool = False


        class ToyLoop(Strict):
            name: str
            problem: Literal["toy-plugin"] = "toy-plugin"
            timing: TimingConfig = TimingConfig(interval_s=0.2)
            agent: AgentConfig = AgentConfig(name="toy-pick")
            executor: ToyExecutor = ToyExecutor()
            out: str


        class Loop:
            def __init__(self, lp):
                self.name, self.config, self.policy = lp.name, lp, make_policy(lp.agent.name)
                self.last_progress, self.n = time.monotonic(), 0

            def recover(self):
                return []

            def run_once(self):
                self.n += 1
                d, _ = self.policy.decide([0.1, 0.9, 0.2])
                with open(self.config.out, "a") as f:
                    f.write(f"{self.n} {d.action}\\n")
                self.last_progress = time.monotonic()
                return IterationReport(key=str(self.n), window_start=0.0, window_end=0.0, status="ok", reasons=[])


        def build(cfg, lp, store, closers):
            return Loop(lp)
        ''',
}


def _distribution(site: Path, name: str, entry_points: str, files: dict[str, str]) -> None:
    """An installed distribution as pip leaves it: the package and its `.dist-info`."""
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[samm.problems]\n" + textwrap.dedent(entry_points))


def _toy(site: Path) -> None:
    _distribution(site, "sammtoy", "toy-plugin = sammtoy\n", {f"sammtoy/{k}": v for k, v in TOY.items()})


BROKEN = {  # plug-in name -> (entry point value, its module's text)
    "needs-missing": ("brokenimport", "import no_such_dependency_xyz\n"),
    "not-a-spec": ("wrongtype:PROBLEM", "PROBLEM = 42\n"),
    "autoscaling": ("clash", '''
        from agents.registry import ProblemSpec, register_problem
        PROBLEM = register_problem(ProblemSpec(name="autoscaling", title="x", paper="-"))
        '''),
    "raises": ("raising", "raise RuntimeError('plug-in exploded\\non two lines')\n"),
    "agent-thief": ("thief", '''
        from agents.registry import ProblemSpec, register_problem
        PROBLEM = register_problem(ProblemSpec(name="agent-thief", title="x", paper="-",
                                               agents={"lstm-ppo": "thief:make"}, make_policy="thief:make"))
        def make(agent, policy_dir=None, **kw):
            raise AssertionError("the thief's lstm-ppo was hosted")
        '''),
}


def _broken(site: Path) -> None:
    for name, (value, text) in BROKEN.items():
        module = value.partition(":")[0]
        _distribution(site, f"broken_{module}", f"{name} = {value}\n", {f"{module}.py": text})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A site directory holding the toy plug-in and every broken kind of plug-in."""
    site = tmp_path_factory.mktemp("site")
    _toy(site)
    _broken(site)
    return site


def _env(site: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}


def samm(site: Path, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "samm.cli.main", *args], cwd=ROOT, env=_env(site),
                          capture_output=True, text=True, timeout=timeout)


def python(site: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=_env(site),
                          capture_output=True, text=True, timeout=120)


def _warnings(stderr: str) -> dict[str, str]:
    return {name: line for line in stderr.splitlines() for name in BROKEN if f"plug-in {name!r}" in line}


def test_an_installed_plugin_is_listed_and_broken_ones_hide_nothing(site):
    r = python(site, '''
        import json
        from agents.registry import problem_names, learner_names
        from agents.problems import plugin_errors
        print(json.dumps({"names": problem_names(), "learners": learner_names(), "errors": plugin_errors()}))
        ''')
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["names"]) == {"autoscaling", "deferrable-jobs", "lra-placement", "microservice-cores",
                                 "oversubscription", "toy-plugin"}
    assert "toy-pick" in out["learners"]
    assert set(out["errors"]) == set(BROKEN)
    errors = out["errors"]
    assert "no_such_dependency_xyz" in errors["needs-missing"] and "broken_brokenimport 0.1" in errors["needs-missing"]
    assert "expected a ProblemSpec" in errors["not-a-spec"]
    assert "'autoscaling' is already registered" in errors["autoscaling"]
    assert "plug-in exploded on two lines" in errors["raises"]
    assert "agent 'lstm-ppo' is already an agent of problem 'autoscaling'" in errors["agent-thief"]
    assert all("\n" not in e for e in errors.values())
    # one warning line per broken plug-in on stderr, no traceback
    assert set(_warnings(r.stderr)) == set(BROKEN) and "Traceback" not in r.stderr


def test_help_and_the_generic_verbs_offer_the_plugin(site):
    r = samm(site, "--help")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert set(_warnings(r.stderr)) == set(BROKEN)
    for verb in (["train"], ["experiment", "run"]):
        out = samm(site, *verb, "--help").stdout
        assert "toy-plugin" in out and "autoscaling" in out, verb


def test_asking_for_a_broken_plugin_says_why_it_is_not_loaded(site):
    r = python(site, '''
        from agents.registry import get_problem
        try:
            get_problem("needs-missing")
        except ValueError as exc:
            print(exc)
        ''')
    assert "plug-in 'needs-missing'" in r.stdout and "no_such_dependency_xyz" in r.stdout


def test_samm_train_and_experiment_run_dispatch_to_the_plugin(site, tmp_path):
    r = samm(site, "train", "--problem", "toy-plugin", "--out", str(tmp_path / "t"), "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "t" / "argv.json").read_text())[:4] == ["--out", str(tmp_path / "t"), "--seed", "3"]
    r = samm(site, "experiment", "run", "--problem", "toy-plugin", "--out", str(tmp_path / "e"), "--quick")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0]) == [{"quick": True}]
    assert (tmp_path / "e" / "report.md").is_file()


def test_samm_serve_hosts_the_plugin_agent_beside_a_builtin(site, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "serve", "--port", str(port), "--agent", "toy-pick",
                             "--agent", "queue", "--store", str(tmp_path / "store")],
                            cwd=ROOT, env=_env(site), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()[1]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/agents/toy-pick/decide",
                       json={"observation": [0.1, 0.9, 0.2]}, timeout=5)
        assert r.status_code == 200, r.text
        assert r.json()["action"] == 1 and r.json()["policy_version"] == "toy-1"
        agents = httpx.get(f"http://127.0.0.1:{port}/v1/agents", timeout=5).json()["agents"]
        assert {a["name"]: a["problem"] for a in agents} == {"toy-pick": "toy-plugin", "queue": "autoscaling"}
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert set(_warnings(err)) == set(BROKEN) and "Traceback" not in err


def test_samm_serve_lstm_ppo_is_not_taken_over_by_a_plugin_listing_it(site):
    """The thief plug-in (sorted before autoscaling) lists `lstm-ppo`: hosting it must not call
    the thief's make_policy."""
    r = python(site, '''
        from agents.registry import problem_of_agent
        print(problem_of_agent("lstm-ppo").name)
        ''')
    assert r.stdout.strip() == "autoscaling", r.stderr


def test_samm_run_drives_the_plugins_daemon_loop(site, tmp_path):
    marks = tmp_path / "decisions.txt"
    cfg = tmp_path / "samm.yaml"
    cfg.write_text(f"loops:\n  - name: toy\n    problem: toy-plugin\n    out: {marks}\n"
                   f"knowledge:\n  url: sqlite:///{tmp_path / 'k.db'}\n")
    r = samm(site, "config", "check", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    r = samm(site, "run", "--config", str(cfg), "--iterations", "2", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert marks.read_text().split("\n")[:2] == ["1 1", "2 1"]
    assert [json.loads(line)["loop"] for line in r.stdout.splitlines()] == ["toy", "toy"]


# -- the catalogue's own checks (in process: each is a refusal, which registers nothing) ---------

def test_a_second_problem_cannot_take_a_registered_agent_name():
    before = problem_names()
    with pytest.raises(ValueError, match="agent 'lstm-ppo' is already an agent of problem 'autoscaling'"):
        register_problem(ProblemSpec(name="aaa-thief", title="x", paper="-", agents={"lstm-ppo": "x:y"}))
    assert problem_names() == before


def test_an_env_id_registered_for_another_entry_point_is_refused():
    import gymnasium

    with pytest.raises(ValueError, match="env id 'samm/CloudSim-v0' is already registered"):
        register_problem(ProblemSpec(name="cloudsim-thief", title="x", paper="-", env_id="samm/CloudSim-v0",
                                     env_entry_point="thief.env:Env"))
    assert gymnasium.registry["samm/CloudSim-v0"].entry_point == "sim_bridge.envs:CloudSimEnv"
    assert "cloudsim-thief" not in problem_names()


@pytest.mark.parametrize("spec, says", [
    ({"name": "x"}, "takes a ProblemSpec"),
    (ProblemSpec(name="", title="x", paper="-"), "non-empty string"),
    (ProblemSpec(name=" padded", title="x", paper="-"), "non-empty string"),
])
def test_register_problem_refuses_what_is_not_a_named_spec(spec, says):
    with pytest.raises((TypeError, ValueError), match=says):
        register_problem(spec)


def test_registering_the_same_spec_again_is_a_no_op():
    spec = get_problem("lra-placement")
    assert register_problem(spec) is spec


@pytest.mark.parametrize("ref, says", [
    ("no_such_module_xyz:thing", "cannot import 'no_such_module_xyz'"),
    ("agents.registry:no_such_attr", "'agents.registry' has no 'no_such_attr'"),
])
def test_an_entry_point_that_cannot_be_loaded_is_a_value_error_naming_it(ref, says):
    with pytest.raises(ValueError, match=says):
        load_entry_point(ref)


def test_two_distributions_registering_one_problem_name_load_one_and_name_the_other(tmp_path):
    spec = '''
        from agents.registry import ProblemSpec, register_problem
        PROBLEM = register_problem(ProblemSpec(name="dup", title="{title}", paper="-"))
        '''
    _distribution(tmp_path, "dup_a", "dup = dupa\n", {"dupa.py": spec.format(title="a")})
    _distribution(tmp_path, "dup_b", "dup = dupb\n", {"dupb.py": spec.format(title="b")})
    # the same module under a second name (an alias) registers the same spec: no error
    _distribution(tmp_path, "dup_alias", "dup-alias = dupa\n", {})
    r = python(tmp_path, '''
        import json
        from agents.registry import get_problem
        from agents.problems import plugin_errors
        print(json.dumps({"title": get_problem("dup").title, "errors": plugin_errors()}))
        ''')
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["title"] == "a"  # entry points load in a fixed order (by name, then value)
    assert list(out["errors"]) == ["dup"] and "dup_b 0.1" in out["errors"]["dup"]
    assert "'dup' is already registered" in out["errors"]["dup"]


class NamedFeaturesPolicy:
    """A plug-in problem's policy that names its features and action mode, as many would: by those
    attributes alone the service took it for an autoscaling agent."""
    problem, kind, version, stateful = "named-features-plugin", "named-features", "n-1", False
    feature_names, action_mode = ("cpu", "mem"), "pick-one"

    def __init__(self):
        from gymnasium import spaces

        from agents.spaces import NamedBox

        self.observation_space, self.action_space = NamedBox(["cpu", "mem"], 0.0, 1.0), spaces.Discrete(2)

    def initial_state(self, batch=None):
        return None

    def decide(self, observation, state=None, *, mask=None, deterministic=True):
        from agents.policy import Decision

        return Decision(int(max(range(2), key=lambda i: observation[i])), None, {}), state


def test_a_plugin_policy_naming_its_features_is_served_as_its_own_problem(tmp_path):
    from fastapi.testclient import TestClient

    from agents.factory import make_hosted_agent
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app

    register_problem(ProblemSpec(name="named-features-plugin", title="x", paper="-",
                                 agents={"named-features": NamedFeaturesPolicy}))
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("named-features", NamedFeaturesPolicy())
    reg.host("queue", make_hosted_agent("queue"))
    client = TestClient(create_app(reg), raise_server_exceptions=False)
    r = client.get("/v1/agents")  # was a 500 for every agent: the policy has no `action_names`
    assert r.status_code == 200, r.text
    assert {a["name"]: a["problem"] for a in r.json()["agents"]} == {
        "named-features": "named-features-plugin", "queue": "autoscaling"}
    # its own space route, not the autoscaler's batched `act`
    r = client.post("/v1/agents/named-features/decide", json={"observation": {"cpu": 0.2, "mem": 0.7}})
    assert r.status_code == 200 and r.json()["action"] == 1, r.text


def test_a_thread_reading_the_catalogue_while_another_loads_it_waits_for_the_plugins(tmp_path):
    """The plug-in reads the catalogue while it is imported (the loading thread goes on) and is
    slow: a second thread asking meanwhile must get the whole catalogue, not the part loaded."""
    _distribution(tmp_path, "slowplug", "slow = slowplug\n", {"slowplug.py": '''
        import time
        from agents.registry import ProblemSpec, problem_names, register_problem
        assert "autoscaling" in problem_names()
        time.sleep(1.0)
        PROBLEM = register_problem(ProblemSpec(name="slow", title="x", paper="-"))
        '''})
    r = python(tmp_path, '''
        import threading, time
        from agents.registry import problem_names
        seen = []
        first = threading.Thread(target=lambda: seen.append(problem_names()))
        first.start()
        time.sleep(0.3)
        seen.append(problem_names())
        first.join()
        print(all("slow" in names for names in seen), len(seen))
        ''')
    assert r.stdout.split() == ["True", "2"], r.stderr


@pytest.mark.parametrize("ref, says", [("sammtoy.loop:NoLoop", "'sammtoy.loop' has no 'NoLoop'"),
                                       ("sammtoy.gone:ToyLoop", "cannot import 'sammtoy.gone'")])
def test_config_check_names_a_plugin_loop_model_that_cannot_be_loaded(tmp_path, ref, says):
    files = {f"sammtoy/{k}": v for k, v in TOY.items()}
    files["sammtoy/__init__.py"] = files["sammtoy/__init__.py"].replace("sammtoy.loop:ToyLoop", ref)
    _distribution(tmp_path / "site", "sammtoy", "toy-plugin = sammtoy\n", files)
    cfg = tmp_path / "samm.yaml"
    cfg.write_text("loops:\n  - name: toy\n    problem: toy-plugin\n    out: x\n")
    r = samm(tmp_path / "site", "config", "check", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert says in r.stderr + r.stdout


class StatefulNamedPolicy(NamedFeaturesPolicy):
    """A stateful plug-in policy with an action mode, whose `initial_state()` takes no batch size:
    a new session called the autoscaler's `initial_state(1)` on it (a 500 on every decide)."""
    problem, kind, version, stateful = "stateful-named-plugin", "stateful-named", "s-1", True

    def initial_state(self):
        return {"calls": 0}

    def decide(self, observation, state=None, *, mask=None, deterministic=True):
        decision, _ = super().decide(observation, None, mask=mask, deterministic=deterministic)
        return decision, {"calls": state["calls"] + 1}


def test_a_stateful_plugin_policy_with_an_action_mode_gets_its_own_initial_state(tmp_path):
    from fastapi.testclient import TestClient

    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app

    register_problem(ProblemSpec(name="stateful-named-plugin", title="x", paper="-",
                                 agents={"stateful-named": StatefulNamedPolicy}))
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("stateful-named", StatefulNamedPolicy())
    client = TestClient(create_app(reg), raise_server_exceptions=False)
    for _ in range(2):
        r = client.post("/v1/agents/stateful-named/decide",
                        json={"session_id": "s1", "observation": {"cpu": 0.2, "mem": 0.7}})
        assert r.status_code == 200 and r.json()["action"] == 1, r.text


def _toy_with(tmp_path, old: str, new: str) -> Path:
    files = {f"sammtoy/{k}": v for k, v in TOY.items()}
    files["sammtoy/__init__.py"] = files["sammtoy/__init__.py"].replace(old, new)
    _distribution(tmp_path / "site", "sammtoy", "toy-plugin = sammtoy\n", files)
    return tmp_path / "site"


def test_samm_run_names_a_plugin_loop_that_cannot_be_built(tmp_path):
    site = _toy_with(tmp_path, 'build_loop="sammtoy.loop:build"', 'build_loop="sammtoy.loop:no_build"')
    cfg = tmp_path / "samm.yaml"
    cfg.write_text(f"loops:\n  - name: toy\n    problem: toy-plugin\n    out: {tmp_path / 'x'}\n"
                   f"knowledge:\n  url: sqlite:///{tmp_path / 'k.db'}\n")
    r = samm(site, "run", "--config", str(cfg), "--iterations", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "loop 0 (problem toy-plugin)" in r.stderr and "no_build" in r.stderr, r.stderr[-2000:]


def test_samm_serve_names_a_plugin_whose_routes_cannot_be_imported(tmp_path):
    site = _toy_with(tmp_path, 'build_loop="sammtoy.loop:build"',
                     'build_loop="sammtoy.loop:build", routes="sammtoy.gone:add_routes"')
    r = samm(site, "serve", "--port", str(free_port()), "--agent", "toy-pick", "--store", str(tmp_path / "store"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "cannot build the service" in r.stderr and "sammtoy.gone" in r.stderr, r.stderr[-2000:]
