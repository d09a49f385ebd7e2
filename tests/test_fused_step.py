"""The DT training step's fast paths against the torch reference they replace.

content_scores: the content term computed only for the replicas that use it equals the full
computation masked by content (bitwise: the skipped replicas were multiplied by 0).
"""
import pytest
import torch

from wtc.dt.attention import content_scores
from wtc.dt.ple import ple_uniform


def full_content(zq, zk, W, u, content):
    """What pointer_scores computed before: every replica, then times content."""
    N = W.shape[-1]
    proj = ple_uniform(zq, N) @ W[:, None] + u[:, None, :, None, :]
    return (proj @ ple_uniform(zk, N).transpose(-1, -2)) * content[:, None, None, None, None]


@pytest.mark.parametrize("content", [[0, 0, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]])
def test_content_scores_skip_positional_replicas(rng, content):
    torch.manual_seed(int(rng.integers(1 << 31)))
    R, B, H, T, P, N = 4, 3, 2, 5, 4, 7
    zq = torch.rand(R, B, H, T, requires_grad=True)
    zk = torch.rand(R, B, H, T + P, requires_grad=True)
    W = torch.randn(R, H, N, N, requires_grad=True)
    u = torch.randn(R, H, N, requires_grad=True)
    c = torch.tensor(content, dtype=torch.float32)
    ours = content_scores(zq, zk, W, u, c)
    ref = full_content(zq, zk, W, u, c)
    assert torch.equal(ours, ref)
    g = torch.randn_like(ref)
    leaves = (zq, zk, W, u)
    if not c.any():   # nothing depends on the inputs any more
        assert not ours.requires_grad or torch.equal(ours, torch.zeros_like(ours))
        return
    ga = torch.autograd.grad(ours, leaves, g)
    gb = torch.autograd.grad(ref, leaves, g)
    for a, b in zip(ga, gb):
        assert torch.equal(a, b)
