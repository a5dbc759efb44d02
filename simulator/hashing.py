"""Counter-based random numbers: a value for any (seed, stream, indices) without iterating.

Hidden behaviour that must be queried at any slot for any pair (by the
simulator and by an oracle) is drawn from these, so it does not depend on the
order of generation or on chunk sizes.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash_uniform(seed: int, stream: int, *indices: np.ndarray | int) -> np.ndarray:
    """Uniform floats in [0, 1), one per broadcast element of ``indices``."""
    with np.errstate(over="ignore"):
        z = _mix(np.uint64(seed) * _GOLDEN + np.uint64(stream))
        for index in indices:
            z = _mix(z + np.asarray(index, dtype=np.int64).astype(np.uint64) * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
