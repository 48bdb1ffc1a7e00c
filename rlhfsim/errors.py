"""The one error type a user ever sees: a YAML path, what was expected and what was given."""

from __future__ import annotations


class RlhfsimError(Exception):
    """A user-facing error printed as one line by the CLI (exit code 2), never as a traceback."""


class ScenarioError(RlhfsimError):
    """A scenario (or plan, or profile) value is wrong. ``path`` is a dotted YAML path like
    ``placement.pools[1].gpus``."""

    def __init__(self, path: str, message: str, more: list["ScenarioError"] | None = None):
        self.path = path
        self.message = message
        self.more = list(more or [])  # further errors of the same document, reported with this one
        super().__init__(f"{path}: {message}" if path else message)

    def lines(self) -> list[str]:
        """This error and the others found with it, one line each."""
        return [str(self)] + [str(e) for e in self.more]


class ProfileError(RlhfsimError):
    """A calibration profile cannot be used (missing, wrong schema version, malformed)."""
