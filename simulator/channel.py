"""Transmission success models: the analytic Rayleigh-fading default, or ns-3's propagation models.

A channel maps (distance, transmit power) to P(transmission succeeds), the
probability that the instantaneous SNR clears ``outage_snr_db``. The analytic
model is the closed form exp(-SNR_th / mean SNR); :class:`Ns3Channel` measures
the same quantity with ns-3 (the simulator the paper used): its
LogDistancePropagationLossModel (exponent alpha0, 0 dB at 1 m, i.e. g = d^-alpha0)
followed by a NakagamiPropagationLossModel with m = 1 (Rayleigh), sampled per
distance bin, cached on disk, and interpolated.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Protocol

import numpy as np

from model import physics
from model.config import SystemParams
from model.config import state_dir


class Channel(Protocol):
    def p_tr(self, distance_m: np.ndarray, tx_w: np.ndarray) -> np.ndarray: ...


class RayleighChannel:
    """Closed-form outage probability under Rayleigh fading at the path-loss mean SNR."""

    def __init__(self, params: SystemParams, outage_snr_db: float) -> None:
        self.params, self.outage_snr_db = params, outage_snr_db

    def p_tr(self, distance_m: np.ndarray, tx_w: np.ndarray) -> np.ndarray:
        return physics.outage_success(distance_m, tx_w, self.params, self.outage_snr_db)


class Ns3Channel:
    """P(tr) measured with ns-3's propagation-loss models, per distance bin, cached as JSON.

    Needs the ``ns3`` extra (``pip install -e '.[ns3]'``); importing ns-3 costs
    several seconds per process, so results are cached under ``cache_dir``
    (default ``$TRUSTBEAM_STATE_DIR/ns3``) keyed by every parameter that
    affects them.
    """

    def __init__(self, params: SystemParams, outage_snr_db: float, tx_w: float, max_distance_m: float,
                 bin_m: float = 5.0, samples: int = 2000, seed: int = 1, cache_dir: Path | None = None) -> None:
        self.params, self.outage_snr_db, self.tx_w = params, outage_snr_db, tx_w
        self.edges = np.arange(0.0, max_distance_m + bin_m, bin_m)
        self.edges[0] = params.min_distance_m
        self.samples, self.seed = samples, seed
        key = json.dumps([params.path_loss_exponent, params.noise_w, params.min_distance_m, outage_snr_db, tx_w,
                          self.edges.tolist(), samples, seed])
        self.cache = (cache_dir or state_dir() / "ns3") / f"p_tr-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
        self.table = self._load_or_measure()

    def _load_or_measure(self) -> np.ndarray:
        if self.cache.exists():
            return np.asarray(json.loads(self.cache.read_text())["p_tr"])
        table = measure_with_ns3(self.edges, self.tx_w, self.params, self.outage_snr_db, self.samples, self.seed)
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        partial = self.cache.with_suffix(".partial")
        partial.write_text(json.dumps({"distance_m": self.edges.tolist(), "p_tr": table.tolist()}))
        os.replace(partial, self.cache)
        return table

    def p_tr(self, distance_m: np.ndarray, tx_w: np.ndarray) -> np.ndarray:
        if not np.allclose(tx_w, self.tx_w):
            raise ValueError(f"Ns3Channel: measured for tx_w={self.tx_w} W only (got {np.unique(tx_w)})")
        return np.interp(distance_m, self.edges, self.table)


def measure_with_ns3(distances: np.ndarray, tx_w: float, params: SystemParams, outage_snr_db: float,
                     samples: int, seed: int) -> np.ndarray:
    """Fraction of faded receptions whose SNR clears the threshold, at each distance, from ns-3."""
    try:
        from ns import ns
    except ImportError as error:
        raise RuntimeError("--channel ns3 needs the ns3 extra: pip install -e '.[ns3]'") from error

    ns.RngSeedManager.SetSeed(seed)
    path_loss = ns.CreateObject[ns.LogDistancePropagationLossModel]()
    path_loss.SetPathLossExponent(params.path_loss_exponent)
    path_loss.SetReference(params.min_distance_m, 0.0)
    fading = ns.CreateObject[ns.NakagamiPropagationLossModel]()
    for name in ("m0", "m1", "m2"):
        fading.SetAttribute(name, ns.DoubleValue(1.0))
    path_loss.SetNext(fading)
    fading.AssignStreams(seed)
    sender = ns.CreateObject[ns.ConstantPositionMobilityModel]()
    receiver = ns.CreateObject[ns.ConstantPositionMobilityModel]()
    sender.SetPosition(ns.Vector(0.0, 0.0, 0.0))
    tx_dbm = 10.0 * math.log10(tx_w * 1000.0)
    threshold_dbm = 10.0 * math.log10(params.noise_w * 1000.0) + outage_snr_db
    table = np.empty(len(distances))
    for index, distance in enumerate(distances):
        receiver.SetPosition(ns.Vector(float(distance), 0.0, 0.0))
        received = [path_loss.CalcRxPower(tx_dbm, sender, receiver) for _ in range(samples)]
        table[index] = np.mean(np.asarray(received) >= threshold_dbm)
    return table
