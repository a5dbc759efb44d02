"""The simulated world: devices, their hidden behaviour, and the expected outcome of any offload.

Everything that varies over slots is a function of (seed, device, slot), drawn
by :func:`hash_uniform`, so :meth:`World.expected` answers for any pair and
slot in any order: the generator uses it to draw outcomes, and an oracle uses
it to know the truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from model import physics
from model.config import TrustWeights
from model.physics import Cost
from model.trust import collaboration_weight
from simulator.channel import Channel, Ns3Channel, RayleighChannel
from simulator.behaviour import BehaviourParams
from simulator.config import Behaviour, ChannelModel, SimConfig
from simulator.hashing import hash_uniform

# hash streams
_LOAD, _RADIO, _TARGET = 1, 2, 3

DEVICES_SCHEMA = pa.schema(
    [
        pa.field("device", pa.string(), nullable=False),
        pa.field("cpu_hz", pa.float64(), nullable=False),
        pa.field("x_m", pa.float64(), nullable=False),
        pa.field("y_m", pa.float64(), nullable=False),
        pa.field("tx_w", pa.float64(), nullable=False),
        pa.field("rx_w", pa.float64(), nullable=False),
        pa.field("willingness", pa.float64(), nullable=False),
        pa.field("behaviour", pa.string(), nullable=False),
        pa.field("high", pa.float64(), nullable=False),
        pa.field("low", pa.float64(), nullable=False),
    ],
    metadata={"doc": "simulated devices and their hidden behaviour parameters"},
)


def make_channel(config: SimConfig) -> Channel:
    if config.channel is ChannelModel.NS3:
        return Ns3Channel(config.system, config.outage_snr_db, config.tx_w, max_distance_m=config.area_m * 2**0.5)
    return RayleighChannel(config.system, config.outage_snr_db)


def device_ids(count: int) -> pa.Array:
    width = max(6, len(str(count - 1)))
    return pa.array([f"dev-{index:0{width}d}" for index in range(count)], pa.string())


@dataclass(frozen=True)
class Expected:
    """What an offload from owners[i] to collabs[i] in a slot is expected to give."""

    p_tr: np.ndarray  # P(transmission succeeds): Rayleigh outage at the mean SNR
    p_com_given_tr: np.ndarray  # P(computation succeeds | transmitted): behaviour x deadline
    offload: Cost  # t_tot, E_tot at the collaborator's effective CPU
    local: Cost  # t, E of running the task at the owner

    def reliability(self, weights: TrustWeights) -> np.ndarray:
        """E[a1 * tr + a2 * com], with com only possible after tr: the truth behind T_col."""
        return collaboration_weight(self.p_tr, self.p_tr * self.p_com_given_tr, weights)


class World:
    """Devices with positions, CPUs, willingness and a hidden behaviour over slots."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        n = config.devices
        rng = np.random.default_rng([config.seed, 0])
        self.ids = device_ids(n)
        self.cpu_hz = rng.choice(np.asarray(config.cpu_choices_hz, dtype=np.float64), size=n)
        self.x_m, self.y_m = rng.uniform(0.0, config.area_m, size=(2, n))
        self.tx_w = np.full(n, config.tx_w)
        self.rx_w = np.full(n, config.rx_w)
        self.willingness = rng.uniform(*config.willingness_range, size=n)
        kinds = np.array(sorted(config.mix), dtype=np.int8)
        shares = np.array([config.mix[Behaviour(k)] for k in kinds], dtype=np.float64)
        self.behaviour = rng.choice(kinds, size=n, p=shares / shares.sum())
        self.params = BehaviourParams.draw(rng, self.behaviour, config.slots)
        self.channel = make_channel(config)

    def devices_table(self) -> pa.Table:
        labels = np.array([b.label for b in Behaviour])
        columns = [self.ids, self.cpu_hz, self.x_m, self.y_m, self.tx_w, self.rx_w, self.willingness,
                   labels[self.behaviour], self.params.high, self.params.low]
        return pa.Table.from_arrays([pa.array(c) for c in columns], schema=DEVICES_SCHEMA)

    def load(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """Background CPU load u in [load_mean - swing, load_mean + swing]: the usage cycle plus noise; with
        telemetry, plus the drift of a degrading (or recovering) device's change (:meth:`drift`)."""
        c = self.config
        cycle = self.params.take(devices).cycle(slot)
        noise = 2 * hash_uniform(c.seed, _LOAD, devices, slot) - 1
        return c.load_mean + c.load_swing * (0.6 * cycle + 0.4 * noise) + self.drift(devices, slot)

    def drift(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """The load a changing device's behaviour adds (telemetry only): a degrading device takes on
        ``load_drift`` as it degrades, a recovering one sheds it as it recovers."""
        if not self.config.telemetry:
            return np.zeros(len(devices))
        params = self.params.take(devices)
        ramp = params.ramp(slot)
        share = np.select([params.kind == Behaviour.DEGRADING, params.kind == Behaviour.RECOVERING], [ramp, 1 - ramp],
                          0.0)
        return self.config.load_drift * share

    def radio_up(self, devices: np.ndarray, slot: int) -> np.ndarray:
        return hash_uniform(self.config.seed, _RADIO, devices, slot) >= self.config.radio_down

    def available(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """Radio up and not overloaded: the device can take a task this slot (if willing)."""
        return self.radio_up(devices, slot) & (self.load(devices, slot) < self.config.overload)

    def targeted(self, collabs: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """Whether a selective collaborator misbehaves toward each owner (hidden, fixed per pair)."""
        return hash_uniform(self.config.seed, _TARGET, collabs, owners) < self.config.selective_targets

    def behaviour_reliability(self, collabs: np.ndarray, owners: np.ndarray, slot: int) -> np.ndarray:
        """Hidden probability that a collaborator computes honestly for an owner in a slot."""
        return self.params.take(collabs).reliability(slot, self.targeted(collabs, owners), tied=self.config.telemetry)

    def distance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.hypot(self.x_m[a] - self.x_m[b], self.y_m[a] - self.y_m[b])

    def expected(self, owners: np.ndarray, collabs: np.ndarray, slot: int, load: np.ndarray | None = None
                 ) -> Expected:
        """Outcome probabilities and costs of offloading the configured task, pairwise; ``load``: the
        collaborators' background load to assume (default: their hidden load in the slot)."""
        c, params = self.config, self.config.system
        distance = self.distance(owners, collabs)
        p_tr = self.channel.p_tr(distance, self.tx_w[owners])
        load = self.load(collabs, slot) if load is None else load
        effective_hz = self.cpu_hz[collabs] * (1.0 - load)
        size, density = c.task_size_bits, c.density_cycles_per_bit
        offload = physics.offload(size, density, distance, self.tx_w[owners], self.rx_w[collabs],
                                  effective_hz, params)
        local = physics.computation(size, density, self.cpu_hz[owners], params)
        on_time = on_time_factor(offload.time_s, local.time_s, c.deadline_factor)
        p_com = self.behaviour_reliability(collabs, owners, slot) * on_time
        return Expected(p_tr, p_com, offload, local)


def on_time_factor(offload_s: np.ndarray, local_s: np.ndarray, deadline_factor: float) -> np.ndarray:
    """exp(-lateness / deadline), the deadline ``deadline_factor`` times the owner's local execution time: the
    share of an honest computation's success that survives its offload time."""
    deadline = deadline_factor * local_s
    return np.exp(-np.maximum(0.0, offload_s - deadline) / deadline)
