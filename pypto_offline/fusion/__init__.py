"""Fusion: classification, convex partition, view algebra, cost model (fusion issue)."""
