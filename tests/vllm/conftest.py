"""Setup for the live vLLM tests: the ``vllm`` marker, engine env defaults, the skip of
every module that imports vLLM where it is not installed, and the one vLLM HTTP server
the drivers' and the attach tests share."""

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from kvfence.adapters.vllm_engine import VLLM_MISSING, vllm_installed

# Before torch/vllm are imported anywhere in this process: no hub access, a
# 1 GiB CPU KV cache, and no TorchDynamo (else the first logprobs request
# compiles for ~18 s).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


WITHOUT_VLLM = {"test_vllm_process.py", "test_vllm_quiet.py"}
"""Modules here that import no vLLM (each of their tests that needs it skips itself);
every other module is skipped whole where vLLM is not installed, before its imports run
(they would import this folder, a namespace ``vllm``, in vLLM's place)."""


class _WithoutVllm(pytest.Module):
    """A module of this folder collected where vLLM is not installed: skipped, saying so."""

    def collect(self):
        pytest.skip(f"{self.path.name}: {VLLM_MISSING}")


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    if module_path.name not in WITHOUT_VLLM and not vllm_installed():
        return _WithoutVllm.from_parent(parent, path=module_path)
    return None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: live tests against a real vLLM engine (skipped without vllm)"
    )


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[int, Path]:
    """Versions 0 and 1 of the tiny model, side by side in one folder (``build_tiny_model``)."""
    from kvfence.adapters.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("checkpoints")
    return {v: build_tiny_model(root, v) for v in (0, 1)}


@pytest.fixture(scope="session")
def server_startup(checkpoints, tmp_path_factory) -> Future:
    """A vLLM server on 127.0.0.1 serving ``checkpoints`` at version 0, started in the
    background when first asked for (~35 s idle, 110 s seen on a loaded 2-core machine;
    three processes import vLLM), so that offline tests run meanwhile: a ``Future`` of its
    ``HttpVllmDriver``. One server for the folder (the drivers' HTTP test and the attach
    tests), since a start is the costliest thing here; each user resets what it needs
    (weights, cache, label). At the session's end it is closed, and its whole process
    group must be gone (an error at that teardown otherwise)."""
    from kvfence.adapters.vllm_http import HttpVllmDriver

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(
        HttpVllmDriver.launch,
        checkpoints[0].parent,
        0,
        tmp_path_factory.mktemp("server"),
        startup_timeout=400,
    )
    yield future
    pool.shutdown(wait=True)
    if future.exception() is None:
        driver = future.result()
        assert driver.group_pids()
        driver.close()
        assert not driver.is_alive()
        assert not driver.group_pids(), f"left running: {driver.group_pids()}"
