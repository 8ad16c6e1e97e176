"""``python -m fp8lab.data OUT_DIR --source ...``: the same as ``fp8lab prepare-data ...``."""
from fp8lab.data.run_data import main

raise SystemExit(main())
