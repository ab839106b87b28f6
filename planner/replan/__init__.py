"""Online replanning: ``online`` (whether and how to migrate a running job whose layers
drifted), ``candidates`` (the migrations it weighs) and ``migration`` (what a migration
sends between devices and how long that takes). docs/formats.md describes proposals.
"""
