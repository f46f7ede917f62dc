"""Choosing whether and how to speculate: a measured cost model, per-request choice, adaptive k, pools."""
from .cost_model import CostModel, expected_speedup, expected_tokens
from .decide import Decision, PolicyConfig, RequestFeatures, choose

__all__ = ["CostModel", "Decision", "PolicyConfig", "RequestFeatures", "choose", "expected_speedup",
           "expected_tokens"]
