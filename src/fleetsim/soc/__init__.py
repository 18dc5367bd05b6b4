"""Agent.xpu's own SoC loop (``engine.py``) and the schedulers still on it (``agent_xpu.py``,
``baselines.py``: Agent.xpu, arXiv:2506.24045, and the static tensor partition). The SoC
itself is a device kind of the main engine (``hardware/soc.py``, ``perf/soc.py``,
``cluster.soc``); what is left here moves there as Agent.xpu's scheduler becomes a planner."""
