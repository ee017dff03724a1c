"""Ninth audit of Reclaimer's learning and experiment side (agents/microservice_cores: the SAC agent,
its training schedule, the baselines' models, the experiment). Each test is seconds long: toy
networks on the 3-service chain, the shipped Sinan-style model files, no full training."""
from __future__ import annotations

import json
import shutil

import pytest

from agents.microservice_cores.features import observation_layout
from agents.microservice_cores.hosting import make_controller
from agents.microservice_cores.policy import ReclaimerPolicy
from agents.microservice_cores.sac import Sac, SacConfig
from agents.microservice_cores.sinan import SHIPPED_DIR, load_sinan
from agents.microservice_cores.topology import load_topology
from agents.microservice_cores.train import sim_config, train

TESTBED = load_topology("testbed")


# --- the Sinan-style model file: a corrupt one is one line naming it ------------------------------
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_sinan_model_file_is_one_line_naming_it(tmp_path, damage):
    """A truncated model failed with "EOF: reading array data ..." (no file named) and a garbage one
    with pickle's UnpicklingError, which the daemon's loop builder does not catch: a traceback out
    of `samm run` for an agent {name: sinan, policy_dir: ...} whose file was damaged."""
    good = (SHIPPED_DIR / "sinan-testbed.joblib").read_bytes()
    path = tmp_path / "sinan-testbed.joblib"
    path.write_bytes(good[:5000] if damage == "truncated" else b"not a model\n")
    with pytest.raises(ValueError, match=r"sinan-testbed\.joblib: not a readable Sinan-style model") as e:
        make_controller("sinan", TESTBED, policy_dir=str(tmp_path))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="not a readable Sinan-style model"):
        load_sinan(path, "testbed")


def test_a_missing_sinan_model_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"sinan-testbed\.joblib: no such Sinan-style model file"):
        load_sinan(tmp_path, "testbed")
    shutil.copy(SHIPPED_DIR / "sinan-testbed.joblib", tmp_path)
    assert load_sinan(tmp_path, "testbed").app == "testbed"     # a whole one still loads


# --- the paper's target entropy follows the application a transferred agent trains on -------------
def test_a_transferred_agent_takes_the_papers_target_entropy_of_its_new_application():
    """With the paper's target (target_entropy None: −1/(|M|·|A|)), an agent built for the 3-service
    chain and transferred to the 7-service testbed kept −1/3 as its target, the source's |M|."""
    cfg = sim_config(n_envs=1, hidden=16, classifier_updates=1, replay=2_000, updates_per_step=1,
                     autoscale_steps=300, classifier_steps=0, total_steps=300, id_width=7, target_entropy=None)
    width, n_scaled = observation_layout(cfg.k, 3, cfg.id_width, cfg.observe_queue)
    source = Sac(width, n_scaled, 3, cfg)
    assert source.target_entropy == pytest.approx(-1 / 3)
    run = train("testbed", cfg, seed=1, progress=False, init=source)
    assert run.agent.target_entropy == pytest.approx(-1 / 7)
    # a named target is the run's own whatever the application
    named = Sac(width, n_scaled, 3, SacConfig(**{**cfg.to_json(), "candidates": cfg.candidates,
                                                  "target_entropy": -2.5}))
    named.match_services(7)
    assert named.target_entropy == -2.5


# --- a network of no hidden layer: refused by name before any episode, not a torch error after the fill --
@pytest.mark.parametrize("field", ["actor_layers", "critic_pre_layers", "critic_post_layers"])
def test_a_network_without_hidden_layers_is_refused_by_name(field, tmp_path):
    """0 passed the config's check (its range was [0, 64]), but the output layers read `hidden` numbers:
    training ran the whole AutoScale fill, then failed at the first act or update with "addmm: mat1 and
    mat2 shapes cannot be multiplied"; a policy whose metadata said 0 loaded and failed at its first act."""
    with pytest.raises(ValueError, match=rf"^{field} must be a whole number in \[1, 64\], not 0$"):
        sim_config(**{field: 0})
    d = tmp_path / "p"
    shutil.copytree(SHIPPED_DIR / "reclaimer-testbed", d)
    meta = json.loads((d / "metadata.json").read_text())
    meta["config"][field] = 0
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"metadata.json: missing or malformed field .*{field} must be") as e:
        ReclaimerPolicy.load(d)
    assert "\n" not in str(e.value)
    assert sim_config(**{field: 1}).to_json()[field] == 1      # one layer is still a network


# --- the experiment: a run of no method is one line, not a traceback after writing an empty summary --
def test_an_experiment_of_only_the_no_ceiling_method_on_a_policy_without_one_is_refused_in_one_line(tmp_path):
    """`samm experiment reclaimer --apps testbed --methods reclaimer-no-ceiling`: the testbed's policy
    has no ceiling, so no method ran; the run wrote a summary.json of nothing and then failed drawing
    its figures with a bare StopIteration."""
    from agents.microservice_cores.experiment import run

    with pytest.raises(ValueError, match=r"^testbed: its Reclaimer policy has no headroom ceiling") as e:
        run(tmp_path / "out", apps=["testbed"], seeds=[1], methods=["reclaimer-no-ceiling"], workers=1,
            progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out" / "summary.json").exists()


# ----------------------------------------------------------------------------- the warm-up's last second
class _Recording:
    """A controller with a memory of use: what it observed and what it acted on, in order."""
    name = "recording"

    def __init__(self, topo):
        self.topo, self.seen = topo, []

    def reset(self, limits):
        self.seen = []

    def observe(self, m):
        self.seen.append(("observe", m.per_service.tobytes()))

    def act(self, m):
        self.seen.append(("act", m.per_service.tobytes()))
        return self.topo.caps.copy()


def test_each_warm_up_second_is_seen_once_the_last_by_the_first_decision_alone():
    """The warm-up's last second was observed and then acted on: it stood twice in the policy's
    frames, the VPA window and Sinan's history (training and the live loop see each second once)."""
    from agents.microservice_cores.episode import run_episodes

    chain = load_topology("chain3")
    ctls = []

    def make(i):
        ctls.append(_Recording(chain))
        return ctls[-1]

    run_episodes(chain, make, 60, [1, 2], steps=2, warmup=5)
    for c in ctls:
        assert [kind for kind, _ in c.seen] == ["observe"] * 4 + ["act"] * 2
        assert len({rows for _, rows in c.seen}) == 6          # six different seconds
