import numpy as np
import pytest
import torch


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
