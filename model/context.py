"""A pair's physical context: what the paper's system model (eqs. 2-9) says about offloading i -> j.

From the two devices' latest statuses and the owner's task profile: the distance d_ij, both CPUs,
and the offload cost (transmission at d_ij plus computation at the share of j's CPU its reported load
leaves free, the whole CPU where it reports none, as the simulator's devices compute) against running the
task at i. BM's pair head reads :meth:`PairPhysics.features`; the scorer reads the same costs for the value
of completion V. NaN wherever a status or the profile is unknown.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from model import physics
from model.config import SystemParams
from model.physics import Cost
from model.status import CPU, LOAD, RX, TX, X, Y, free_share

PHYSICS_COLUMNS = ("distance_m", "cpu_owner_hz", "cpu_collaborator_hz", "offload_over_local", "task_size_bits")


class PairPhysics(NamedTuple):
    distance_m: np.ndarray  # (P,)
    offload: Cost  # t_tot, E_tot of offloading the task i -> j
    local: Cost  # t, E of running it at i
    cpu_owner_hz: np.ndarray  # (P,)
    cpu_collaborator_hz: np.ndarray  # (P,)
    size_bits: np.ndarray  # (P,) the owner's task

    def features(self) -> np.ndarray:
        """(P, 5) float32 PHYSICS_COLUMNS: the head's raw physical input."""
        out = np.empty((len(self.distance_m), len(PHYSICS_COLUMNS)), np.float32)  # each column cast as it is written
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(self.offload.time_s, self.local.time_s, out=out[:, 3], casting="same_kind")
        for k, column in ((0, self.distance_m), (1, self.cpu_owner_hz), (2, self.cpu_collaborator_hz),
                          (4, self.size_bits)):
            out[:, k] = column
        return out

    def value(self, params: SystemParams) -> np.ndarray:
        """V of the task at j if it succeeds, in [0, 1]; 0 where anything is unknown."""
        with np.errstate(invalid="ignore", divide="ignore"):
            voc = physics.value_of_completion(self.offload, self.local, params)
        return np.clip(np.nan_to_num(voc, nan=0.0), 0.0, 1.0)


def pair_physics(status_i: np.ndarray, status_j: np.ndarray, profile: np.ndarray, params: SystemParams,
                 src: np.ndarray | None = None, dst: np.ndarray | None = None) -> PairPhysics:
    """status_i, status_j: (P, 9) STATUS_COLUMNS of owners and candidates; profile: (P, 2) task size (bit) and
    density (cycle/bit). With ``src`` and ``dst`` (P,), status_i and profile are per device (n, ...) read at src,
    status_j per device read at dst: a pair gathers only the columns the physics reads, and the local cost is
    computed once per device (the same numbers)."""
    def owner(values: np.ndarray) -> np.ndarray:
        return values if src is None else values[src]

    def candidate(column: int) -> np.ndarray:
        return status_j[:, column] if dst is None else status_j[dst, column]

    distance = np.hypot(owner(status_i[:, X]) - candidate(X), owner(status_i[:, Y]) - candidate(Y))
    size, density = profile[:, 0], profile[:, 1]
    cpu_j, load_j = candidate(CPU), candidate(LOAD)
    free_hz = cpu_j * free_share(load_j)
    with np.errstate(invalid="ignore", divide="ignore"):
        offload = physics.offload(owner(size), owner(density), distance, owner(status_i[:, TX]), candidate(RX),
                                  free_hz, params)
        local = physics.computation(size, density, status_i[:, CPU], params)
    return PairPhysics(distance, offload, Cost(*map(owner, local)), owner(status_i[:, CPU]), cpu_j, owner(size))
