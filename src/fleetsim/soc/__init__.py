"""A laptop SoC (NPU + iGPU sharing one DDR) serving reactive and proactive LLM flows:
the device model, the DDR contention model, the SoC engine and its schedulers (Agent.xpu,
arXiv:2506.24045, and its baselines)."""
