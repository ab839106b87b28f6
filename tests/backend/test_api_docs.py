"""``/docs`` and ``/redoc`` work without internet: every script, style and icon they load
comes from the backend itself (``backend/apidocs.py``)."""

import re

from fastapi.testclient import TestClient


def test_the_api_pages_load_nothing_from_elsewhere(client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        response = client.get(page)
        assert response.status_code == 200 and "text/html" in response.headers["content-type"]
        assert "/openapi.json" in response.text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", response.text)
        urls += re.findall(r"""url:\s*["']([^"']+)["']""", response.text)
        assert urls, page
        outside = [url for url in urls if re.match(r"(https?:)?//", url)]
        assert not outside, (page, outside)
        for url in urls:
            if url.startswith("/docs-assets/"):
                asset = client.get(url)
                assert asset.status_code == 200 and len(asset.content) > 1000, url
    assert "SwaggerUIBundle" in client.get("/docs-assets/swagger-ui-bundle.js").text
    for outside in (
        "/docs-assets/../app.py",
        "/docs-assets/%2e%2e/apidocs.py",
        "/docs-assets/..%2fcore.py",
    ):
        assert client.get(outside).status_code == 404, outside
