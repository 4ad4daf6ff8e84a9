"""Errors every layer raises: a bad configuration value is a :class:`ConfigError` (exit 2 on the
command line; an :class:`ArgumentError` when a flag's value is at fault), raised before anything
is computed or written; a stored run whose files do not
match their recorded hashes is a :class:`RunIntegrityError` (exit 2), naming its folder; a
setting that runs but that a user should revisit is a :class:`SettingWarning`.
"""

from pathlib import Path

__all__ = ["ConfigError", "ArgumentError", "RunIntegrityError", "SettingWarning"]


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


class ArgumentError(ConfigError):
    """A command-line argument is invalid (a flag's value, e.g. ``--only`` naming no figure
    script); the command line says "invalid argument" (exit 2)."""


class RunIntegrityError(ValueError):
    """A stored run is broken: its ``metadata.json`` is unreadable, or a file it lists is missing
    or differs from the hash recorded for it (``folder`` and ``reason`` name which)."""

    def __init__(self, folder, reason: str):
        self.folder, self.reason = Path(folder), reason
        super().__init__(f"{folder}: broken run: {reason}")


class SettingWarning(UserWarning):
    """A setting that runs but that a user should revisit (``model.rank`` above the token
    dimension, a one-client federation, more workers than cores)."""
