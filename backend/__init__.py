"""Backend: the FastAPI service that stores profiles, clusters, plans, runs, metrics,
events and proposals in SQL and drives runtime workers over websockets.

It imports the planner and never torch or the runtime, so it deploys without PyTorch.

Layers, from the wire in: ``routes/`` (HTTP endpoints and the websockets) -> ``services/``
(what a request does) -> ``repositories.py`` (every query) -> ``models.py`` (the tables,
changed only through the migrations in the checkout's ``alembic/``). ``schemas/`` are the
API's shapes; ``app.py`` assembles the application, ``context.py`` what one running backend
holds, ``hub.py`` and ``protocol.py`` the websockets, ``ingest.py`` the metric writer.
docs/architecture.md maps the code; docs/backend.md is the API's reference.
"""
