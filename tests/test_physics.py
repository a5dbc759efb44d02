"""The system model against values worked out by hand from the paper's equations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from model import physics
from model.config import SlotClock, SystemParams, TrustWeights, dbm_to_w
from model.trust import collaboration_weight

P = SystemParams()
SIZE, DENSITY = 4e7, 2339.0  # 5 MB, face recognition
CYCLES = SIZE * DENSITY  # 9.356e10


def test_paper_constants() -> None:
    assert dbm_to_w(-80) == pytest.approx(1e-11)
    assert dbm_to_w(20) == pytest.approx(0.1)
    assert (P.bandwidth_hz, P.path_loss_exponent, P.xi_time, P.xi_energy) == (5e6, 4.0, 0.5, 0.5)


def test_computation_by_hand() -> None:
    cost = physics.computation(SIZE, DENSITY, 2e9, P)
    assert cost.time_s == pytest.approx(CYCLES / 2e9) == pytest.approx(46.78)
    # epsilon = 1e-11 with f in GHz: 1e-11 * 2**2 * 9.356e10 = 3.7424 J
    assert cost.energy_j == pytest.approx(3.7424)


def test_transmission_by_hand() -> None:
    # d = 100 m: g = 1e-8, SNR = 0.1 * 1e-8 / 1e-11 = 100, gamma = 5e6 * log2(101)
    gamma = 5e6 * math.log2(101)
    assert physics.channel_gain(100.0, P) == pytest.approx(1e-8)
    assert physics.transmission_rate(100.0, 0.1, P) == pytest.approx(gamma)
    cost = physics.transmission(SIZE, 100.0, 0.1, 0.08, P)
    assert cost.time_s == pytest.approx(SIZE / gamma)
    assert cost.energy_j == pytest.approx(SIZE / gamma * 0.18)


def test_distance_floor_keeps_rate_finite() -> None:
    assert physics.transmission_rate(0.0, 0.1, P) == physics.transmission_rate(P.min_distance_m, 0.1, P)


def test_offload_and_value_by_hand() -> None:
    gamma = 5e6 * math.log2(101)
    t_tot = SIZE / gamma + CYCLES / 4e9
    e_tot = SIZE / gamma * 0.18 + 1e-29 * (4e9) ** 2 * CYCLES
    offload = physics.offload(SIZE, DENSITY, 100.0, 0.1, 0.08, 4e9, P)
    assert offload.time_s == pytest.approx(t_tot) and offload.energy_j == pytest.approx(e_tot)
    local = physics.computation(SIZE, DENSITY, 2e9, P)
    # time: offloading (24.6 s) beats local (46.8 s) -> 1; energy: local (3.74 J) is better -> exp(-|d|/local)
    expected = 0.5 * 1.0 + 0.5 * math.exp(-(e_tot - 3.7424) / 3.7424)
    assert physics.value_of_completion(offload, local, P) == pytest.approx(expected)
    assert expected == pytest.approx(0.5234957, abs=1e-6)


@pytest.mark.parametrize("offloaded, local, value", [(1.0, 2.0, 1.0), (2.0, 2.0, 1.0), (3.0, 2.0, math.exp(-0.5)),
                                                     (6.0, 2.0, math.exp(-2.0))])
def test_kano_rule(offloaded: float, local: float, value: float) -> None:
    assert physics.kano_value(offloaded, local) == pytest.approx(value)


def test_an_unknown_cost_is_worth_nothing_known_never_the_most() -> None:
    # an offload time unknown (a candidate whose CPU nobody has read) must not read as beating local execution
    values = physics.kano_value(np.array([np.nan, 3.0, 1.0]), np.array([2.0, np.nan, 2.0]))
    assert np.isnan(values[:2]).all() and values[2] == 1.0
    assert torch.isnan(physics.kano_value(torch.tensor([float("nan")]), torch.tensor([2.0]))).all()


def test_vectorized_numpy_and_torch_agree() -> None:
    rng = np.random.default_rng(0)
    d, f, f_local = rng.uniform(1, 500, 64), rng.choice([2e9, 4e9, 6e9], 64), rng.choice([2e9, 4e9, 6e9], 64)
    args = (SIZE, DENSITY)
    v_np = physics.value_of_completion(physics.offload(*args, d, 0.1, 0.08, f, P),
                                       physics.computation(*args, f_local, P), P)
    t = torch.from_numpy
    v_torch = physics.value_of_completion(physics.offload(*args, t(d), 0.1, 0.08, t(f), P),
                                          physics.computation(*args, t(f_local), P), P)
    assert isinstance(v_torch, torch.Tensor) and v_np.shape == (64,)
    np.testing.assert_allclose(v_torch.numpy(), v_np, rtol=1e-12)
    scalar = [physics.value_of_completion(physics.offload(*args, d[i], 0.1, 0.08, f[i], P),
                                          physics.computation(*args, f_local[i], P), P) for i in range(64)]
    np.testing.assert_allclose(v_np, scalar, rtol=1e-12)
    assert ((v_np > 0) & (v_np <= 1)).all()


def test_collaboration_weight() -> None:
    w = TrustWeights()
    assert collaboration_weight(1, 0, w) == pytest.approx(0.6)
    assert collaboration_weight(np.array([1, 1, 0]), np.array([1, 0, 0]), w).tolist() == pytest.approx([1, 0.6, 0])


def test_slot_clock_bounds() -> None:
    clock = SlotClock(origin_ms=1000, slot_ms=60)
    assert clock.slot_of([999, 1000, 1059, 1060]).tolist() == [-1, 0, 0, 1]
    assert (int(clock.start_ms(2)), int(clock.end_ms(2))) == (1120, 1180)


@pytest.mark.parametrize("bad", [dict(bandwidth_hz=0), dict(noise_w=-1.0), dict(xi_time=0.7)])
def test_params_reject_nonsense(bad) -> None:
    with pytest.raises(ValueError, match="SystemParams"):
        SystemParams(**bad)
    with pytest.raises(ValueError, match="TrustWeights"):
        TrustWeights(a_tr=0.5, a_com=0.6)
    with pytest.raises(ValueError, match="slot_ms"):
        SlotClock(slot_ms=0)


def test_pair_physics_read_per_device_equals_the_pairs_gathered() -> None:
    """Reading owners' and candidates' rows at src and dst (the scorer's call) gives every pair's numbers exactly,
    NaN where a status is unknown."""
    from model.context import pair_physics
    from model.status import STATUS_COLUMNS

    rng = np.random.default_rng(3)
    n = 40
    status = np.column_stack([rng.choice([1e9, 4e9], n), np.full(n, 0.1), np.full(n, 0.05), rng.uniform(0, 500, (n, 2)),
                              rng.uniform(0.5, 1, n), np.ones(n), np.ones(n), rng.random(n)])
    assert status.shape[1] == len(STATUS_COLUMNS)
    status[3] = np.nan
    profile = np.column_stack([rng.uniform(1e7, 8e7, n), rng.uniform(500, 3000, n)])
    src, dst = rng.integers(0, n, 300), rng.integers(0, n, 300)
    gathered = pair_physics(status[src], status[dst], profile[src], P)
    per_device = pair_physics(status, status, profile, P, src, dst)
    np.testing.assert_array_equal(per_device.features(), gathered.features())
    np.testing.assert_array_equal(per_device.value(P), gathered.value(P))
    assert np.isnan(per_device.distance_m[(src == 3) | (dst == 3)]).all() and per_device.value(P).max() > 0
    assert (per_device.value(P)[(src == 3) | (dst == 3)] == 0).all()  # a pair's unknown status earns no VoC


def test_a_reported_load_slows_the_offload_by_the_share_of_the_cpu_it_takes() -> None:
    """Computation runs at the share of the collaborator's CPU its reported load leaves free (the whole CPU where it
    reports none; at least FREE_MIN of it), as the simulator's devices compute: t_tot = t_tr + cycles / f_free,
    E_tot = E_tr + epsilon * f_free^2 * cycles."""
    from model.context import pair_physics
    from model.status import FREE_MIN

    gamma = 5e6 * math.log2(101)  # d = 100 m, as in test_offload_and_value_by_hand
    owner = np.array([[2e9, 0.1, 0.08, 0.0, 0.0, 1.0, 1.0, 1.0, 0.3]])
    loads = np.array([np.nan, 0.0, 0.5, 0.99])
    collaborators = np.tile([4e9, 0.1, 0.08, 100.0, 0.0, 1.0, 1.0, 1.0, 0.0], (len(loads), 1))
    collaborators[:, -1] = loads
    got = pair_physics(np.repeat(owner, len(loads), 0), collaborators, np.tile([SIZE, DENSITY], (len(loads), 1)), P)
    free_hz = 4e9 * np.array([1.0, 1.0, 0.5, FREE_MIN])
    np.testing.assert_allclose(got.offload.time_s, SIZE / gamma + CYCLES / free_hz)
    np.testing.assert_allclose(got.offload.energy_j, SIZE / gamma * 0.18 + 1e-29 * free_hz ** 2 * CYCLES)
    np.testing.assert_allclose(got.local.time_s, CYCLES / 2e9)  # the owner's own load does not enter its local cost
    assert (got.cpu_collaborator_hz == 4e9).all()  # the CPU the records carry is the claim, not the share free
