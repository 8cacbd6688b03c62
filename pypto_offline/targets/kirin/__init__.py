"""Kirin phone NPUs (descriptors arrive with the targets issue)."""
