"""The API's own paths answer JSON (backend/app.py): an unknown path under /api/ is a 404,
a method a path does not take is a 405 naming those it does, never the dashboard's page;
and the OpenAPI document describes the real request shapes."""

from fastapi.testclient import TestClient

from pipestudio.backend.app import create_app
from pipestudio.backend.settings import Settings
from pipestudio.dashboard.app import create_dashboard


def test_unknown_api_paths_answer_json_even_beside_the_dashboard(settings: Settings) -> None:
    app = create_app(settings, dashboard=create_dashboard("http://testserver").server)
    with TestClient(app, headers={"Authorization": "Bearer test-api-token"}) as client:
        for method, path in (
            ("GET", "/api/nope"),
            ("POST", "/api/plans/1/explode"),
            ("GET", "/ws/worker"),
        ):
            response = client.request(method, path)
            assert response.status_code == 404, (method, path)
            assert response.headers["content-type"] == "application/json"
        for method, path, allow in (
            ("PUT", "/api/plans", "GET, POST"),
            ("PUT", "/api/plans/3", "DELETE, GET, PATCH"),
            ("GET", "/api/plans/compare", "POST"),
            ("QUERY", "/api/profiles", "GET, POST"),
            ("HEAD", "/api/runs/1/stop", "POST"),
        ):
            response = client.request(method, path)
            assert response.status_code == 405, (method, path, response.text)
            assert response.headers["allow"] == allow, (method, path)
            assert response.headers["content-type"] == "application/json"
        page = client.get("/")  # the dashboard's (here it cannot reach its backend: 503)
        assert page.status_code in (200, 302, 503) and "no API route" not in page.text


def test_the_openapi_document_states_the_choices(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    body = document["paths"]["/api/plans"]["post"]["requestBody"]["content"]
    choices = body["application/json"]["schema"]["oneOf"]
    assert [c["$ref"].rsplit("/", 1)[1] for c in choices] == [
        "PlanFromPlanner",
        "PlanByHand",
        "PlanFromDocument",
    ]
    assert schemas["PlanByHand"]["additionalProperties"] is False
    assert schemas["ClusterCreate"]["properties"]["cluster"] == {
        "$ref": "#/components/schemas/Cluster",
        "description": "The Cluster document.",
    }
    assert schemas["Cluster"]["properties"]["devices"]["maxItems"] == 100_000
    name = schemas["SessionCreate"]["properties"]["password"]
    assert name["pattern"] == "^[^\\u0000]*$", "text without NUL, as the server enforces"
    refused = client.post("/api/plans", json={"profile_id": 1})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["msg"] == "give exactly one of planner, manual or plan"


def test_refusals_at_the_door_carry_cors_headers(settings: Settings) -> None:
    """A browser page of an allowed origin can read why its request was refused."""
    app = create_app(settings.model_copy(update={"cors_origins": ["http://ui.example"]}))
    with TestClient(
        app, headers={"Authorization": "Bearer test-api-token", "Origin": "http://ui.example"}
    ) as client:
        refused = client.post("/api/clusters", json={"name": "a\u0000"})
        assert refused.status_code == 422
        assert refused.headers["access-control-allow-origin"] == "http://ui.example"
