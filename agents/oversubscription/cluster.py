"""The PM pool and its best-fit allocator: the transition f of the paper's Eq. 2.

Best fit is "the major allocation policy in industrial allocators" (§6.2, citing Protean): a VM
goes to the PM that has the fewest free cores left after taking it, among the PMs where its
reserved cores AND its memory and network fit (§4.1: "only PM with enough memory and network
resources can be selected"). Only CPU is oversubscribed: a VM reserves rate x requested cores but
its whole memory and network. Ties go to the lowest PM index, so allocation is deterministic.

The same class serves the simulator and the live admission path (`samm testbed oversub`).
"""
from __future__ import annotations

import numpy as np

NO_PM = -1

try:  # a compiled best-fit loop when numba is installed (setup.cfg requires it); NumPy otherwise
    from numba import njit
except ImportError:  # pragma: no cover - exercised only without numba
    njit = None


def _place_batch_py(free, cores, mem, net, out):
    """Best fit for a sequence of reservations, in order (the reference implementation)."""
    k = free.shape[1]
    for i in range(cores.shape[0]):
        best, best_left = -1, np.inf
        for pm in range(k):
            fc = free[0, pm]
            if fc >= cores[i] - 1e-9 and free[1, pm] >= mem[i] - 1e-9 and free[2, pm] >= net[i] - 1e-9:
                if fc < best_left:
                    best, best_left = pm, fc
        out[i] = best
        if best >= 0:
            free[0, best] -= cores[i]
            free[1, best] -= mem[i]
            free[2, best] -= net[i]
    return out


_place_batch = njit(cache=True, nogil=True)(_place_batch_py) if njit is not None else None


class Cluster:
    def __init__(self, n_pms: int, cores: float, mem: float, net: float):
        self.n_pms = int(n_pms)
        self.capacity = np.array([cores, mem, net], dtype=np.float64)
        # [3, K]: each resource's free amounts contiguous (best fit scans one row per request)
        self._free = np.tile(self.capacity[:, None], (1, self.n_pms))

    @property
    def free(self) -> np.ndarray:
        """[K, 3] view (cores, mem, net) of what is free on each PM; writes go through."""
        return self._free.T

    @classmethod
    def for_setting(cls, setting) -> "Cluster":
        return cls(setting.n_pms, setting.pm_cores, setting.pm_mem_gb, setting.pm_net_gbps)

    def reset(self) -> None:
        self._free[:] = self.capacity[:, None]

    def best_fit(self, cores: float, mem: float, net: float) -> int:
        """The PM best fit picks for this reservation, or NO_PM when none can take it."""
        free_cores, free_mem, free_net = self._free
        # fewest free cores among the PMs with room = fewest left after placing
        left = np.where(free_cores >= cores - 1e-9, free_cores, np.inf)
        pm = int(left.argmin())
        if left[pm] == np.inf:
            return NO_PM
        if free_mem[pm] >= mem - 1e-9 and free_net[pm] >= net - 1e-9:
            return pm
        # the tightest PM lacks memory or network: the full test (rare)
        fits = (free_cores >= cores - 1e-9) & (free_mem >= mem - 1e-9) & (free_net >= net - 1e-9)
        left = np.where(fits, free_cores, np.inf)
        pm = int(left.argmin())
        return pm if fits[pm] else NO_PM

    def allocate(self, cores: float, mem: float, net: float) -> int:
        pm = self.best_fit(cores, mem, net)
        if pm != NO_PM:
            f = self._free
            f[0, pm] -= cores
            f[1, pm] -= mem
            f[2, pm] -= net
        return pm

    def allocate_many(self, cores: np.ndarray, mem: np.ndarray, net: np.ndarray) -> np.ndarray:
        """Best fit for several reservations in order; the PM of each (NO_PM = rejected). Same
        result as calling `allocate` in a loop (a test checks it), compiled when numba is present."""
        cores = np.ascontiguousarray(cores, dtype=np.float64)
        mem = np.ascontiguousarray(mem, dtype=np.float64)
        net = np.ascontiguousarray(net, dtype=np.float64)
        out = np.empty(len(cores), dtype=np.int64)
        if _place_batch is not None:
            return _place_batch(self._free, cores, mem, net, out)
        for i in range(len(cores)):
            out[i] = self.allocate(cores[i], mem[i], net[i])
        return out

    def release(self, pm: int, cores: float, mem: float, net: float) -> None:
        f = self._free
        f[:, pm] = np.minimum(f[:, pm] + (cores, mem, net), self.capacity)

    def release_many(self, pms: np.ndarray, reserved: np.ndarray) -> None:
        """Free the [n, 3] reservations of VMs on `pms` in one pass."""
        if len(pms):
            np.add.at(self._free.T, pms, reserved)
            np.minimum(self._free, self.capacity[:, None], out=self._free)

    def used_pms(self) -> int:
        return int(np.count_nonzero(self._free[0] < self.capacity[0] - 1e-9))

    def reserved_cores(self) -> float:
        return float(self.n_pms * self.capacity[0] - self._free[0].sum())


def place_vm(cluster: "Cluster", workload, v: int, rate: float, pm_of: np.ndarray, assigned: np.ndarray) -> int:
    """Best fit for VM row `v` of `workload` at `rate`: reserve rate x its cores and all its memory
    and network, record its PM and reservation in `pm_of` / `assigned`; NO_PM when none fits.
    The simulator and the live admission executor both place through here."""
    cores = float(workload.cores[v]) * rate
    pm = cluster.allocate(cores, float(workload.mem[v]), float(workload.net[v]))
    if pm != NO_PM:
        pm_of[v] = pm
        assigned[v] = cores
    return pm


def pm_usage(pms: np.ndarray, used_cores: np.ndarray, n_pms: int) -> np.ndarray:
    """Cores actually used on each PM: the sum of its VMs' use (a VM may use up to its requested
    cores, beyond its reservation, as oversubscription allows)."""
    return np.bincount(pms, weights=used_cores, minlength=n_pms)[:n_pms]


#: relative slack on the hot threshold: usage rates are float32, so a PM used exactly beta * B
#: (one 64-core VM at 0.6 on a 64-core PM) sums to 38.40000152 and would count as hot
HOT_TOLERANCE = 1e-6


def hot(pm_used: np.ndarray, pm_cores: float, beta: float) -> np.ndarray:
    """A PM is hot when its real CPU use exceeds beta * B (§6.2; beta = 0.6)."""
    return pm_used > beta * pm_cores * (1 + HOT_TOLERANCE)
