"""Speculative decoding: the strategy API plugins implement, the verifier, the engine loop."""
from .stats import SpecStats
from .strategy import KVHandle, Option, Proposal, Strategy, StrategyContext, StrategyOptions

__all__ = ["KVHandle", "Option", "Proposal", "SpecStats", "Strategy", "StrategyContext", "StrategyOptions"]
