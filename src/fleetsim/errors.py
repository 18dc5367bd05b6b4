"""User-facing errors: one line naming the field, the bad value and the fix.

The CLI turns any ``FleetsimInputError`` into that one line on stderr and exit code 2,
with no traceback. Everything that validates user input (configs, traces, catalogs,
CLI arguments) raises it; internal invariant failures stay ordinary exceptions.
"""

from __future__ import annotations

_NO_VALUE = object()


class FleetsimInputError(ValueError):
    """Bad user input. ``str(err)`` is the complete one-line message shown to the user.

    ``value`` may be omitted when ``fix`` already quotes the bad value (validation messages
    of config dataclasses do).
    """

    def __init__(self, where: str, value: object = _NO_VALUE, fix: str = "") -> None:
        self.where = where
        self.value = value
        self.fix = fix
        if value is _NO_VALUE:
            super().__init__(f"{where}: {fix}")
        else:
            super().__init__(f"{where}: got {value!r}; {fix}")


class PlanError(RuntimeError):
    """A batching policy returned a plan the engine cannot apply (a policy bug)."""
