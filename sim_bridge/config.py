"""The simulation's configuration: every constant of the training environment in one validated
object. Unknown keys are rejected (the prior implementation silently dropped them at three
layers, so the intended SLA penalty never reached its simulator)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

ActionMode = Literal["paper", "per-type"]

# The JVM's own limits (Config.java), named by `SimConfig.simulator_problem` when a config is
# loaded, not when the first batch is created (on Ray: in a traceback of every worker).
JAVA_INT_MAX = 2**31 - 1
MAX_VM_SLOTS = 100_000  # every VM slot is a simulated host and 5 doubles of every snapshot
MAX_HOST_PES = 1 << 22  # VM slots x largest cores: the PEs of one env's hosts together


class StrictModel(BaseModel):
    # allow_inf_nan=False: an infinite price or penalty made every reward NaN (inf x 0 s), and an
    # infinite time reached the JVM as the JSON-invalid token `Infinity`
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class VmType(StrictModel):
    """One managed VM group (an AWS Auto Scaling Group in production)."""

    name: str = Field(min_length=1)
    cores: int = Field(ge=1)
    ram_gb: float = Field(gt=0)
    price_per_hour: float = Field(ge=0)
    min: int = Field(ge=0)
    max: int = Field(ge=0)
    initial: int = Field(ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> "VmType":
        if not (self.min <= self.initial <= self.max):
            raise ValueError(
                f"VM type {self.name!r}: need min <= initial <= max, got "
                f"{self.min} <= {self.initial} <= {self.max}"
            )
        if self.max == 0:
            raise ValueError(f"VM type {self.name!r}: max must be at least 1")
        return self


# The paper's AWS set-up: three ASGs of m5a.large / xlarge / 2xlarge (S/M/L), at most 10 each,
# one VM of each type at the start; one small VM is always kept.
PAPER_VM_TYPES = (
    VmType(name="S", cores=2, ram_gb=8, price_per_hour=0.2, min=1, max=10, initial=1),
    VmType(name="M", cores=4, ram_gb=16, price_per_hour=0.4, min=0, max=10, initial=1),
    VmType(name="L", cores=8, ram_gb=32, price_per_hour=0.8, min=0, max=10, initial=1),
)


class SimConfig(StrictModel):
    """Configuration of one simulated environment (shared by every env of a batch)."""

    vm_types: tuple[VmType, ...] = PAPER_VM_TYPES
    # Host cores of the paper's workload run at 4400 MIPS (the old default of 10000 ran jobs
    # 2.27x too fast).
    host_mips: float = Field(default=4400.0, gt=0)
    # One step = one monitoring interval of workload time (SAMM's Graphite snapshots are 1 min).
    step_seconds: float = Field(default=60.0, gt=0)
    # Boot delay of a new VM, uniform, seeded (the paper cites a cloud start-up study).
    boot_delay_min_s: float = Field(default=45.0, ge=0)
    boot_delay_max_s: float = Field(default=97.0, ge=0)
    # Seconds after an applied scaling action during which further actions are not applied.
    # 0 = the paper's simulator; the `realistic` preset uses an ASG-like 300 s.
    cooldown_s: float = Field(default=0.0, ge=0)
    # Seconds after boot during which a VM's CPU/RAM are left out of the metrics (ASG warm-up).
    warmup_s: float = Field(default=0.0, ge=0)
    # SLA penalty in $ per waiting job-second: 1e-5 $/s = $0.036 per job-hour (the paper's
    # "per second" wording is misleading; this is the value its code used).
    penalty_per_job_second: float = Field(default=1e-5, ge=0)
    # Episode truncation (the prior implementation had none and relied on a sentinel job).
    max_steps: int = Field(default=5000, ge=1)
    action_mode: ActionMode = "paper"
    # Multi-core jobs run as one job on one VM, so a job may use at most this many cores;
    # larger trace jobs are capped when the workload is loaded (None = the largest VM type).
    max_job_cores: int | None = Field(default=None, ge=1)
    # Java threads stepping the envs of one batch in parallel (0 = one per CPU).
    threads: int = Field(default=0, ge=0, le=JAVA_INT_MAX)
    # The head-of-line liveness guard (samm/plan/liveness.py) on every decision: add a VM able
    # to host a queued job that no VM of the fleet can host; never remove the last such VM.
    liveness_guard: bool = True

    @model_validator(mode="after")
    def _check(self) -> "SimConfig":
        if not self.vm_types:
            raise ValueError("vm_types must name at least one VM type")
        names = [t.name for t in self.vm_types]
        if len(set(names)) != len(names):
            raise ValueError(f"vm_types names must be unique, got {names}")
        if self.boot_delay_min_s > self.boot_delay_max_s:
            raise ValueError("boot_delay_min_s must not exceed boot_delay_max_s")
        if self.max_job_cores is not None and self.max_job_cores > self.largest_cores:
            raise ValueError(
                f"max_job_cores={self.max_job_cores} exceeds the largest VM type "
                f"({self.largest_cores} cores): such a job could never run"
            )
        return self

    def simulator_problem(self) -> str | None:
        """Why the simulator (Config.java) would reject this config, in its words; None if it would not.
        Not a validator: the JVM's own checks stay reachable (and tested) through `SimBatch`."""
        if self.host_mips < 1:  # CloudSim Plus counts PE capacity in whole MIPS: no VM could be placed
            return f"host_mips must be >= 1, got {self.host_mips:g}"
        if self.vm_slots > MAX_VM_SLOTS:
            return f"vm_types: the sum of max (VM slots) must be <= {MAX_VM_SLOTS}, got {self.vm_slots}"
        if self.vm_slots * self.largest_cores > MAX_HOST_PES:
            return (f"vm_types: VM slots x largest cores must be <= {MAX_HOST_PES} simulated PEs, "
                    f"got {self.vm_slots} x {self.largest_cores}")
        return None

    # -- derived -----------------------------------------------------------------------------
    @property
    def n_types(self) -> int:
        return len(self.vm_types)

    @property
    def largest_cores(self) -> int:
        return max(t.cores for t in self.vm_types)

    @property
    def job_core_cap(self) -> int:
        return self.max_job_cores or self.largest_cores

    @property
    def vm_slots(self) -> int:
        return sum(t.max for t in self.vm_types)

    @property
    def max_fleet_cores(self) -> int:
        return sum(t.max * t.cores for t in self.vm_types)

    def java_json(self) -> str:
        """The subset of the config the Java gateway consumes (see docs/bridge-protocol.md)."""
        return json.dumps(
            {
                "vm_types": [t.model_dump() for t in self.vm_types],
                "host_mips": self.host_mips,
                "step_seconds": self.step_seconds,
                "boot_delay_min_s": self.boot_delay_min_s,
                "boot_delay_max_s": self.boot_delay_max_s,
                "cooldown_s": self.cooldown_s,
                "threads": self.threads,
            },
            sort_keys=True,
        )

    def config_hash(self) -> str:
        """Stable hash of everything that changes the environment's dynamics or reward."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_initial(self, counts: list[int] | tuple[int, ...]) -> "SimConfig":
        if len(counts) != self.n_types:
            raise ValueError(f"expected {self.n_types} initial counts, got {len(counts)}")
        # validated as given: `int(n)` made 1.7 one VM and 0.9 none, another fleet than asked for
        types = [VmType.model_validate({**t.model_dump(), "initial": n}) for t, n in zip(self.vm_types, counts)]
        return self.model_copy(update={"vm_types": tuple(types)})


PRESETS: dict[str, dict] = {
    # The paper's simulator: actions apply at once, no cool-down, no warm-up.
    "paper": {},
    # Like a real ASG: DefaultCooldown 300 s, and new instances' metrics ignored while warming.
    "realistic": {"cooldown_s": 300.0, "warmup_s": 120.0},
}


# A simulation config is a few hundred bytes; the bound keeps a wrong path (/dev/zero, a trace,
# a disk image) from being read into memory without end.
MAX_CONFIG_BYTES = 1 << 20


def _read_config_text(path: Path) -> str:
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a simulation config")
    return raw.decode("utf-8")


def load_sim_config(path: str | Path | None = None, preset: str = "paper", **overrides) -> SimConfig:
    """Preset, then a YAML/JSON file, then keyword overrides; unknown keys fail validation."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    data: dict = dict(PRESETS[preset])
    if path is not None:
        from .workloads.mix import _UniqueKeyLoader  # here: mix imports this module

        try:
            # a key given twice (two `cooldown_s:` lines) is an error, as in every other config of SAMM:
            # plain YAML kept the last one silently
            loaded = yaml.load(_read_config_text(Path(path)), Loader=_UniqueKeyLoader) or {}  # noqa: S506 (safe)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:  # neither is an OSError: name the file here
            raise ValueError(f"{path}: not a valid YAML/JSON file ({' '.join(str(exc).split())})") from None
        except RecursionError:  # PyYAML composes nested lists recursively: "[[[[..." thousands deep
            raise ValueError(f"{path}: nested too deeply to be a simulation config") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the simulation config must be a mapping")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    config = SimConfig.model_validate(data)
    problem = config.simulator_problem()
    if problem:
        raise ValueError(f"{path or 'simulation config'}: {problem}")
    return config
