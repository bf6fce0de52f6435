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


# over the README command's budget, run by .ci/run's `pytest -m slow` right after it: every multi-process
# (torch.distributed) test, the example scripts and the experiment drivers run end to end, and the GPU script's
# CPU smoke run
SLOW_FILES = ("tests/test_examples.py", "tests/test_experiments.py", "tests/test_gpu_script.py")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::")[0]
        if item.get_closest_marker("distributed") or path in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
