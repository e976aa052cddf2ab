"""A model endpoint's URL may carry a user and password: its name in metric labels, spans, logs and
status lines is host:port (issue 39: a secret reached spans and metrics through `netloc`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client import generate_latest

from epistream.consumers.prompts import AssistantReply
from epistream.core.metrics import Metrics
from epistream.models.llm import JsonMode, ModelClient, endpoint_name, shown_url

SECRET_URL = "https://alice:s3cret-token@models.example.com:8443/v1?key=also-secret"


def test_an_endpoints_name_is_its_host_and_port_only():
    assert endpoint_name(SECRET_URL) == "models.example.com:8443"
    assert endpoint_name("http://127.0.0.1:18080/v1") == "127.0.0.1:18080"
    assert endpoint_name("http://[::1]:8000/v1") == "[::1]:8000"
    assert endpoint_name("https://models.example.com/v1") == "models.example.com"
    assert endpoint_name("not a url with s3cret") == "unparsable-endpoint"
    assert shown_url(SECRET_URL) == "https://models.example.com:8443/v1"


def test_a_model_clients_metrics_never_carry_the_urls_credentials():
    async def create(**_request):  # type: ignore[no-untyped-def]
        message = SimpleNamespace(content='{"relevant": false}', tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], usage=None)

    metrics = Metrics.create()
    client = SimpleNamespace(base_url=SECRET_URL, chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    model = ModelClient(client, role="master", model="m", json_mode=JsonMode.LLAMA_CPP, metrics=metrics)
    asyncio.run(model.complete_json([], AssistantReply, max_tokens=8))
    exposed = generate_latest(metrics.registry).decode()
    assert model.endpoint_label == "models.example.com:8443" and 'endpoint="models.example.com:8443"' in exposed
    assert "s3cret" not in exposed and "alice" not in exposed and "also-secret" not in exposed
