"""Random streams by purpose: every draw of the toolkit comes from a ``numpy.random.SeedSequence``
keyed by ``(purpose, client, round, …)``, so a stream never depends on how many others exist.
"""

from __future__ import annotations

import numpy as np

__all__ = ["seed_sequence", "SEED_TEACHER", "SEED_CLIENT", "SEED_INIT", "SEED_MINIBATCH",
           "SEED_PARTICIPATION", "SEED_EVAL", "SEED_PERTURBATION"]

# SeedSequence spawn keys by purpose: never reuse one for another purpose.
SEED_TEACHER, SEED_CLIENT, SEED_INIT, SEED_MINIBATCH, SEED_PARTICIPATION, SEED_EVAL = range(6)
#: the perturbations of θ^0 that measure how chaotic a run is (sim.sensitivity), keyed by repeat
SEED_PERTURBATION = 6


def seed_sequence(seed: int, *key: int) -> np.random.SeedSequence:
    """The stream for one purpose (and client, round, …): ``SeedSequence(seed, spawn_key=key)``.

    Parameters
    ----------
    seed : int
        The root seed (``config.seed``).
    *key : int
        The purpose and, where it applies, the client (``SEED_CLIENT, c``).

    Returns
    -------
    numpy.random.SeedSequence
        The stream's seed sequence.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.seeds import SEED_CLIENT, seed_sequence
    >>> a = np.random.default_rng(seed_sequence(0, SEED_CLIENT, 3)).normal()
    >>> a == np.random.default_rng(seed_sequence(0, SEED_CLIENT, 3)).normal()    # the same stream
    True
    >>> a == np.random.default_rng(seed_sequence(0, SEED_CLIENT, 4)).normal()    # another client's
    False
    """
    return np.random.SeedSequence(int(seed), spawn_key=tuple(int(k) for k in key))
