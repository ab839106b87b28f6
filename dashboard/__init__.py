"""Dashboard: the Dash + Plotly web interface for profiles, plans and runs.

It talks to the backend only through the backend's public HTTP and websocket API, so it can
be deployed apart; it never imports the backend, the runtime or torch.
"""
