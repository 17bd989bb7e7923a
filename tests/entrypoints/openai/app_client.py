"""Posting to an in-process app (fastapi's TestClient over build_app): the JSON answer, or a
stream's chunks."""

import json

from fastapi.testclient import TestClient


def post(http: TestClient, path: str, body: dict, headers: dict | None = None) -> dict | list:
    """The JSON answer, or with `stream` the chunks' JSON objects in order."""
    response = http.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return response.json()
    lines = response.text.splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
