"""The paper's system model (eqs. 2-9): transmission, computation, and the value of task completion.

Every function is elementwise and broadcasts over numpy arrays or torch
tensors alike, so one call costs a whole candidate set. Units: bits, cycle/bit,
Hz, W, m, s, J (see :mod:`model.config` for the energy coefficient's units).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from model.config import SystemParams

Array = Any  # np.ndarray | torch.Tensor | float


class Cost(NamedTuple):
    time_s: Array
    energy_j: Array


def _ops(*values: Array) -> Any:
    """The array module (numpy or torch) of the inputs."""
    for value in values:
        if type(value).__module__.startswith("torch"):
            import torch

            return torch
    return np


def channel_gain(distance_m: Array, params: SystemParams) -> Array:
    """g = d^-alpha0, with d floored at ``params.min_distance_m``."""
    xp = _ops(distance_m)
    return xp.clip(distance_m * 1.0, params.min_distance_m, None) ** -params.path_loss_exponent


def snr(distance_m: Array, tx_w: Array, params: SystemParams) -> Array:
    """Mean received signal-to-noise ratio p_tr * g / N0."""
    return tx_w * channel_gain(distance_m, params) / params.noise_w


def transmission_rate(distance_m: Array, tx_w: Array, params: SystemParams) -> Array:
    """gamma = W * log2(1 + p_tr * g / N0), in bit/s."""
    xp = _ops(distance_m, tx_w)
    return params.bandwidth_hz * xp.log2(1.0 + snr(distance_m, tx_w, params))


def outage_success(distance_m: Array, tx_w: Array, params: SystemParams, outage_snr_db: float) -> Array:
    """P(transmission succeeds) under Rayleigh fading: the instantaneous SNR clears the outage threshold,
    exp(-SNR_th / mean SNR). With g = d^-alpha0 it is exp(-c * d^alpha0), c = SNR_th * N0 / p_tr."""
    xp = _ops(distance_m, tx_w)
    return xp.exp(-(10.0 ** (outage_snr_db / 10.0)) / snr(distance_m, tx_w, params))


def transmission(
    size_bits: Array, distance_m: Array, tx_w_owner: Array, rx_w_collab: Array, params: SystemParams
) -> Cost:
    """t_tr = size / gamma; E_tr = t_tr * (p_tr of the owner + p_rx of the collaborator)."""
    time_s = size_bits / transmission_rate(distance_m, tx_w_owner, params)
    return Cost(time_s, time_s * (tx_w_owner + rx_w_collab))


def computation(size_bits: Array, density: Array, cpu_hz: Array, params: SystemParams) -> Cost:
    """t_com = size * density / f; E_com = epsilon * f^2 * size * density."""
    cycles = size_bits * density
    return Cost(cycles / cpu_hz, params.capacitance * cpu_hz**2 * cycles)


def offload(
    size_bits: Array,
    density: Array,
    distance_m: Array,
    tx_w_owner: Array,
    rx_w_collab: Array,
    cpu_hz_collab: Array,
    params: SystemParams,
) -> Cost:
    """t_tot = t_tr + t_com at the collaborator; E_tot = E_tr + E_com at the collaborator."""
    tr = transmission(size_bits, distance_m, tx_w_owner, rx_w_collab, params)
    com = computation(size_bits, density, cpu_hz_collab, params)
    return Cost(tr.time_s + com.time_s, tr.energy_j + com.energy_j)


def kano_value(offloaded: Array, local: Array) -> Array:
    """1 where local execution is no better than offloading, else exp(-|offloaded - local| / local); NaN where
    either is unknown (NaN), never a value no offload earns."""
    xp = _ops(offloaded, local)
    penalty = xp.exp(-abs(offloaded - local) / local)
    return xp.where(offloaded <= local, 1.0, penalty)


def value_of_completion(offloaded: Cost, local: Cost, params: SystemParams) -> Array:
    """V = xi1 * V_time + xi2 * V_ener, each by the Kano rule against local execution."""
    v_time = kano_value(offloaded.time_s, local.time_s)
    v_energy = kano_value(offloaded.energy_j, local.energy_j)
    return params.xi_time * v_time + params.xi_energy * v_energy
