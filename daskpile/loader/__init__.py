"""Reading pile datasets for training: ``PileLoader`` (epochs, ranks, prefetch, resume)."""

from daskpile.loader.pile_loader import CoBatch, LoadStats, PileLoader

__all__ = ["CoBatch", "LoadStats", "PileLoader"]
