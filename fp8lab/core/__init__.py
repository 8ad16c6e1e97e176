"""The ground: helpers that import nothing of fp8lab above them (paths, value checks, errors, the pinned GPU
stack, write probes, hardware facts). Every other folder may import these."""
