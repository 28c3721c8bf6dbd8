"""Executors run a plan on a problem: the vectorised simulator and the torch.distributed executor."""
