"""The ``fp8lab`` command: a thin dispatcher onto the library modules.

Each sub-command lives in the module that does the work; this file only routes
argv there, so adding a command never means touching another module's code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> (module, function taking argv list and returning an exit code, help)
COMMANDS = {
    "env": ("fp8lab.env", "main", "what this machine can do for FP8 (GPU, TE, torchao, backends)"),
    "notebooks": ("fp8lab.notebooks", "main",
                  "run the five tutorial notebooks (papermill) into outputs/, figures as PNGs"),
    "prepare-data": ("fp8lab.data.run_data", "main",
                     "tokenize text into token shards + manifest (a SageMaker train channel)"),
    "train": ("fp8lab.train.entry", "main", "train a model in BF16 or FP8 (CPU, GPUs, torchrun, SageMaker)"),
    "launch": ("fp8lab.launch", "main", "plan / launch BF16 vs FP8 sweeps as SageMaker jobs"),
    "report": ("fp8lab.views.report", "main",
               "runs -> one self-contained HTML page of figures and tables (--docs: README's results)"),
}


DESCRIPTION = """Train LLMs in FP8 with Transformer Engine and find out whether it pays off: check this
machine, run the tutorial notebooks, train BF16 against FP8, plan and launch SageMaker P5
sweeps, and report the measured results."""
FIRST_STEPS = """first steps:
  fp8lab env                                   what works here (FP8 on this GPU? emulated on a CPU)
  fp8lab notebooks run                         the five notebooks, small defaults, into outputs/
  fp8lab train --model llama-tiny --steps 20   a short run on a CPU (writes runs/llama-tiny-bf16/)
  fp8lab report --docs                         the results block of README.md from data/results/
'fp8lab COMMAND --help' shows a command's options."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        parser = argparse.ArgumentParser(prog="fp8lab", description=DESCRIPTION, epilog=FIRST_STEPS,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        for name, (_, _, help_) in COMMANDS.items():
            sub.add_parser(name, help=help_)
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"fp8lab: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        result = getattr(importlib.import_module(module), func)(rest)
    except KeyboardInterrupt:  # Ctrl-C where a command has no handling of its own: one line, not a traceback
        print(f"fp8lab {name}: interrupted (Ctrl-C); run it again to finish", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
