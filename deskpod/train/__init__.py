"""The trainer: launcher, DDP loop, data, models, checkpoints, metrics, progress."""
