"""stlsgd: STL-SGD (Shen et al., AAAI 2021) and its baselines, simulated fast or run on torch.distributed."""

__version__ = "0.1.0"
