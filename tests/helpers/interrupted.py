"""A ``fp8lab train`` subprocess stopped with Ctrl-C once it has logged some steps, as tests of a stop check it."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from fp8lab.records import metrics as fmetrics


def interrupt_after(cmd: list[str], env: dict, metrics: Path, steps: int = 1,
                    timeout: float = 120) -> tuple[int, str, str]:
    """Run ``cmd``, send SIGINT once ``metrics`` (its metrics.jsonl) holds ``steps`` steps (or ``timeout`` passed, or
    it ended), and return (exit code, stdout, stderr); the process never outlives the call."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and len(
                fmetrics.read_metrics(metrics) if metrics.is_file() else []) < steps:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr
