"""Standard token transformers for the per-weight studies (TransformerLens-compatible names)."""
from wtc.models.transformer import Transformer, TransformerConfig

__all__ = ["Transformer", "TransformerConfig"]
