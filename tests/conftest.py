import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/models.py, tests/ranks.py
os.environ.setdefault("MUJOCO_GL", "disable")


@pytest.fixture(autouse=True)
def one_thread():
    """The models here are tiny: one intra-op thread beats two on a busy 2-core machine (often by 10x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
