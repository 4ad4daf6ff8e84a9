"""Errors every layer raises: a bad configuration value is a :class:`ConfigError` (exit 2 on the
command line), raised before anything is computed or written.
"""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""
