"""Ascend NPUs (descriptors arrive with the targets issue)."""
