"""``python -m fp8lab.launch ...``: the same as ``fp8lab launch ...``."""
from fp8lab.launch.cli import main

raise SystemExit(main())
