"""Choosing whether and how to speculate: a measured cost model, per-request choice, adaptive k, pools."""
from .cost_model import CostModel, StepBudget, expected_speedup, expected_tokens
from .decide import Decision, PolicyConfig, RequestFeatures, choose

__all__ = ["CostModel", "StepBudget", "Decision", "PolicyConfig", "RequestFeatures", "choose", "expected_speedup",
           "expected_tokens"]
