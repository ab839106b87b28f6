"""Dashboard: the Dash + Plotly web interface for profiles, plans and runs.

It talks to the backend only through the backend's public HTTP and websocket API, so it can
be deployed apart; it never imports the backend, the runtime or torch.

``app.py`` is the shell, ``signin.py`` the gate, ``api.py`` the REST client, ``pages/`` one
module per page (callbacks as plain functions), ``components/`` the figure builders.
docs/architecture.md maps the code; docs/dashboard.md describes the pages.
"""
