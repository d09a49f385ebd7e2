"""HookPoint: an identity module at a named place in the forward pass (TransformerLens style).

Standard `register_forward_hook` works on it: a hook may read the tensor or return a replacement.
"""
from __future__ import annotations

from torch import nn


class HookPoint(nn.Module):
    def forward(self, x):
        return x
