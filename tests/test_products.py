"""wtc.kernels.products: the split weight-gradient products equal the plain ones (float64 oracle).

The split path runs for CUDA tensors; its arithmetic is device-independent, so it is checked here
on CPU tensors through split=True (and split_product's chunking through a small `rows`)."""
import pytest
import torch

from wtc.kernels import products


@pytest.mark.parametrize("M,rows", [(1, 4), (7, 4), (64, 16), (100, 8), (9, 9)])
def test_split_product_equals_the_plain_product(M, rows, monkeypatch):
    g = torch.Generator().manual_seed(M * 31 + rows)
    a, b = torch.randn(3, M, 5, generator=g, dtype=torch.float64), torch.randn(3, M, 4, generator=g, dtype=torch.float64)
    want = torch.einsum("rms,rmv->rsv", a, b)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))   # take the GPU branch on CPU
    got = products.split_product(a, b, rows=rows)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_read_product_values_and_gradients_match_einsum(monkeypatch):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(2, 3, 5000, 6, generator=g, dtype=torch.float64).requires_grad_()
    weights = torch.randn(2, 4, 6, generator=g, dtype=torch.float64).requires_grad_()
    with monkeypatch.context() as m:     # 15000 rows: three chunks of SPLIT_ROWS and a tail
        m.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        out_split = products.read_product(values, weights)
        grads_split = torch.autograd.grad((out_split * torch.cos(out_split)).sum(), (values, weights))
    out_plain = torch.einsum("r...v,rsv->r...s", values, weights)
    grads_plain = torch.autograd.grad((out_plain * torch.cos(out_plain)).sum(), (values, weights))
    assert out_split.shape == (2, 3, 5000, 4)
    torch.testing.assert_close(out_split, out_plain, rtol=1e-12, atol=1e-12)
    for s, p in zip(grads_split, grads_plain):
        torch.testing.assert_close(s, p, rtol=1e-11, atol=1e-11)
