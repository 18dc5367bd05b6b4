"""RL post-training pipelines on simulated clusters: rollouts on the serving engine, inference
and training passes on the same performance model, weight synchronisation (docs/rl.md)."""

from fleetsim.rl.config import RLConfig, load_rl_config, rl_config_from_dict
from fleetsim.rl.job import RLJob, run_rl
from fleetsim.rl.results import RLResult

__all__ = ["RLConfig", "RLJob", "RLResult", "load_rl_config", "rl_config_from_dict", "run_rl"]
