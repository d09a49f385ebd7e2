"""Hard-phase steps from a CUDA graph (wtc.dt.graph_step).

On any machine: the step the graph captures never reads a tensor back to the host (a capture fails on
the first such read), checked by making every host read raise; the switch is validated. On a GPU
(bench/gpu_check.sh runs this file there): the graphed trajectory equals the eager one.
"""
import contextlib
import os

import pytest
import torch

import wtc
from wtc.dt import DTConfig, graph_step
from wtc.dt.attempt import Attempt

TASK = "parity_last2"


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a host read of a tensor inside the captured step")
    with monkeypatch.context() as m:
        for name in ("__bool__", "item", "tolist", "numpy", "__int__", "__float__"):
            m.setattr(torch.Tensor, name, refuse)
        yield


def _hard_run(device="cpu", **kw) -> Attempt:
    cfg = DTConfig(batch_size=64, replicas=2, steps=4, hard_steps=40, threads=1, **kw)
    run = Attempt(wtc.tasks.get(TASK), cfg, seed=0, attempt=0, device=device)
    while run.phase == "anneal":
        run.train_step()
    return run


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_the_captured_step_never_reads_the_device(monkeypatch, kernels):
    """Reference ops, and the Triton launchers a GPU step takes (here run by the interpreter)."""
    if kernels == "triton":
        pytest.importorskip("triton")
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    device = "cuda" if kernels == "triton" and torch.cuda.is_available() else "cpu"
    monkeypatch.setenv("WTC_KERNELS", "reference")   # the Attempt measures ranges on the CPU first
    run, again = _hard_run(device), _hard_run(device)
    x, y = run.task.batch(run.rng, run.config.batch_size)
    xt, yt, valid, _ = run._tensors(x, y)
    before = [p.detach().clone() for p in run.model.parameters()]
    monkeypatch.setenv("WTC_KERNELS", kernels)
    with run.model.structure_known(), no_host_reads(monkeypatch):
        run._hard_update(xt, yt, valid)
    assert any(not torch.equal(a, p) for a, p in zip(before, run.model.parameters())), "the step changed nothing"
    # outside the block the structure is read from the model again
    assert run.model._known_frozen is None and all(s.known_frozen is None for s in run.model.selectors())
    # the same update as an ordinary hard-phase step makes (same backend, host reads allowed)
    again._update(xt, yt, valid, wtc.dt.selection.Sampling.hard_phase(again.config.tau_end))
    for a, b in zip(run.model.parameters(), again.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_frozen_model_reads_its_structure_once(monkeypatch):
    monkeypatch.setenv("WTC_KERNELS", "reference")
    run = _hard_run()
    run.model.freeze()
    with run.model.structure_known():
        assert run.model.is_frozen() and all(s.known_frozen for s in run.model.selectors())
        with no_host_reads(monkeypatch):
            run.model(run.fit_data[0][:8])


def test_the_switch_is_validated(monkeypatch):
    monkeypatch.setenv("WTC_CUDA_GRAPHS", "yes")
    with pytest.raises(ValueError, match="WTC_CUDA_GRAPHS='yes'"):
        graph_step.enabled(torch.device("cuda"))
    monkeypatch.setenv("WTC_CUDA_GRAPHS", "1")
    assert not graph_step.enabled(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kernels", ["triton", "reference"])
def test_graphed_hard_phase_follows_the_eager_trajectory(monkeypatch, kernels):
    runs = {}
    for graphs in ("1", "0"):
        monkeypatch.setenv("WTC_CUDA_GRAPHS", graphs)
        monkeypatch.setenv("WTC_KERNELS", "reference")
        run = _hard_run("cuda")
        monkeypatch.setenv("WTC_KERNELS", kernels)
        captured = False
        while run.phase == "hard":
            run.train_step()
            if run.graphed is not None:
                assert run.graphed.failed is None, run.graphed.failed
                captured |= run.graphed.graph is not None
        assert captured == (graphs == "1")
        runs[graphs] = run
    assert runs["1"].graphed is None and runs["1"].step == runs["0"].step
    for a, b in zip(runs["1"].model.parameters(), runs["0"].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
