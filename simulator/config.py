"""The simulator's settings; defaults are the paper's setting."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from model.config import SlotClock, SystemParams, TrustWeights


class Behaviour(enum.IntEnum):
    """Hidden long-term behaviour of a collaborator's computation reliability."""

    STABLE_RELIABLE = 0
    STABLE_UNRELIABLE = 1
    DEGRADING = 2  # reliable, then declines to unreliable
    RECOVERING = 3  # unreliable, then improves to reliable
    INTERMITTENT = 4  # on-off attacker: good stretches to earn trust, then bad ones
    PERIODIC = 5  # reliability follows a cycle
    SELECTIVE = 6  # unreliable only toward a subset of owners

    @property
    def label(self) -> str:
        return self.name.lower()


DEFAULT_MIX = {
    Behaviour.STABLE_RELIABLE: 0.4,
    Behaviour.STABLE_UNRELIABLE: 0.1,
    Behaviour.DEGRADING: 0.1,
    Behaviour.RECOVERING: 0.1,
    Behaviour.INTERMITTENT: 0.1,
    Behaviour.PERIODIC: 0.1,
    Behaviour.SELECTIVE: 0.1,
}


class AttackKind(str, enum.Enum):
    """A manipulation the attacking devices of a run carry out (``--attack KIND=SHARE``)."""

    ON_OFF = "on-off"  # good stretches to earn trust, then bad ones (the intermittent behaviour)
    SELECTIVE = "selective"  # bad only toward a subset of owners
    OPPORTUNISTIC = "opportunistic"  # good on small (low-value) tasks, bad on large (valuable) ones
    WHITEWASHING = "whitewashing"  # unreliable; rejoins under a new id once its record under the old one is poor
    SYBIL = "sybil"  # one unreliable device behind several ids
    BALLOT_STUFFING = "ballot-stuffing"  # unreliable colluders that offload to each other and report success
    BAD_MOUTHING = "bad-mouthing"  # unreliable colluders that report failure for the honest devices they offload to
    OVERCLAIMING = "overclaiming"  # slow devices whose statuses claim the fastest CPU, so their tasks run late
    FAKE_RECOVERY = "fake-recovery"  # unreliable devices whose reported load drops, as a recovering device's does,
    #                                  whenever their record since the last drop is poor (needs telemetry)

    @property
    def false_reports(self) -> bool:
        """Whether the attack lies in the outcomes its devices report as owners (it needs owner-reported outcomes)."""
        return self in (AttackKind.BALLOT_STUFFING, AttackKind.BAD_MOUTHING)


@dataclass(frozen=True)
class Attack:
    """``share`` of the devices (drawn at random) carry out ``kind``; the rest follow the mix.

    ``sybil_ids``: ids each Sybil device answers under (all present throughout). ``whitewash_ids``: the most ids a
    whitewasher goes through; it leaves its id (and rejoins under the next) at the end of a slot in which its
    mean observed T_col under that id, over at least ``whitewash_min_tasks`` tasks, is below ``whitewash_below``
    (the top of the default task thresholds: the id no longer qualifies for demanding tasks). An opportunistic
    device is reliable on tasks up to the nominal size (``SimConfig.task_size_bits``, the median of the sizes) and
    unreliable on larger ones. Ballot-stuffers and bad-mouthers are a colluding group of unreliable devices that lie
    in the outcomes they report as owners (``SimConfig.owner_reports``): ballot-stuffers offload to one another
    whenever a fellow colluder is in range and report every such task a success; bad-mouthers offload as everyone
    does and report the computation of every task an honest device ran for them as failed. ``id_spread_m``: a
    device's further ids (a Sybil's, a whitewasher's) stand and report up to this many metres from it in x and y
    (uniform), as an attacker that spreads its ids' positions to look like several devices would.
    ``whitewash_from``: the slot from which whitewashers leave their ids (before it, poor devices that keep theirs:
    a wave of whitewashing that starts after a model was trained). ``rejoin_after``: the slots from a whitewasher's
    leaving to its next id's first (1: the next slot; more: it stays away, tasks forgone, for its move to look like
    an honest newcomer's). An overclaimer runs on the slowest of
    ``SimConfig.cpu_choices_hz`` (or on ``overclaimer_cpu_hz``: a milder lie) and reports the fastest in every status
    (a claim inside the range a validator accepts): it computes honestly, but a task sized for the CPU it claims runs
    late, and a scheduler that believes the claim expects it to finish in a fraction of the time. A fake recoverer
    lies in the load its statuses report (``SimConfig.telemetry``): it reports its load plus ``fake_load`` (None:
    ``SimConfig.load_drift``, what a recovering device sheds), a busy device's load, and at the end of a slot in which
    its record since its last drop is poor (judged as a whitewasher's: ``whitewash_min_tasks``,
    ``whitewash_below``; from ``whitewash_from`` on) it drops the excess at once, the step a recovering device's load
    takes, then creeps back over ``fake_creep`` slots (too slowly to look like a change) to drop again. It computes as
    unreliably throughout; ``fake_load`` 0 is the control, the same devices telling the truth. ``fake_burn``: the
    excess is not said but run (a busy loop): its statuses tell the truth and its tasks slow with the load, the
    attack that a check of the tasks' times against the loads cannot see, paid for in slower tasks."""

    kind: AttackKind
    share: float
    sybil_ids: int = 3
    whitewash_ids: int = 16
    whitewash_min_tasks: int = 3
    whitewash_below: float = 0.7
    id_spread_m: float = 0.0
    whitewash_from: int = 0
    rejoin_after: int = 1
    overclaimer_cpu_hz: float | None = None  # None: the slowest of SimConfig.cpu_choices_hz
    fake_load: float | None = None  # None: SimConfig.load_drift
    fake_creep: int = 20
    fake_burn: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.share < 1:
            raise ValueError(f"--attack: share of {self.kind.value!r} must be in [0, 1) (got {self.share!r})")
        for name in ("sybil_ids", "whitewash_ids", "whitewash_min_tasks", "fake_creep", "rejoin_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"Attack.{name}: must be >= 1 (got {getattr(self, name)!r})")
        if not self.id_spread_m >= 0:
            raise ValueError(f"--id-spread-m: must be >= 0 (got {self.id_spread_m!r})")
        if self.overclaimer_cpu_hz is not None and self.kind is not AttackKind.OVERCLAIMING:
            raise ValueError(f"--overclaimer-cpu-hz: only with --attack overclaiming=SHARE (got {self.kind.value!r})")
        if self.overclaimer_cpu_hz is not None and not self.overclaimer_cpu_hz > 0:
            raise ValueError(f"--overclaimer-cpu-hz: must be > 0 (got {self.overclaimer_cpu_hz!r})")
        if self.fake_load is not None and self.kind is not AttackKind.FAKE_RECOVERY:
            raise ValueError(f"--fake-load: only with --attack fake-recovery=SHARE (got {self.kind.value!r})")
        if self.fake_burn and self.kind is not AttackKind.FAKE_RECOVERY:
            raise ValueError(f"--fake-burn: only with --attack fake-recovery=SHARE (got {self.kind.value!r})")
        if self.rejoin_after != 1 and self.kind is not AttackKind.WHITEWASHING:
            raise ValueError(f"--rejoin-after: only with --attack whitewashing=SHARE (got {self.kind.value!r})")
        if self.fake_load is not None and not self.fake_load >= 0:
            raise ValueError(f"--fake-load: must be >= 0 (got {self.fake_load!r})")
        if self.whitewash_from < 0:
            raise ValueError(f"--whitewash-from: must be >= 0 (got {self.whitewash_from!r})")
        if not 0 <= self.whitewash_below <= 1:
            raise ValueError(f"Attack.whitewash_below: must be in [0, 1] (got {self.whitewash_below!r})")

    @property
    def ids(self) -> int:
        """Ids per attacking device."""
        return {AttackKind.SYBIL: self.sybil_ids, AttackKind.WHITEWASHING: self.whitewash_ids}.get(self.kind, 1)

    @property
    def behaviour(self) -> Behaviour:
        """The hidden behaviour the attackers follow (an opportunistic device's is reliable but for large tasks, an
        overclaimer's reliable but slow)."""
        return {AttackKind.ON_OFF: Behaviour.INTERMITTENT, AttackKind.SELECTIVE: Behaviour.SELECTIVE,
                AttackKind.OPPORTUNISTIC: Behaviour.STABLE_RELIABLE,
                AttackKind.OVERCLAIMING: Behaviour.STABLE_RELIABLE}.get(self.kind, Behaviour.STABLE_UNRELIABLE)


def parse_attack(text: str) -> Attack:
    """``"sybil=0.2"`` -> Attack(SYBIL, 0.2); an unknown kind or a share outside [0, 1) is refused by name."""
    name, sep, share = text.partition("=")
    name = name.strip().lower()
    if not sep:
        raise ValueError(f"--attack: expected KIND=SHARE, e.g. sybil=0.2 (got {text!r})")
    known = ", ".join(k.value for k in AttackKind)
    try:
        kind = AttackKind(name)
    except ValueError:
        raise ValueError(f"--attack: unknown kind {name!r} (known: {known})") from None
    try:
        value = float(share)
    except ValueError:
        raise ValueError(f"--attack: share of {name!r} is not a number ({share!r}; expected KIND=SHARE)") from None
    return Attack(kind, value)


OPPORTUNISTIC_SPREAD = 4.0  # task sizes within 4x of the nominal size, where an opportunistic attack needs them


def attack_setting(attack: Attack | None, owner_reports: float | None = None,
                   task_size_spread: float | None = None) -> dict:
    """The SimConfig fields of an attack and what it needs where the caller leaves them unset (None): outcomes all
    reported by owners for an attack by false reports, tasks of differing sizes (:data:`OPPORTUNISTIC_SPREAD`) for
    an opportunistic one; else the paper's setting (a neutral monitor, one size)."""
    kind = attack.kind if attack else None
    if owner_reports is None:
        owner_reports = 1.0 if kind is not None and kind.false_reports else 0.0
    if task_size_spread is None:
        task_size_spread = OPPORTUNISTIC_SPREAD if kind is AttackKind.OPPORTUNISTIC else 1.0
    return {"attack": attack, "owner_reports": owner_reports, "task_size_spread": task_size_spread}


class ChannelModel(str, enum.Enum):
    """How transmission success is decided (see :mod:`simulator.channel`)."""

    RAYLEIGH = "rayleigh"  # closed-form Rayleigh-fading outage
    NS3 = "ns3"  # ns-3's propagation-loss models, sampled and cached (the ns3 extra)


class Policy(str, enum.Enum):
    """How owners pick a collaborator for a task."""

    RANDOM_IN_RANGE = "random-in-range"  # uniform among available devices within range_m
    RANDOM = "random"  # uniform among all available devices


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Units SI; see :mod:`model.config`."""

    devices: int = 500
    tasks: int = 10_000
    slots: int = 100
    seed: int = 0
    area_m: float = 1000.0  # devices lie uniformly in an area_m x area_m square
    range_m: float = 300.0  # communication range for RANDOM_IN_RANGE
    cpu_choices_hz: tuple[float, ...] = (2e9, 4e9, 6e9)
    tx_w: float = 0.1  # 100 mW
    rx_w: float = 0.08  # 80 mW
    task_size_bits: float = 5e6 * 8  # 5 MB face-recognition task (the median size where sizes vary)
    task_size_spread: float = 1.0  # sizes log-uniform in [size / spread, size * spread]; 1: every task the same
    density_cycles_per_bit: float = 2339.0
    threshold_range: tuple[float, float] = (0.3, 0.7)  # each task's theta ~ U(lo, hi)
    outage_snr_db: float = 0.0  # Rayleigh fading: P(tr) = exp(-snr_th / mean SNR)
    deadline_factor: float = 2.0  # deadline = factor * the owner's local execution time
    load_mean: float = 0.3  # background CPU load u in [0, load_max]; f_eff = f * (1 - u)
    load_swing: float = 0.2
    load_max: float = 0.95
    overload: float = 0.85  # comp_ok is false above this load
    radio_down: float = 0.02  # probability a device's radio is unavailable in a slot
    willingness_range: tuple[float, float] = (0.6, 1.0)  # per-device willingness level
    selective_targets: float = 0.3  # fraction of owners a SELECTIVE device misbehaves toward
    mix: dict[Behaviour, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    policy: Policy = Policy.RANDOM_IN_RANGE
    channel: ChannelModel = ChannelModel.RAYLEIGH
    status_every: int = 1  # DeviceStatus rows every this many slots (all devices)
    # what devices report and the traces their behaviour leaves there; off: the paper's setting, whose statuses
    # carry no load and whose periodic devices' reliability follows a cycle of its own
    telemetry: bool = False  # statuses carry cpu_load; periodic devices fail when their usage cycle is busy
    load_drift: float = 0.25  # with telemetry: extra load a degrading device takes on as it degrades (a
    #                           recovering one sheds it as it recovers)
    attack: Attack | None = None  # a share of the devices manipulate (hidden labels in the devices table)
    owner_reports: float = 0.0  # share of tasks whose outcome the owner reports (the event's reporter); the rest a
    #                             neutral monitor observes (reporter null). 0: the paper's setting
    churn: float = 0.0  # share of the honest devices that join after the start, each at a slot drawn uniformly before
    #                     the run's last tenth (until then it serves, owns and reports nothing): the newcomers a fresh id
    #                     hides among. 0: the paper's setting, every device there from slot 0
    leave: float = 0.0  # share of the honest devices that leave before the end, each at a slot drawn uniformly after
    #                     the run's first tenth (from then on it serves, owns and reports nothing): the silent ids an
    #                     honest newcomer may stand near. 0: the paper's setting, every device there to the last slot
    clock: SlotClock = field(default_factory=SlotClock)
    system: SystemParams = field(default_factory=SystemParams)
    weights: TrustWeights = field(default_factory=TrustWeights)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"SimConfig.seed: must be >= 0 (got {self.seed!r})")
        for name in ("devices", "slots", "status_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimConfig.{name}: must be >= 1 (got {getattr(self, name)!r})")
        if self.devices < 2:
            raise ValueError(f"SimConfig.devices: need at least 2 devices (got {self.devices!r})")
        if self.tasks < 0:
            raise ValueError(f"SimConfig.tasks: must be >= 0 (got {self.tasks!r})")
        for name in ("area_m", "range_m", "tx_w", "rx_w", "task_size_bits", "density_cycles_per_bit",
                     "deadline_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SimConfig.{name}: must be > 0 (got {getattr(self, name)!r})")
        if not self.cpu_choices_hz or min(self.cpu_choices_hz) <= 0:
            raise ValueError(f"SimConfig.cpu_choices_hz: need positive frequencies (got {self.cpu_choices_hz!r})")
        runs_on = None if self.attack is None else self.attack.overclaimer_cpu_hz
        if runs_on is not None and not runs_on < max(self.cpu_choices_hz):
            raise ValueError(f"--overclaimer-cpu-hz: an overclaimer claims the fastest CPU, "
                             f"{max(self.cpu_choices_hz):g} Hz; it must run on less (got {runs_on!r})")
        lo, hi = self.threshold_range
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"SimConfig.threshold_range: need 0 <= lo <= hi <= 1 (got {self.threshold_range!r})")
        lo, hi = self.willingness_range
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"SimConfig.willingness_range: need 0 <= lo <= hi <= 1 (got {self.willingness_range!r})")
        drift = self.load_drift if self.telemetry else 0.0
        if not 0 <= drift:
            raise ValueError(f"SimConfig.load_drift: must be >= 0 (got {self.load_drift!r})")
        if not (0 <= self.load_mean - self.load_swing and self.load_mean + self.load_swing + drift <= self.load_max < 1):
            raise ValueError("SimConfig.load_*: need 0 <= load_mean - load_swing and "
                             f"load_mean + load_swing (+ load_drift with telemetry) <= load_max < 1 (got "
                             f"{self.load_mean}, {self.load_swing}, {drift}, {self.load_max})")
        if not 0 <= self.churn < 1:
            raise ValueError(f"SimConfig.churn (--churn): must be in [0, 1) (got {self.churn!r})")
        if not 0 <= self.leave < 1:
            raise ValueError(f"SimConfig.leave (--leave): must be in [0, 1) (got {self.leave!r})")
        if not 0 <= self.owner_reports <= 1:
            raise ValueError(f"SimConfig.owner_reports: must be in [0, 1] (got {self.owner_reports!r})")
        if not self.task_size_spread >= 1:
            raise ValueError(f"SimConfig.task_size_spread: must be >= 1 (got {self.task_size_spread!r})")
        if self.attack is not None and self.attack.kind is AttackKind.OPPORTUNISTIC and self.task_size_spread == 1:
            raise ValueError("--attack opportunistic: needs tasks of differing sizes (task_size_spread > 1)")
        if self.attack is not None and self.attack.kind is AttackKind.FAKE_RECOVERY:
            if not self.telemetry:
                raise ValueError("--attack fake-recovery: needs statuses that carry loads (--telemetry)")
            if not self.load_mean + self.load_swing + self.fake_load <= self.load_max:
                raise ValueError(f"--fake-load: load_mean + load_swing + the lie must be <= load_max {self.load_max} "
                                 f"(got {self.fake_load!r})")
        if any(share < 0 for share in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError(f"SimConfig.mix: shares must be >= 0 with a positive sum (got {self.mix!r})")

    @property
    def fake_load(self) -> float:
        """The load a fake recoverer adds at its busiest, to its reports or (``fake_burn``) to its CPU (0 without that
        attack)."""
        attack = self.attack
        if attack is None or attack.kind is not AttackKind.FAKE_RECOVERY:
            return 0.0
        return self.load_drift if attack.fake_load is None else attack.fake_load

    @property
    def fake_burn(self) -> bool:
        """Whether fake recoverers run their excess load rather than report it (``Attack.fake_burn``)."""
        return self.fake_load > 0 and self.attack.fake_burn

    def at_run_length(self, slots: int) -> "SimConfig":
        """The same world over ``slots`` slots: the tasks per slot kept (tasks scaled), so each slot's graph is as
        dense and only each device's record grows."""
        if slots < 1:
            raise ValueError(f"--sim-slots: need at least 1 slot (got {slots!r})")
        return replace(self, slots=slots, tasks=round(self.tasks * slots / self.slots))

    def at_fleet_size(self, devices: int) -> "SimConfig":
        """The same world with ``devices`` devices: the tasks per device per slot and the devices per km² kept (tasks
        and the area's side scaled), so each owner has as many candidates in range and each device as long a
        record; only the fleet, and with it what a model can learn across devices, grows."""
        if devices < 2:
            raise ValueError(f"--sim-devices: need at least 2 devices (got {devices!r})")
        scale = devices / self.devices
        return replace(self, devices=devices, tasks=round(self.tasks * scale), area_m=self.area_m * scale ** 0.5)

    @property
    def behaviour_mix(self) -> dict[Behaviour, float]:
        """The shares the devices' hidden behaviours are drawn with, the attackers' included: the mix over the
        devices that do not attack, the attack's behaviour over its share."""
        honest = 1 - (self.attack.share if self.attack else 0.0)
        total = sum(self.mix.values())
        mix = {kind: share / total * honest for kind, share in self.mix.items()}
        if self.attack is not None:
            mix[self.attack.behaviour] = mix.get(self.attack.behaviour, 0.0) + self.attack.share
        return mix


def parse_mix(text: str) -> dict[Behaviour, float]:
    """``"stable_reliable=0.5,selective=0.5"`` -> shares (normalized later)."""
    mix: dict[Behaviour, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, share = part.partition("=")
        try:
            mix[Behaviour[name.strip().upper()]] = float(share)
        except KeyError:
            names = ", ".join(b.label for b in Behaviour)
            raise ValueError(f"--mix: unknown behaviour {name.strip()!r} (known: {names})") from None
        except ValueError:
            raise ValueError(f"--mix: share of {name.strip()!r} is not a number ({share!r})") from None
    return mix
