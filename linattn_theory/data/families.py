"""Task families by name: the synthetic families (:mod:`.tasks`) and the digits data set
(:mod:`.digits`), built by :func:`make_clients` (docs/theory.md §2, §9).

:data:`FAMILIES` is the one place a family is named: the configuration's ``task.family`` accepts
its names, and a family's ``[task]`` keys are its factory's keyword arguments
(:func:`family_keys`); a factory may carry a ``check(task)`` of its own (:func:`family_check`).
Adding a family is its factory plus one line here
(docs/howto/add-task-family.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Mapping

from ..core.lazy import Registry

__all__ = ["FAMILIES", "FAMILY_KEYS", "FACTORY_ARGUMENTS", "family_keys", "family_check", "make_clients",
           "clients_from_config"]

#: family factories by name, ``factory(**keys, seed, fresh_samples) -> FederatedDataset``;
#: ``"module:attribute"`` entries are imported on first use (digits needs scikit-learn only when built)
FAMILIES = Registry({
    "planted_kernel": ".tasks:planted_kernel_clients",
    "in_context_regression": ".tasks:in_context_regression_clients",
    "digits": ".digits:digits_clients",
}, __package__, "task family")

#: the arguments every factory takes that are not ``[task]`` keys: the root seed, and
#: ``fresh_samples`` (the evaluation stream: the same clients, new samples; what
#: :func:`linattn_theory.theory.profile.population_value_moments` draws from)
FACTORY_ARGUMENTS = ("seed", "fresh_samples")


def family_keys(family: str) -> frozenset[str]:
    """The ``[task]`` keys of ``family``: its factory's keyword arguments other than :data:`FACTORY_ARGUMENTS`.

    A factory must take both of those (a ``TypeError`` names the one it lacks).

    Parameters
    ----------
    family : str
        A registered task family.

    Returns
    -------
    frozenset of str
        Its ``[task]`` keys.

    Examples
    --------
    >>> from linattn_theory.data.families import family_keys
    >>> {"zeta_value", "rank"} <= family_keys("planted_kernel")
    True
    """
    return _factory_keys(family, FAMILIES[family])


@functools.lru_cache(maxsize=None)
def _factory_keys(family: str, factory) -> frozenset[str]:
    """:func:`family_keys` of ``family``'s factory, read from its signature once (a configuration is checked and
    written thousands of times in a sweep; ``inspect.signature`` was 2.5 % of the regret benchmark)."""
    parameters = inspect.signature(factory).parameters
    missing = [name for name in FACTORY_ARGUMENTS if name not in parameters]
    if missing:
        raise TypeError(f"task family {family!r}: its factory takes no {', '.join(missing)}; every factory "
                        f"takes {' and '.join(FACTORY_ARGUMENTS)} (docs/howto/add-task-family.md)")
    return frozenset(name for name in parameters if name not in FACTORY_ARGUMENTS)


def family_check(family: str):
    """The family's own check of a validated ``[task]`` section, ``check(task)`` raising
    :class:`~linattn_theory.core.errors.ConfigError` (the factory's ``check`` attribute; the digits
    family refuses more clients than its images allow), or ``None``.

    Parameters
    ----------
    family : str
        A registered task family.

    Returns
    -------
    callable or None
        ``check(task)``, or ``None`` where the family has none.

    Examples
    --------
    >>> from linattn_theory.data.families import family_check
    >>> family_check("planted_kernel") is None, family_check("digits").__name__
    (True, 'check_task')
    """
    return getattr(FAMILIES[family], "check", None)


class _FamilyKeys(Mapping):
    """``{family: family_keys(family)}`` over the registered families, read from the factories."""

    def __getitem__(self, family: str) -> frozenset[str]:
        if family not in FAMILIES:
            raise KeyError(family)
        return family_keys(family)

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


#: the ``[task]`` keys of every family, derived from the factories' signatures
FAMILY_KEYS = _FamilyKeys()


def make_clients(family: str, seed: int = 0, **options):
    """Build the clients of a task family by name (a key of :data:`FAMILIES`), a
    :class:`~linattn_theory.core.clients.FederatedDataset`.

    Parameters
    ----------
    family : str
        The task family, a key of :data:`FAMILIES` (``"planted_kernel"``, ``"in_context_regression"``,
        ``"digits"``, or one registered later).
    seed : int, default 0
        The instance.
    **options
        The family's keyword arguments (its ``[task]`` keys, docs/cli.md).

    Returns
    -------
    FederatedDataset
        The clients.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.make_clients("planted_kernel", seed=2, num_clients=3, samples_per_client=10)
    >>> clients.family, len(clients.clients)
    ('planted_kernel', 3)
    """
    try:
        factory = FAMILIES[family]
    except KeyError:
        raise ValueError(f"task family {family!r} is unknown; expected one of {sorted(FAMILIES)}") from None
    return factory(seed=seed, **options)


def clients_from_config(config) -> FederatedDataset:
    """The clients of a run configuration's task (docs/theory.md §2), seeded by ``config.seed``.

    ``config`` is a :class:`~linattn_theory.sim.config.RunConfig` (read through ``seed`` and
    ``to_dict()``, whose ``task`` section holds the family and exactly its keys).

    Parameters
    ----------
    config : RunConfig
        The run.

    Returns
    -------
    FederatedDataset
        Its clients (:func:`~linattn_theory.data.families.make_clients`).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> config = lt.config_from_dict({"seed": 3, "task": {"num_clients": 3, "samples_per_client": 16}})
    >>> clients = clients_from_config(config)
    >>> len(clients), [len(client.y) for client in clients]
    (3, [16, 16, 16])
    >>> again = clients_from_config(config)                              # seeded by config.seed
    >>> all(np.array_equal(a.X, b.X) for a, b in zip(clients, again))
    True
    """
    options = dict(config.to_dict()["task"])
    return make_clients(options.pop("family"), seed=config.seed, **options)
