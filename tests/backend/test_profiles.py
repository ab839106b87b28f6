"""/api/profiles: uploads in every form, reads, per-layer data, guarded deletes, errors."""

import json

from fastapi.testclient import TestClient

from tests.backend.conftest import ANONYMOUS, AUTH, add_plan, add_profile, small_profile, vgg_graph


def test_json_profile_round_trip(client: TestClient) -> None:
    profile_id = add_profile(client)
    detail = client.get(f"/api/profiles/{profile_id}").json()
    assert detail["document"]["layers"][1]["fwd_ms"] == 2.0
    assert (detail["model"], detail["num_layers"], detail["source"]) == ("toy", 4, "json")
    layers = client.get(f"/api/profiles/{profile_id}/layers").json()
    assert layers["name"] == ["layer0", "layer1", "layer2", "layer3"]
    assert layers["param_bytes"] == [1000, 2000, 3000, 4000]
    listed = client.get("/api/profiles").json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == profile_id


def test_pipedream_graph_as_json_and_multipart(client: TestClient) -> None:
    response = client.post(
        "/api/profiles",
        headers=AUTH,
        json={"format": "pipedream", "graph": vgg_graph(), "batch_size": 64, "model": "vgg16"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["source"] == "pipedream"
    assert response.json()["microbatch_size"] == 64
    upload = client.post(
        "/api/profiles/upload",
        headers=AUTH,
        files={"file": ("vgg16/graph.txt", vgg_graph().encode())},
        data={"batch_size": "32", "model": "vgg16"},
    )
    assert upload.status_code == 201, upload.text
    assert upload.json()["num_layers"] == response.json()["num_layers"]
    native = client.post(
        "/api/profiles/upload",
        headers=AUTH,
        data={"name": "mine"},
        files={"file": ("p.json", json.dumps(small_profile()).encode())},
    )
    assert native.status_code == 201 and native.json()["name"] == "mine"


def test_bad_uploads_name_the_field(client: TestClient) -> None:
    bad = small_profile()
    bad["layers"][1]["fwd_ms"] = -1
    response = client.post("/api/profiles", headers=AUTH, json={"profile": bad})
    assert response.status_code == 422
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "profile", "layers", 1, "fwd_ms"]
    assert error["input"] == -1 and "greater than or equal to 0" in error["msg"]
    garbage = client.post(
        "/api/profiles/upload",
        headers=AUTH,
        data={"batch_size": "4"},
        files={"file": ("graph.txt", b"node1 -- what")},
    )
    assert garbage.status_code == 422 and garbage.json()["detail"][0]["loc"] == ["body", "graph"]
    missing = client.post("/api/profiles", headers=AUTH, json={"format": "pipedream"})
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "graph"]  # the union's tag left out
    # graph.txt does not say its batch size: a graph without one is refused, not taken as 1
    unsized = client.post(
        "/api/profiles",
        headers=AUTH,
        json={"format": "pipedream", "graph": vgg_graph(), "model": "vgg16"},
    )
    assert unsized.status_code == 422
    assert unsized.json()["detail"][0]["loc"] == ["body", "batch_size"]
    unsized = client.post(
        "/api/profiles/upload",
        headers=AUTH,
        files={"file": ("vgg16/graph.txt", vgg_graph().encode())},
    )
    assert unsized.status_code == 422
    error = unsized.json()["detail"][0]
    assert (
        error["loc"] == ["body", "batch_size"]
        and "does not say the minibatch size" in (error["msg"])
    )
    before = client.get("/api/profiles").json()["count"]
    for hostile in ("0", "10000000000000", "NaN", "1\x00"):
        refused = client.post(
            "/api/profiles/upload",
            headers=AUTH,
            data={"batch_size": hostile},
            files={"file": ("graph.txt", vgg_graph().encode())},
        )
        assert refused.status_code == 422, (hostile, refused.text)
        assert refused.json()["detail"][0]["loc"] == ["body", "batch_size"]
    # the file's name, which names the model when nothing else does, written by hand: a
    # client library would escape the NUL
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="batch_size"\r\n\r\n8\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="a\x00b.txt"\r\nContent-Type: text/plain\r\n\r\n{vgg_graph()}\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    refused = client.post(
        "/api/profiles/upload",
        headers={**AUTH, "content-type": f"multipart/form-data; boundary={boundary}"},
        content=body,
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()["detail"][0]
    assert error["loc"] == ["body", "file"] and "name contains a NUL" in error["msg"], error
    assert client.get("/api/profiles").json()["count"] == before


def test_mutations_need_the_token(client: TestClient) -> None:
    assert (
        client.post(
            "/api/profiles", json={"profile": small_profile()}, headers=ANONYMOUS
        ).status_code
        == 401
    )
    wrong = {"Authorization": "Bearer nope"}
    assert (
        client.post("/api/profiles", json={"profile": small_profile()}, headers=wrong).status_code
        == 401
    )
    assert client.get("/api/profiles").status_code == 200


def test_upload_limit_answers_413(client: TestClient) -> None:
    huge = b"x" * (3 * 2**20)
    response = client.post(
        "/api/profiles/upload", headers=AUTH, files={"file": ("graph.txt", huge)}
    )
    assert response.status_code == 413
    assert "upload limit" in response.json()["detail"]


def test_delete_refused_while_a_plan_uses_it(client: TestClient) -> None:
    profile_id = add_profile(client)
    plan = add_plan(client, profile_id, [2])
    response = client.delete(f"/api/profiles/{profile_id}", headers=AUTH)
    assert response.status_code == 409 and f"plan(s) {plan['id']}" in response.json()["detail"]
    assert client.delete(f"/api/plans/{plan['id']}", headers=AUTH).status_code == 204
    assert client.delete(f"/api/profiles/{profile_id}", headers=AUTH).status_code == 204
    assert client.get(f"/api/profiles/{profile_id}").status_code == 404
    assert client.get("/api/profiles/999/layers").json() == {"detail": "profile 999 does not exist"}
