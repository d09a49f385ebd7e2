"""Training history: per-step curves for every replica, and the plot that shows functional
convergence (loss) coming before structural discretization (entropies falling)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wtc import charts


@dataclass
class History:
    """Per-step records of one population (R replicas). Arrays are (steps, R[, ...]).

    metric is the batch accuracy (integer tasks) or max relative error (real tasks) of the
    training-mode model; sel_entropy has one column per read slot, attn_entropy one per pointer
    head (entropy of softmax(score / tau) averaged over sequences and queries).
    """

    task: str
    metric_name: str
    slot_names: list[str]
    head_names: list[str]
    step: list[int] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    tau: list[float] = field(default_factory=list)
    loss: list[np.ndarray] = field(default_factory=list)
    metric: list[np.ndarray] = field(default_factory=list)
    sel_entropy: list[np.ndarray] = field(default_factory=list)
    attn_entropy: list[np.ndarray] = field(default_factory=list)
    attempt: int = 0
    replica: int = 0                       # the replica the trained model was taken from
    final: dict = field(default_factory=dict)   # fresh-data scores of every replica after training
    seconds: float = 0.0

    def record(self, step: int, phase: str, tau: float, loss, metric, sel_entropy, attn_entropy) -> None:
        self.step.append(step)
        self.phase.append(phase)
        self.tau.append(float(tau))
        self.loss.append(np.asarray(loss, dtype=np.float32))
        self.metric.append(np.asarray(metric, dtype=np.float32))
        self.sel_entropy.append(np.asarray(sel_entropy, dtype=np.float32))
        self.attn_entropy.append(np.asarray(attn_entropy, dtype=np.float32))

    def __len__(self) -> int:
        return len(self.step)

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything as stacked arrays: loss (steps, R), sel_entropy (steps, R, S), ..."""
        def stack(rows, width):
            return np.stack(rows) if rows else np.zeros((0, width), np.float32)
        return {"step": np.asarray(self.step, dtype=np.int64), "tau": np.asarray(self.tau, dtype=np.float32),
                "loss": stack(self.loss, 0), "metric": stack(self.metric, 0),
                "sel_entropy": stack(self.sel_entropy, 0), "attn_entropy": stack(self.attn_entropy, 0)}

    def curves(self, replica: int | None = None) -> dict[str, np.ndarray]:
        """Curves of one replica (default: the one the model came from)."""
        r = self.replica if replica is None else replica
        a = self.arrays()
        out = {"step": a["step"], "tau": a["tau"]}
        for key in ("loss", "metric", "sel_entropy", "attn_entropy"):
            out[key] = a[key][:, r] if len(a[key]) else a[key]
        return out

    def to_dict(self) -> dict:
        return {"task": self.task, "metric_name": self.metric_name, "slot_names": self.slot_names,
                "head_names": self.head_names, "attempt": self.attempt, "replica": self.replica,
                "final": self.final, "seconds": self.seconds, "phase": self.phase}

    def chart(self, replica: int | None = None) -> "charts.Chart":
        """Loss and metric vs step above, mean selection/attention entropy and tau below."""
        c = self.curves(replica)
        entropies = tuple(charts.Series(c[key].mean(-1), f"{name} entropy (mean)", color)
                          for key, name, color in (("sel_entropy", "selection", charts.BLUE),
                                                   ("attn_entropy", "attention", charts.ORANGE)) if c[key].size)
        loss = charts.Axis("loss", (charts.Series(np.maximum(c["loss"], 1e-12), "loss (MSE, normalised)"),), log=True)
        metric = charts.Axis(self.metric_name, (charts.Series(c["metric"], self.metric_name, charts.GREEN, opacity=0.7),))
        tau = charts.Axis("tau", (charts.Series(c["tau"], "tau", charts.GRAY, dashed=True),), log=True)
        title = f"{self.task}: replica {self.replica if replica is None else replica}, attempt {self.attempt}"
        return charts.Chart(title, c["step"], "step", (charts.Panel(loss, metric),
                                                       charts.Panel(charts.Axis("entropy (nats)", entropies), tau,
                                                                    legend=True)))

    def plot(self, path, replica: int | None = None) -> str:
        """Draw chart() to `path`: written directly as SVG for a .svg path (no plotting library),
        through matplotlib for .png and other formats."""
        return charts.write(self.chart(replica), path)
