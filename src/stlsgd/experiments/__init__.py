"""Experiments: typed configs, building a run from them, sweeps and reports."""
