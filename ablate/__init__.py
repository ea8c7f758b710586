"""ablate: layer-freezing ablations of encoder continued pretraining."""

__version__ = "0.1.0"
