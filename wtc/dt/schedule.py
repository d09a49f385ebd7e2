"""Anneal: the DT's temperature schedule as a small object a training loop steps.

wtc.train follows it (wtc.dt.attempt), and a user's own loop around wtc.dt.layers does too:

    anneal   steps 0 .. steps-1: Gumbel-softmax choices, tau geometric tau_start -> tau_end
    hard     the next hard_steps: argmax forward, straight-through gradients at tau_end, at
             lr * hard_lr_scale (the optimizer belongs to the loop, so lr_scale says what to use)
    done     after both: freeze the discrete structure (DTLayers.freeze) and read it out
"""
from __future__ import annotations

from dataclasses import dataclass

from wtc.dt.config import ConfigError, DTConfig
from wtc.dt.selection import Sampling

PHASES = ("anneal", "hard", "done")


@dataclass
class Anneal:
    """Where the temperature schedule stands; `step()` once per optimizer update.

    The fields mean what DTConfig's fields of the same names mean (and are checked the same way);
    `done` counts the steps taken. `temperature`, `phase`, `lr_scale` and `sampling()` describe the
    current step."""

    steps: int = DTConfig.steps
    hard_steps: int = DTConfig.hard_steps
    tau_start: float = DTConfig.tau_start
    tau_end: float = DTConfig.tau_end
    gumbel: bool = DTConfig.gumbel
    straight_through: bool = DTConfig.straight_through
    hard_lr_scale: float = DTConfig.hard_lr_scale
    done: int = 0

    def __post_init__(self) -> None:
        # one set of checks: DTConfig's, whose message names the field
        DTConfig(steps=self.steps, hard_steps=self.hard_steps, tau_start=self.tau_start, tau_end=self.tau_end,
                 gumbel=self.gumbel, straight_through=self.straight_through, hard_lr_scale=self.hard_lr_scale)
        if isinstance(self.done, bool) or not isinstance(self.done, int) or self.done < 0:
            raise ConfigError(f"done must be a non-negative integer (steps taken), got {self.done!r}")
        self.tau_start, self.tau_end, self.hard_lr_scale = (float(self.tau_start), float(self.tau_end),
                                                            float(self.hard_lr_scale))

    @classmethod
    def from_config(cls, config: DTConfig) -> "Anneal":
        """The schedule wtc.train runs for `config`, at step 0."""
        if not isinstance(config, DTConfig):
            raise ConfigError(f"config must be a wtc.DTConfig, got {type(config).__name__}")
        return cls(steps=config.steps, hard_steps=config.hard_steps, tau_start=config.tau_start,
                   tau_end=config.tau_end, gumbel=config.gumbel, straight_through=config.straight_through,
                   hard_lr_scale=config.hard_lr_scale)

    def tau_at(self, step: int) -> float:
        """Temperature of step `step`: geometric from tau_start (step 0) to tau_end (step steps-1),
        tau_end from then on."""
        frac = min(step / max(self.steps - 1, 1), 1.0)
        return self.tau_start * (self.tau_end / self.tau_start) ** frac

    @property
    def temperature(self) -> float:
        return self.tau_at(self.done)

    @property
    def phase(self) -> str:
        """'anneal', 'hard' or 'done' (PHASES) at the current step."""
        if self.done < self.steps:
            return "anneal"
        return "hard" if self.done < self.steps + self.hard_steps else "done"

    @property
    def lr_scale(self) -> float:
        """Factor for the loop's learning rate now: 1 while annealing, hard_lr_scale after."""
        return 1.0 if self.phase == "anneal" else self.hard_lr_scale

    def sampling(self, generator=None) -> Sampling:
        """How the discrete choices of this step's forward pass are made."""
        if self.phase == "anneal":
            return Sampling.anneal(self.temperature, gumbel=self.gumbel, straight_through=self.straight_through,
                                   generator=generator)
        return Sampling.hard_phase(self.tau_end)

    def step(self) -> None:
        """Advance one step (call it after each optimizer update)."""
        self.done += 1

    def state_dict(self) -> dict:
        """The fields as plain values (to resume a loop: Anneal(**state))."""
        return {"steps": self.steps, "hard_steps": self.hard_steps, "tau_start": self.tau_start,
                "tau_end": self.tau_end, "gumbel": self.gumbel, "straight_through": self.straight_through,
                "hard_lr_scale": self.hard_lr_scale, "done": self.done}
