"""The vocabulary every stage shares: axes, geometries, views, reports and FlexKV's copy rules."""
