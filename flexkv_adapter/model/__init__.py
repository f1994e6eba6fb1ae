"""The vocabulary every stage shares: axes, geometries, views, reports, layer groups, hybrid records, copy rules."""
