"""Chip descriptors (Kirin and Ascend). Imports nothing of ours; read by every stage."""
