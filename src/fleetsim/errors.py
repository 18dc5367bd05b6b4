"""User-facing errors: one line naming the field, the bad value and the fix.

The CLI turns any ``FleetsimInputError`` into that one line on stderr and exit code 2,
with no traceback. Everything that validates user input (configs, traces, catalogs,
CLI arguments) raises it; internal invariant failures stay ordinary exceptions.
"""

from __future__ import annotations


class FleetsimInputError(ValueError):
    """Bad user input. ``str(err)`` is the complete one-line message shown to the user."""

    def __init__(self, where: str, value: object, fix: str) -> None:
        self.where = where
        self.value = value
        self.fix = fix
        super().__init__(f"{where}: got {value!r}; {fix}")
