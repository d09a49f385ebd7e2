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


class SRError(WtcError, ValueError):
    """Symbolic regression was given data or options it cannot use; the message names which."""


class HookError(WtcError, ValueError):
    """A hook request wtc cannot carry out (wtc.hooks)."""


class HookNameError(HookError, KeyError):
    """No hook point or module of the given name."""


class HookTypeError(HookError, TypeError):
    """A hooked module's value is not a tensor (nor a tuple starting with one)."""


class BackendError(WtcError, RuntimeError):
    """A kernel backend was asked for (WTC_KERNELS, backend=) but cannot run here (wtc.backend)."""


class BackendNameError(WtcError, ValueError):
    """WTC_KERNELS, a backend= argument or an op name is not one wtc.backend knows."""


class TrainingError(WtcError, FloatingPointError):
    """Training diverged (a non-finite loss); the last training-state checkpoint is intact."""


class TrainConfigError(WtcError, ValueError):
    """A training configuration (wtc.models.training, wtc.models.sparse) has a bad value; the message names the field."""


class TrainConfigTypeError(TrainConfigError, TypeError):
    """Something of the wrong kind was passed to the training loop (a dict for a TrainConfig, ...)."""


class ScanError(WtcError, ValueError):
    """A scan was given tokens, parameters or options it cannot use, or a store it cannot resume."""


class ScanUnavailable(ScanError, RuntimeError):
    """What a scan result was asked for cannot be had from what it kept (also a RuntimeError)."""


class UnknownName(WtcError, KeyError):
    """A name (parameter, hook, scanned weight) that does not exist; the message lists what does."""

    def __str__(self) -> str:       # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class IndexOutOfRange(WtcError, IndexError):
    """An index (of a weight, a position) outside the tensor it addresses; the message gives the shape."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """The checkpoint's files are not there (also a FileNotFoundError)."""


class AceError(WtcError, ValueError):
    """Core extraction or validation was given a layer, inputs, labels or options it cannot use."""


class ModelConfigError(WtcError, ValueError):
    """A token transformer's configuration is out of range; the message names the field."""


class ModelInputError(WtcError, ValueError):
    """A model was called on inputs it cannot take (shape, dtype, values); the message says which."""


class ModelInputTypeError(ModelInputError, TypeError):
    """A model input of the wrong kind (an int where a slice is expected, ...)."""


class TaskError(WtcError, ValueError):
    """A task definition or one of its callables is wrong; the message names the task."""


class ArgumentError(WtcError, ValueError):
    """An argument of a public function is out of range or of the wrong kind (wtc.arguments)."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong kind (also a TypeError, so `except TypeError` keeps working)."""
