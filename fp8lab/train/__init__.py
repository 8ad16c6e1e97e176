"""Training: the entry points (``entry``: ``fp8lab train``, ``python -m fp8lab.train``), the ``Trainer`` and its
components, checkpoints, export, distributed wrapping, master weights, profiling, a run's folders and the
SageMaker entry script (``sm_entry``).

The names of the old top-level train module (now ``entry`` here) still import from this package."""
from __future__ import annotations

from fp8lab.core.lazy import old_module_names

__getattr__ = old_module_names(__file__, __name__, "fp8lab.train.entry")  # importing one training module loads no others
