"""What the measured numbers do not say: the caveats docs/results.md and the report print under the verdict, a loose
list (a blank line between bullets: each a short block in the source too)."""

CAVEATS = """\
- One GPU of one machine is not a P5 cluster: the per-GPU rates here are the upper end of what
  an 8-GPU instance reaches; the two-GPU runs (scaling table) are the only measurement past one GPU.

- GPUs of one kind differ by a few percent from machine to machine, so pairs measured in one session are the
  fair comparison; the headline takes the fastest run of each kind, which may come from different
  sessions (the full table pairs each FP8 run with the BF16 run of its own study and layout).

- A row whose runs name a memory mode (`bf16-moments`, `fp8-exp-avg`: fewer bytes of optimizer state, for a model
  that does not fit one GPU otherwise) is one GPU's way to fit: FP8 may need activation checkpointing where BF16
  does not, so its best-of-each ratio is lower than the same-layout pair in the full table, and P5 jobs, which
  shard the states over GPUs, are not priced from it.

- MFU divides model FLOPs by the dense BF16 peak for BF16 and FP8 runs alike, so FP8 is not
  flattered by its higher peak.

- The loss studies are short runs on a small corpus, not the source's 24 billion tokens; their
  gaps say whether FP8 tracks BF16 early in training, not where it ends after an epoch.

- The source blog's figures are reported by the source (H100 on P5, its own BF16 baseline), not
  measured here."""
