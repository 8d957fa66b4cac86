"""Many nodes: deskpod's jobs on a Slurm cluster (SATURNV's step from one box to many)."""
