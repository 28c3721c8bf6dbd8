"""Datasets: readers for the paper's files, a registry of named datasets, and client partitions."""

from stlsgd.data.dataset import Dataset
from stlsgd.data.partition import PARTITION_MODES, Partition, make_partition
from stlsgd.data.readers import (
    CIFAR10_CLASSES,
    cifar10_pickle,
    cifar10_png,
    digits_binary,
    mnist10,
    mnist_binary,
    normalize_channels,
    read_idx,
    read_svmlight,
)
from stlsgd.data.registry import DATASETS, fetch, load_dataset, resolve_data_dir

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "PARTITION_MODES",
    "Dataset",
    "Partition",
    "cifar10_pickle",
    "cifar10_png",
    "digits_binary",
    "fetch",
    "load_dataset",
    "make_partition",
    "mnist10",
    "mnist_binary",
    "normalize_channels",
    "read_idx",
    "read_svmlight",
    "resolve_data_dir",
]
