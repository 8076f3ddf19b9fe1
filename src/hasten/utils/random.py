"""Accelerate's import path ``accelerate.utils.random``: seeding and sharing RNG states
(``hasten/collectives/random.py``).
"""
from ..collectives.random import set_seed, synchronize_rng_state, synchronize_rng_states  # noqa: F401

__all__ = [
    "set_seed", "synchronize_rng_state", "synchronize_rng_states",
]
