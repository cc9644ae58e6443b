"""vLLM's own output goes to the log, not the terminal; no vLLM needed."""

from __future__ import annotations

import logging
import os
import sys

from kvfence.adapters.vllm_quiet import quiet_vllm


def test_output_inside_the_block_goes_to_the_log(tmp_path, capfd):
    log = tmp_path / "out" / "vllm-engine.log"
    with quiet_vllm(log):
        print("python stdout line")
        print("tqdm-like bar", file=sys.stderr)
        os.write(1, b"fd 1 line\n")
        os.write(2, b"fd 2 line\n")
    print("kvfence progress")
    logging.getLogger("vllm").warning("a vLLM warning after the start")
    out, err = capfd.readouterr()
    text = log.read_text()
    for line in ("python stdout line", "tqdm-like bar", "fd 1 line", "fd 2 line"):
        assert line in text
        assert line not in out + err
    assert "a vLLM warning after the start" in log.read_text()
    assert "kvfence progress" in out
