"""The real pair end to end: `bostudio up` launches the Qwen2.5-Coder 1.5B with its 0.5B as a draft-simple
draft, and the verification probe sees it draft and accept tokens."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

import tests.test_up as up_tests
from tests.netutil import free_port
from tests.test_up import Up

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = REPO / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.mark.skipif(not (TARGET.is_file() and DRAFT.is_file()), reason="the Qwen2.5-Coder pair is not in models/")
def test_draft_simple_launch_of_the_real_pair_drafts_and_accepts(engine, tmp_state: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(up_tests, "READY_TIMEOUT_S", 600)  # two models at -t 1 on a busy 2-core machine
    up = Up([str(TARGET), "--spec", f"draft:{DRAFT}", "--ctx", "4096", "--port", str(free_port())],
            dict(os.environ))
    try:
        fields = up.wait_ready()
        # the probe (runtime.verify) drafted with the 0.5B and the 1.5B accepted some of it
        status = fields["speculation"]
        assert status.startswith("draft-simple - active: the probe drafted"), status
        m = re.search(r"drafted (\d+) tokens, (\d+) accepted", status)
        assert m, status
        drafted, accepted = int(m.group(1)), int(m.group(2))
        assert drafted > 0 and 0 < accepted <= drafted
        argv = " ".join(p for s in up.servers() for p in s.cmdline())
        assert "--spec-type draft-simple" in argv and f"-md {DRAFT}" in argv
    finally:
        rc, err = up.stop(signal.SIGINT)
    assert rc == 0 and "Traceback" not in err, err
