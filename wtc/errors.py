"""The one error base. Every error wtc raises on purpose derives from WtcError; those about a value
the caller passed also derive from ValueError, so `except ValueError` keeps working. The CLI prints
any WtcError as one line (`wtc: error: ...`, exit status 2)."""
from __future__ import annotations


class WtcError(Exception):
    """Base of every error wtc raises on purpose."""


class CheckpointError(WtcError, ValueError):
    """A checkpoint (model, training state or attempt result) is missing, corrupt or of another run."""


class StudyError(WtcError, ValueError):
    """A study's configuration or output directory cannot be used."""
