"""Sweeps: grid and random search over trainer flags (`scripts/sweep.py`)."""
