"""Live serving: an OpenAI-compatible emulated backend driven by the replica engine in real
time (``fleetsim emulate``), a gateway that routes real traffic with fleetsim's routers
(``fleetsim gateway``), a trace-driven load generator (``fleetsim load``) and the comparison of
live against predicted latency (``fleetsim compare``). See docs/live.md.

The only package under ``src/`` that reads the wall clock: a live server's time is real time.
"""
