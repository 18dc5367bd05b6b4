"""A door for signals into the compiled event loop (this module is never compiled).

CPython runs signal handlers (Ctrl-C's ``KeyboardInterrupt``, a SIGTERM handler) only between
bytecodes of interpreted code. The compiled engine can run for minutes without executing
any, so the loop calls ``let_signals_in`` every few thousand events: entering an interpreted
function is where a pending signal is handled and raised.
"""

from __future__ import annotations


def let_signals_in() -> None:
    """Do nothing, interpreted: a pending signal's handler runs here."""
