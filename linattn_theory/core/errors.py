"""Errors every layer raises: a bad configuration value is a :class:`ConfigError` (exit 2 on the
command line), raised before anything is computed or written; a stored run whose files do not
match their recorded hashes is a :class:`RunIntegrityError` (exit 2), naming its folder.
"""

from pathlib import Path

__all__ = ["ConfigError", "RunIntegrityError"]


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


class RunIntegrityError(ValueError):
    """A stored run is broken: its ``metadata.json`` is unreadable, or a file it lists is missing
    or differs from the hash recorded for it (``folder`` and ``reason`` name which)."""

    def __init__(self, folder, reason: str):
        self.folder, self.reason = Path(folder), reason
        super().__init__(f"{folder}: broken run: {reason}")
