"""Training: the entry points (``entry``: ``fp8lab train``, ``python -m fp8lab.train``), the ``Trainer`` and its
components, checkpoints, export, distributed wrapping, master weights, profiling, a run's folders and the
SageMaker entry script (``sm_entry``)."""
from __future__ import annotations
