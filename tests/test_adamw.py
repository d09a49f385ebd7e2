"""wtc.dt.adamw.FusedAdamW against torch.optim.AdamW(fused=True): the same parameters and state, bit
for bit, over steps with a changing learning rate and parameters without a gradient; state_dicts
that load into each other."""
import pytest
import torch

from wtc.dt.adamw import FusedAdamW, adamw


def twins(seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((3, 4), (5,), (2, 2, 3))]
    return ps, [torch.nn.Parameter(p.detach().clone()) for p in ps]


def run(ours, theirs, ps, qs, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for k in range(steps):
        for i, (p, q) in enumerate(zip(ps, qs)):
            grad = torch.randn(p.shape, generator=g)
            skip = (k + i) % 5 == 2                     # some steps leave a parameter without a gradient
            p.grad, q.grad = (None, None) if skip else (grad.clone(), grad.clone())
        ours.step()
        theirs.step()
        if k == steps // 2:
            for group in ours.param_groups + theirs.param_groups:
                group["lr"] *= 0.1


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for i in sb["state"]:
        assert sa["state"][i].keys() == sb["state"][i].keys()
        for k in sb["state"][i]:
            assert torch.equal(sa["state"][i][k], sb["state"][i][k]) and sa["state"][i][k].dtype == sb["state"][i][k].dtype


def test_fused_adamw_is_torchs_bit_for_bit():
    ps, qs = twins()
    ours, theirs = FusedAdamW(ps, lr=0.01, weight_decay=0.05), torch.optim.AdamW(qs, lr=0.01, weight_decay=0.05, fused=True)
    run(ours, theirs, ps, qs, 25)
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    same_state(ours, theirs)


@pytest.mark.parametrize("direction", ["ours to torch", "torch to ours"])
def test_state_dicts_load_into_each_other(direction):
    ps, qs = twins()
    ours, theirs = FusedAdamW(ps, lr=0.02, weight_decay=0.0), torch.optim.AdamW(qs, lr=0.02, weight_decay=0.0, fused=True)
    run(ours, theirs, ps, qs, 6)
    ps2, qs2 = [torch.nn.Parameter(p.detach().clone()) for p in ps], [torch.nn.Parameter(q.detach().clone()) for q in qs]
    if direction == "ours to torch":
        resumed, reference = torch.optim.AdamW(qs2, lr=1.0, fused=True), torch.optim.AdamW(ps2, lr=1.0, fused=True)
        resumed.load_state_dict(ours.state_dict())
        reference.load_state_dict(theirs.state_dict())
    else:
        resumed, reference = FusedAdamW(ps2, lr=1.0), FusedAdamW(qs2, lr=1.0)
        resumed.load_state_dict(theirs.state_dict())
        reference.load_state_dict(ours.state_dict())
    same_state(resumed, reference)
    a, b = (qs2, ps2) if direction == "ours to torch" else (ps2, qs2)
    run(resumed, reference, a, b, 6, seed=7)     # both continue the same way
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_state_of_other_parameters_is_refused():
    ps, _ = twins()
    opt = FusedAdamW(ps[:2], lr=0.01)
    with pytest.raises(ValueError, match="3 parameters in 1 groups; this optimizer has 2"):
        opt.load_state_dict(FusedAdamW(ps, lr=0.01).state_dict())


def test_the_cpu_gets_the_twin():
    ps, _ = twins()
    assert isinstance(adamw(ps, 0.01, 0.0, torch.device("cpu")), FusedAdamW)
