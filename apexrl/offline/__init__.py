"""Offline data: episodes written out as Farama Minari datasets (``minari_datasets``)."""
