import faulthandler
import os
import sys

import torch

# Triton kernels run on CPU tensors through the interpreter; it must be chosen before any kernel is
# defined (wtc.kernels.* are imported lazily, by the tests). On a GPU machine the same tests run
# compiled. Kernel outputs start as NaN (WTC_POISON) so an unwritten element fails a comparison.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WTC_POISON", "1")

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    """Slow (integration) tests first, in file order: with one worker per core (pytest -n auto) the
    longest ones start at once and the quick ones fill in behind them."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)


HANG_S = 1200   # the longest test takes ~80 s on this project's 2-core machines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test still running after HANG_S seconds dumps every thread's stack and ends its process:
    under xdist it is reported as failed ("worker crashed while running ...") and the run goes on.
    faulthandler's watchdog is a C thread: it fires where a C call holds the GIL and never returns
    (OpenBLAS's SVD on an inf, which held a CI run until its 90-minute limit), where SIGALRM-based
    or Python-thread timeouts never get to run."""
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def rng():
    """Fresh random inputs every run (seeded from the OS), reported on failure via the seed."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
