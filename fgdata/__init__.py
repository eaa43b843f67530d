"""fgdata: prepare, shard, precompute and load data for fast diffusion generators."""

__version__ = "0.3.0"
