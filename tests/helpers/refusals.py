"""``fp8lab train``'s refusal as tests check it: exit code 2 and one clear line."""
from __future__ import annotations

from fp8lab.train import entry as ftrain


def refused(args: list[str], capsys) -> str:
    """fp8lab train refuses ``args`` with exit code 2 and one line; that line."""
    capsys.readouterr()
    code = ftrain.main(args)
    err = capsys.readouterr().err.strip()
    assert code == ftrain.EXIT_BAD_OPTIONS, err
    assert err.startswith("fp8lab train: error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err
