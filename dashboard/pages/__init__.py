"""The dashboard's pages, one module each (``register_page`` in ``app.py``)."""
