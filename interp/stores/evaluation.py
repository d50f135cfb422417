"""Moved to :mod:`interp.dictionaries.evaluation` (the held-out figures of every dictionary's
training use it); this path stays for the code that imports it from here."""

from interp.dictionaries.evaluation import CentredSquares

__all__ = ["CentredSquares"]
