"""Services: what the API does, between the routes (HTTP) and the repositories (SQL)."""
