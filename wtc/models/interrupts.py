"""Ctrl-C and SIGTERM held off until a training step is whole (wtc.models.training).

A KeyboardInterrupt raised in the middle of an update (after the batch was drawn, or between the
optimiser's step and the step counter) would leave a state that cannot be checkpointed faithfully:
the RNG has moved on but the step has not, or the weights have. So while a Trainer with a
checkpoint path runs, SIGINT and SIGTERM only record that they came; the loop looks at the record
between updates, writes the checkpoint at that whole step, puts the previous handlers back and
delivers the signal again, so that whatever would have happened without us (KeyboardInterrupt,
the CLI's cleanup, the default termination) happens then. A second signal before the loop gets
there is delivered at once (a user who presses Ctrl-C twice means it).

Handlers can only be set from the main thread; elsewhere (and for a signal the process ignores)
nothing is held off and only the periodic checkpoints are there to resume from.
"""
from __future__ import annotations

import signal
import threading

SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


class Deferred:
    """The held-off signals of one run: `pending` (a signal number or None) and deliver()."""

    def __init__(self, enabled: bool):
        self.pending: int | None = None
        self._previous: dict[int, object] = {}
        if not enabled or threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            old = signal.getsignal(sig)
            if old in (signal.SIG_IGN, None):     # ignored, or set outside Python: leave it alone
                continue
            self._previous[sig] = old
            signal.signal(sig, self._hold)

    def _hold(self, signum, frame) -> None:
        if self.pending is not None:               # the second one: no more waiting
            self.restore()
            signal.raise_signal(signum)
            return
        self.pending = signum

    def restore(self) -> None:
        """Put the previous handlers back (idempotent)."""
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous = {}

    def deliver(self) -> None:
        """Restore the handlers, then raise the held signal (if any) under them."""
        self.restore()
        sig, self.pending = self.pending, None
        if sig is not None:
            signal.raise_signal(sig)


__all__ = ["Deferred", "SIGNALS"]
