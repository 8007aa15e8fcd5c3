"""Credit assignment and losses: advantage estimators over steps and the policy-gradient loss."""

from agent_core.algorithms.advantages import ESTIMATORS, AdvantageOptions, AdvantageResult
from agent_core.algorithms.returns import StepArrays, discounted_returns

__all__ = ["ESTIMATORS", "AdvantageOptions", "AdvantageResult", "StepArrays", "discounted_returns"]
