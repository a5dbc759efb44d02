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
from simulator.behaviour import BehaviourParams, drift_share
from simulator.config import AttackKind, Behaviour, ChannelModel, SimConfig
from simulator.hashing import hash_uniform

# hash streams
_LOAD, _RADIO, _TARGET, _ATTACKERS = 1, 2, 3, 5
NEVER = np.iinfo(np.int64).max  # a slot no run reaches: an id not yet joined, or not left
LONG_AGO = -(2**40)  # a slot before any run: a fake recoverer yet to drop its lie

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
        pa.field("attack", pa.string(), nullable=False, metadata={"doc": "the attack this id's device carries "
                                                                          "out ('' for an honest device)"}),
        pa.field("physical", pa.string(), nullable=False, metadata={"doc": "the first id of the device behind "
                                                                            "this id (itself but for an attacker's "
                                                                            "further ids)"}),
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
    """Devices with positions, CPUs, willingness and a hidden behaviour over slots.

    A device answers under one id (a row of every per-device array) or, when it attacks (``config.attack``),
    under several: a Sybil device's ids are all present at once, a whitewasher's one after another (it leaves
    an id and rejoins under the next when the generator calls :meth:`rejoin`). ``physical`` maps each row to its
    device (rows ``0 .. devices - 1`` are the devices' first ids, further ids follow), and everything hidden
    (position, CPU, load, radio, behaviour) belongs to the device, shared by its ids. Without an attack each
    device has one id and rows are devices.
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        n = config.devices
        rng = np.random.default_rng([config.seed, 0])
        cpu_hz = rng.choice(np.asarray(config.cpu_choices_hz, dtype=np.float64), size=n)
        x_m, y_m = rng.uniform(0.0, config.area_m, size=(2, n))
        willingness = rng.uniform(*config.willingness_range, size=n)
        kinds = np.array(sorted(config.mix), dtype=np.int8)
        shares = np.array([config.mix[Behaviour(k)] for k in kinds], dtype=np.float64)
        behaviour = rng.choice(kinds, size=n, p=shares / shares.sum())
        attack = config.attack
        attackers = attacking_devices(config)
        if attack is not None:
            behaviour[attackers] = attack.behaviour
        claimed = cpu_hz.copy()  # the CPU each device reports
        if attack is not None and attack.kind is AttackKind.OVERCLAIMING:
            runs_on = attack.overclaimer_cpu_hz or min(config.cpu_choices_hz)
            cpu_hz[attackers], claimed[attackers] = runs_on, max(config.cpu_choices_hz)
        params = BehaviourParams.draw(rng, behaviour, config.slots)  # draws the same whatever the kinds
        self.physical = np.concatenate([np.arange(n), np.repeat(attackers, attack.ids - 1 if attack else 0)])
        self.ids = device_ids(len(self.physical))
        self.cpu_hz, self.x_m, self.y_m = cpu_hz[self.physical], x_m[self.physical], y_m[self.physical]
        self.claimed_cpu_hz = claimed[self.physical]
        if attack is not None and attack.id_spread_m > 0:  # further ids stand apart, drawn from a stream of their
            further = slice(n, None)  # own: everything else is drawn as without the spread
            spread = np.random.default_rng([config.seed, 7]).uniform(-1.0, 1.0, size=(2, self.size - n))
            self.x_m[further] = np.clip(self.x_m[further] + attack.id_spread_m * spread[0], 0.0, config.area_m)
            self.y_m[further] = np.clip(self.y_m[further] + attack.id_spread_m * spread[1], 0.0, config.area_m)
        self.tx_w = np.full(self.size, config.tx_w)
        self.rx_w = np.full(self.size, config.rx_w)
        self.willingness = willingness[self.physical]
        self.behaviour = behaviour[self.physical]
        self.params = params.take(self.physical)
        self.attack_label = np.where(np.isin(self.physical, attackers), attack.kind.value if attack else "", "")
        self.joined = np.zeros(self.size, dtype=np.int64)  # the slot each id joins, and the slot it leaves
        self.left = np.full(self.size, NEVER, dtype=np.int64)
        self.active = np.arange(n)  # the id (row) each device answers under now, as an owner
        self.next_id = np.full(self.size, -1, dtype=np.int64)  # a whitewasher's next id
        self.dropped = np.full(self.size, LONG_AGO, dtype=np.int64)  # the slot a fake recoverer last dropped its lie
        if attack is not None and attack.kind is AttackKind.WHITEWASHING:
            aliases = np.arange(n, self.size)
            self.joined[aliases] = NEVER
            chain = np.concatenate([attackers[:, None], aliases.reshape(len(attackers), -1)], axis=1)
            self.next_id[chain[:, :-1]] = chain[:, 1:]
        if config.churn > 0:  # honest devices that join later, drawn from a stream of their own
            late_rng = np.random.default_rng([config.seed, 8])
            honest = np.setdiff1d(np.arange(n), attackers)
            late = late_rng.choice(honest, size=round(config.churn * len(honest)), replace=False)
            self.joined[late] = late_rng.integers(1, max(2, int(0.9 * config.slots)), size=len(late))
        if config.leave > 0:  # honest devices that leave early (never a late joiner), from a stream of their own
            leave_rng = np.random.default_rng([config.seed, 9])
            staying = np.setdiff1d(np.arange(n), np.concatenate([attackers, np.flatnonzero(self.joined[:n] > 0)]))
            leaving = leave_rng.choice(staying, size=min(round(config.leave * (n - len(attackers))), len(staying)),
                                       replace=False)
            self.left[leaving] = leave_rng.integers(max(1, config.slots // 10), max(2, config.slots), size=len(leaving))
        self.channel = make_channel(config)

    @property
    def size(self) -> int:
        """Rows: ids, one per device and one per further id of an attacker."""
        return len(self.physical)

    @property
    def attacker(self) -> np.ndarray:
        """(rows,) whether each id belongs to an attacking device."""
        return self.attack_label != ""

    @property
    def late_joiners(self) -> np.ndarray:
        """(rows,) honest ids that joined after the start (``config.churn``): the honest newcomers."""
        return (self.joined > 0) & (self.joined != NEVER) & ~self.attacker

    def present_owners(self, owners: np.ndarray, slot: int, key: list[int]) -> np.ndarray:
        """``owners`` (ids) with each one yet to join in ``slot`` (``config.churn``) or gone (``config.leave``) replaced
        by a present device's current id, drawn from the stream ``key`` (nothing is drawn where every owner is
        present)."""
        pending = ~self.present(owners, slot)
        if not pending.any():
            return owners
        present = self.active[self.present(self.active, slot)]
        return np.where(pending, np.random.default_rng(key).choice(present, size=len(owners)), owners)

    def present(self, rows: np.ndarray, slot: int) -> np.ndarray:
        """Whether each id is in the system during ``slot`` (a whitewasher's ids only between join and leave)."""
        return (self.joined[rows] <= slot) & (slot < self.left[rows])

    def rejoin(self, rows: np.ndarray, slot: int, back: int) -> None:
        """Whitewashers' ids ``rows`` leave at ``slot`` and their devices rejoin under their next ids at slot ``back``
        (>= ``slot``; away, and owning no tasks, in between); a device out of ids keeps its last."""
        rows = rows[self.next_id[rows] >= 0]
        following = self.next_id[rows]
        self.left[rows] = slot
        self.joined[following] = back
        self.active[self.physical[rows]] = following

    def devices_table(self) -> pa.Table:
        labels = np.array([b.label for b in Behaviour])
        columns = [self.ids, self.cpu_hz, self.x_m, self.y_m, self.tx_w, self.rx_w, self.willingness,
                   labels[self.behaviour], self.params.high, self.params.low, self.attack_label,
                   self.ids.take(self.physical)]
        return pa.Table.from_arrays([pa.array(c) for c in columns], schema=DEVICES_SCHEMA)

    def load(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """Background CPU load u in [load_mean - swing, load_mean + swing]: the usage cycle plus noise; with
        telemetry, plus the drift of a degrading (or recovering) device's change (:meth:`drift`) and a fake recoverer's
        excess where it runs it (``Attack.fake_burn``)."""
        c = self.config
        cycle = self.params.take(devices).cycle(slot)
        noise = 2 * hash_uniform(c.seed, _LOAD, self.physical[devices], slot) - 1
        burnt = self.fake_excess(devices, slot) if c.fake_burn else 0.0
        return c.load_mean + c.load_swing * (0.6 * cycle + 0.4 * noise) + self.drift(devices, slot) + burnt

    def fake_excess(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """A fake recoverer's excess load in ``slot`` (``SimConfig.fake_load`` at its busiest, nothing in the slot it
        drops it, creeping back over ``Attack.fake_creep`` slots), else 0."""
        excess = self.config.fake_load
        if not excess:
            return np.zeros(len(devices))
        creep = np.clip((slot - self.dropped[devices]) / self.config.attack.fake_creep, 0.0, 1.0)
        return np.where(self.attacker[devices], excess * creep, 0.0)

    def load_lie(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """What each device's status in ``slot`` adds to its load: a fake recoverer's excess where it says rather
        than runs it (:meth:`fake_excess`), else 0."""
        return np.zeros(len(devices)) if self.config.fake_burn else self.fake_excess(devices, slot)

    def fakes_recovery(self, rows: np.ndarray, slot: int) -> np.ndarray:
        """Of fake recoverers' ids ``rows``, those whose lie has crept back to its busiest by ``slot`` (ready to drop
        it again)."""
        return self.attacker[rows] & (slot - self.dropped[rows] >= self.config.attack.fake_creep)

    def drift(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """The load a changing device's behaviour adds (telemetry only): a degrading device takes on
        ``load_drift`` as it degrades, a recovering one sheds it as it recovers."""
        if not self.config.telemetry:
            return np.zeros(len(devices))
        params = self.params.take(devices)
        return self.config.load_drift * drift_share(params.kind, params.ramp(slot))

    def radio_up(self, devices: np.ndarray, slot: int) -> np.ndarray:
        return hash_uniform(self.config.seed, _RADIO, self.physical[devices], slot) >= self.config.radio_down

    def available(self, devices: np.ndarray, slot: int) -> np.ndarray:
        """Radio up and not overloaded: the device can take a task this slot (if willing)."""
        return self.radio_up(devices, slot) & (self.load(devices, slot) < self.config.overload)

    def targeted(self, collabs: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """Whether a selective collaborator misbehaves toward each owner (hidden, fixed per pair)."""
        return (hash_uniform(self.config.seed, _TARGET, self.physical[collabs], self.physical[owners])
                < self.config.selective_targets)

    def behaviour_reliability(self, collabs: np.ndarray, owners: np.ndarray, slot: int,
                              size_bits: np.ndarray | None = None) -> np.ndarray:
        """Hidden probability that a collaborator computes honestly for an owner in a slot; ``size_bits``: the
        tasks' sizes (None: the nominal size), which an opportunistic attacker's honesty depends on."""
        params = self.params.take(collabs)
        reliability = params.reliability(slot, self.targeted(collabs, owners), tied=self.config.telemetry)
        attack = self.config.attack
        if attack is not None and attack.kind is AttackKind.OPPORTUNISTIC and size_bits is not None:
            large = np.asarray(size_bits) > self.config.task_size_bits
            reliability = np.where(self.attacker[collabs] & large, params.low, reliability)
        return reliability

    def misbehaving(self, collabs: np.ndarray, owners: np.ndarray, slot: int,
                    size_bits: np.ndarray | None = None) -> np.ndarray:
        """Whether each collaborator is an attacker misbehaving toward the owner in ``slot`` (on a task of
        ``size_bits``): its reliability is below its reliable level (an on-off attacker's off stretch, a selective
        one's targets, an opportunistic one's large tasks, always for an unreliable Sybil, whitewasher or
        colluder, and always for an overclaimer, whose every status lies)."""
        if self.config.attack is not None and self.config.attack.kind is AttackKind.OVERCLAIMING:
            return self.attacker[collabs]
        reliability = self.behaviour_reliability(collabs, owners, slot, size_bits)
        return self.attacker[collabs] & (reliability < self.params.high[collabs])

    def distance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.hypot(self.x_m[a] - self.x_m[b], self.y_m[a] - self.y_m[b])

    @property
    def overclaimed(self) -> bool:
        """Whether any id's statuses claim another CPU than it has (overclaimers)."""
        return bool((self.claimed_cpu_hz != self.cpu_hz).any())

    def expected(self, owners: np.ndarray, collabs: np.ndarray, slot: int, load: np.ndarray | None = None,
                 size_bits: np.ndarray | None = None, cpu_hz: np.ndarray | None = None) -> Expected:
        """Outcome probabilities and costs of offloading a task, pairwise; ``load``: the collaborators' background
        load to assume (default: their hidden load in the slot); ``size_bits``: each task's size (default: the
        configured size); ``cpu_hz``: each collaborator's CPU to assume (default: the one it has; its statuses'
        claims, :attr:`claimed_cpu_hz`, give what a scheduler that believes them expects)."""
        c, params = self.config, self.config.system
        distance = self.distance(owners, collabs)
        p_tr = self.channel.p_tr(distance, self.tx_w[owners])
        load = self.load(collabs, slot) if load is None else load
        effective_hz = (self.cpu_hz[collabs] if cpu_hz is None else cpu_hz) * (1.0 - load)
        size, density = c.task_size_bits if size_bits is None else size_bits, c.density_cycles_per_bit
        offload = physics.offload(size, density, distance, self.tx_w[owners], self.rx_w[collabs],
                                  effective_hz, params)
        local = physics.computation(size, density, self.cpu_hz[owners], params)
        on_time = on_time_factor(offload.time_s, local.time_s, c.deadline_factor)
        p_com = self.behaviour_reliability(collabs, owners, slot, size_bits) * on_time
        return Expected(p_tr, p_com, offload, local)


def on_time_factor(offload_s: np.ndarray, local_s: np.ndarray, deadline_factor: float) -> np.ndarray:
    """exp(-lateness / deadline), the deadline ``deadline_factor`` times the owner's local execution time: the
    share of an honest computation's success that survives its offload time."""
    deadline = deadline_factor * local_s
    return np.exp(-np.maximum(0.0, offload_s - deadline) / deadline)


def attacking_devices(config: SimConfig) -> np.ndarray:
    """The devices (sorted) that carry out ``config.attack``: ``round(share * devices)`` of them, drawn from a stream of
    their own so that the rest of the world is drawn as without an attack."""
    if config.attack is None:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng([config.seed, _ATTACKERS])
    count = round(config.attack.share * config.devices)
    return np.sort(rng.choice(config.devices, size=count, replace=False)).astype(np.int64)
