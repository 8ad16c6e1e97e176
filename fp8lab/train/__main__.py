"""``python -m fp8lab.train ...`` (torchrun and the docs use it): the same as ``fp8lab train ...``."""
from fp8lab.train.entry import main

raise SystemExit(main())
