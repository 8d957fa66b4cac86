"""Collectives: the nccl-tests-style benchmark, ring/tree construction on a topology, the cost model."""
