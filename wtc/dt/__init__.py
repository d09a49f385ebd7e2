"""Discrete Transformer: model, configuration, training (torch; the CPU path and the oracle)."""
from wtc.dt.config import ConfigError, DTConfig
from wtc.dt.model import DiscreteTransformer
from wtc.dt.ple import ple

__all__ = ["DTConfig", "ConfigError", "DiscreteTransformer", "ple"]
