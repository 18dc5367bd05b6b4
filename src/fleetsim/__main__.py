"""``python -m fleetsim``: the same entry point as the ``fleetsim`` command."""

from fleetsim.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
