"""The DT's training optimizer on the CPU: AdamW as torch.optim.AdamW(fused=True) computes it, the
same aten kernel (torch._fused_adamw_) on the same tensors in the same order, so the same bits, and
the same state_dict (a checkpoint written by either loads into the other).

Why not torch.optim.AdamW itself: its first call imports torch._dynamo (torch._compile's lazy
import), about 1 s of every worker's start on a 2-core machine, before the rung's first step
(measured: 1.03 s of a 1.2 s Attempt construction). On a CUDA device adamw() keeps torch's class
(wtc.dt.graph_step switches its groups to capturable for CUDA graph capture).
"""
from __future__ import annotations

import torch

# torch.optim.AdamW's group options for fused=True, as its state_dict lists them
OPTIONS = {"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False, "maximize": False, "foreach": None,
           "capturable": False, "differentiable": False, "fused": True, "decoupled_weight_decay": True}


class FusedAdamW:
    """AdamW over one group of parameters: param_groups, state, zero_grad, step, state_dict and
    load_state_dict as torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)."""

    def __init__(self, params, lr: float, weight_decay: float = 1e-2):   # torch's default
        self.param_groups = [{"params": list(params), "lr": lr, "weight_decay": weight_decay, **OPTIONS}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        by_kind: dict[tuple, list[list[torch.Tensor]]] = {}    # torch groups the tensors by (device, dtype)
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32, device=p.device),
                                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            lists = by_kind.setdefault((p.device, p.dtype), [[], [], [], [], []])
            for dst, t in zip(lists, (p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"])):
                dst.append(t)
        beta1, beta2 = group["betas"]
        for params, grads, exp_avgs, exp_avg_sqs, steps in by_kind.values():
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                                beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                maximize=False, grad_scale=None, found_inf=None)

    def state_dict(self) -> dict:
        group = self.param_groups[0]
        params = group["params"]
        return {"state": {i: dict(self.state[p]) for i, p in enumerate(params) if p in self.state},
                "param_groups": [{**{k: v for k, v in group.items() if k != "params"},
                                  "params": list(range(len(params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """torch.optim.AdamW's format: {"state": {index: {step, exp_avg, exp_avg_sq}}, "param_groups": [...]}."""
        groups = state_dict["param_groups"]
        params = self.param_groups[0]["params"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            raise ValueError(f"optimizer state of {sum(len(g['params']) for g in groups)} parameters in "
                             f"{len(groups)} groups; this optimizer has {len(params)} in one")
        self.param_groups[0].update({k: v for k, v in groups[0].items() if k != "params"})
        self.state = {}
        for i, st in state_dict["state"].items():
            p = params[int(i)]
            self.state[p] = {k: (v.detach().to(device=p.device, dtype=torch.float32 if k == "step" else p.dtype)
                                 .clone()) for k, v in st.items()}


def adamw(params, lr: float, weight_decay: float, device: torch.device) -> FusedAdamW | torch.optim.AdamW:
    """The DT's training optimizer, fused: one kernel over all parameters instead of a loop of small
    ops per tensor (0.6 vs 3.1 ms a step for the default model's 14 tensors on one loaded core). On
    the CPU FusedAdamW, elsewhere torch's class."""
    if torch.device(device).type == "cpu":
        return FusedAdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
