"""Scan executed notebooks for what a reader should not see: stderr streams, warnings, errors.

    python benchmarks/notebook_outputs.py OUT.json outputs/02_convert_to_te/02_convert_to_te.ipynb ...

Writes one record per notebook (cells, stderr texts, lines naming a Warning, errors) and prints a
summary line each; exit 1 when any notebook shows an error or a warning line."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

WARNING = re.compile(r"\b\w*Warning\b")


def scan(path: Path) -> dict:
    nb = json.loads(path.read_text())
    stderr, warnings, errors = [], [], []
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else ""
            if out.get("output_type") == "error":
                errors.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
            if out.get("name") == "stderr" and text.strip():
                stderr.append(f"cell {i}: {text.strip()[:500]}")
            warnings += [f"cell {i}: {line.strip()[:300]}" for line in text.splitlines() if WARNING.search(line)]
    return {"notebook": path.name, "cells": len(nb["cells"]), "stderr": stderr, "warning_lines": warnings,
            "errors": errors}


def main(argv: list[str]) -> int:
    out, paths = Path(argv[0]), [Path(p) for p in argv[1:]]
    recs = [scan(p) for p in paths]
    out.write_text(json.dumps(recs, indent=1) + "\n")
    for r in recs:
        print(f"{r['notebook']}: {r['cells']} cells, {len(r['stderr'])} stderr outputs, "
              f"{len(r['warning_lines'])} warning lines, {len(r['errors'])} errors")
        for line in r["warning_lines"] + r["errors"]:
            print("   ", line)
    return 1 if any(r["warning_lines"] or r["errors"] for r in recs) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
