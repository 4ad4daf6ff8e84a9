"""Task families by name: the synthetic families (:mod:`.tasks`) and the digits data set
(:mod:`.digits`), built by :func:`make_clients` (docs/theory.md §2, §9).
"""

from __future__ import annotations

from ..core.clients import FederatedDataset
from .tasks import in_context_regression_clients, planted_kernel_clients

__all__ = ["FAMILIES", "make_clients", "clients_from_config"]


def _digits_clients(**options) -> FederatedDataset:
    """The ``digits`` family (real data, docs/theory.md §9): :func:`linattn_theory.data.digits.digits_clients`.

    Imported on first use: scikit-learn is an optional extra."""
    from .digits import digits_clients
    return digits_clients(**options)


FAMILIES = {
    "planted_kernel": planted_kernel_clients,
    "in_context_regression": in_context_regression_clients,
    "digits": _digits_clients,
}


def make_clients(family: str, seed: int = 0, **options) -> FederatedDataset:
    """Build the clients of a task family by name (``planted_kernel``, ``in_context_regression``, ``digits``).

    Parameters
    ----------
    family : {"planted_kernel", "in_context_regression", "digits"}
        The task family (:func:`~linattn_theory.data.tasks.planted_kernel_clients`,
        :func:`~linattn_theory.data.tasks.in_context_regression_clients`,
        :func:`~linattn_theory.data.digits.digits_clients`).
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
    """
    options = dict(config.to_dict()["task"])
    return make_clients(options.pop("family"), seed=config.seed, **options)
