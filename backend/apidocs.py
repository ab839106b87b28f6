"""``/docs`` (Swagger UI) and ``/redoc`` with their scripts and styles served by the backend.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a machine without internet
they stay blank. The same pages here take the files from the ``fastapi-offline`` package
(only its static folder is read, none of its code runs) under ``/docs-assets/``, and no
favicon or font is fetched from elsewhere.
"""

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def assets_dir() -> Path:
    """The folder of Swagger UI's and ReDoc's files that the package installs."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the package fastapi-offline is not installed: the API's /docs "
            "and /redoc pages need its files (pip install fastapi-offline)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def add_api_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and ``/redoc`` from local files (create the app with
    ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
