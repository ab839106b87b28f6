"""Backend: the FastAPI service that stores profiles, clusters, plans, runs, metrics,
events and proposals in SQL and drives runtime workers over websockets.

It imports the planner and never torch or the runtime, so it deploys without PyTorch.
"""
