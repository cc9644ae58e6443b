"""Setup for the live vLLM tests: the ``vllm`` marker and engine env defaults."""

import os

# Before torch/vllm are imported anywhere in this process: no hub access, a
# 1 GiB CPU KV cache, and no TorchDynamo (else the first logprobs request
# compiles for ~18 s).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: live tests against a real vLLM engine (skipped without vllm)"
    )
