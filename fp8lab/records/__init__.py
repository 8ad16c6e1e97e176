"""Files a run writes and who owns them: folder ownership and the run lock, metrics.jsonl records, the token
folder's on-disk format. Imports only ``fp8lab.core``."""
