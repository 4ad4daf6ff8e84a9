"""Errors every layer raises: a bad configuration value is a :class:`ConfigError` (exit 2 on the
command line; an :class:`ArgumentError` when a flag's value is at fault), raised before anything
is computed or written; a stored run whose files do not
match their recorded hashes is a :class:`RunIntegrityError` (exit 2), naming its folder; a
setting that runs but that a user should revisit is a :class:`SettingWarning`.
"""

from pathlib import Path

__all__ = ["ConfigError", "ArgumentError", "RunIntegrityError", "SettingWarning"]


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    The message names the key, the value given and what is expected (the command line prints it
    and exits with a non-zero status).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> try:
    ...     lt.config_from_dict({"federated": {"local_steps": 0}})
    ... except lt.ConfigError as error:
    ...     print(str(error).split(";")[0])
    federated.local_steps = 0: expected a value >= 1
    """


class ArgumentError(ConfigError):
    """A command-line argument is invalid (a flag's value, e.g. ``--only`` naming no figure
    script); the command line says "invalid argument" (exit 2).

    Examples
    --------
    >>> from linattn_theory.core.errors import ArgumentError, ConfigError
    >>> try:
    ...     raise ArgumentError("--only 'nope': no such figure script")
    ... except ConfigError as error:                            # an invalid argument is an invalid setting
    ...     print(type(error).__name__, error)
    ArgumentError --only 'nope': no such figure script
    """


class RunIntegrityError(ValueError):
    """A stored run is broken: its ``metadata.json`` is unreadable, or a file it lists is missing
    or differs from the hash recorded for it (``folder`` and ``reason`` name which).

    Parameters
    ----------
    folder : str or path-like
        The run's folder.
    reason : str
        What is wrong with it.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.io import write_run
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_run(lt.simulate(lt.config_from_dict({"federated": {"rounds": 2, "warmup_rounds": 1}})), folder)
    >>> _ = (folder / "rounds.csv").write_text("round,loss\\n0,0.0\\n")          # a tampered file
    >>> try:
    ...     lt.load_run(folder)
    ... except lt.RunIntegrityError as error:
    ...     print(error.folder == folder, "rounds.csv" in error.reason)
    True True
    """

    def __init__(self, folder, reason: str):
        self.folder, self.reason = Path(folder), reason
        super().__init__(f"{folder}: broken run: {reason}")


class SettingWarning(UserWarning):
    """A setting that runs but that a user should revisit (``model.rank`` above the token
    dimension, a one-client federation, more workers than cores).

    Examples
    --------
    >>> import warnings
    >>> from linattn_theory.core.errors import SettingWarning
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("model.rank = 8 exceeds the token dimension 4", SettingWarning)
    >>> issubclass(SettingWarning, UserWarning), caught[0].category.__name__
    (True, 'SettingWarning')
    """
