"""The model client against OpenAI-compatible servers: the real local one, and
scripted ones that fail in known ways."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from epistream.core.metrics import Metrics
from epistream.errors import ModelOutputError, ModelUnavailable
from epistream.models.llm import ModelClient, create_client
from epistream.settings.models import JsonMode
from epistream.testing.scripted_llm import ScriptedLLM


class Capital(BaseModel):
    city: str
    country: str


MESSAGES = [{"role": "user", "content": "What is the capital of France? Reply as JSON with city and country."}]


def _count(metrics: Metrics, outcome: str) -> float:
    """Master-role requests with this outcome, over every endpoint."""
    return sum(s.value for m in metrics.model_requests.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["role"] == "master" and s.labels["outcome"] == outcome)


def _client(settings, base_url: str, metrics: Metrics, retries: int = 2) -> ModelClient:
    return ModelClient(create_client(settings, base_url=base_url), role="master", model=settings.llm_model,
                       json_mode=JsonMode.LLAMA_CPP, metrics=metrics, max_retries=retries, backoff_s=0.01)


@pytest.mark.integration
async def test_real_local_model_returns_schema_valid_json(stack):
    metrics = Metrics.create()
    result = await _client(stack, stack.llm_base_url, metrics).complete_json(MESSAGES, Capital, max_tokens=60)
    assert isinstance(result.value, Capital) and result.value.city
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0
    assert _count(metrics, "ok") == 1


async def test_server_errors_are_retried_then_reported(settings):
    metrics = Metrics.create()
    with ScriptedLLM(lambda body: (503, "overloaded")) as server:
        with pytest.raises(ModelUnavailable):
            await _client(settings, server.base_url, metrics, retries=2).complete_json(MESSAGES, Capital, max_tokens=20)
        assert len(server.requests) == 3
    assert _count(metrics, "retry") == 3


async def test_client_errors_are_not_retried(settings):
    metrics = Metrics.create()
    with ScriptedLLM(lambda body: (400, "bad request")) as server:
        with pytest.raises(ModelUnavailable):
            await _client(settings, server.base_url, metrics).complete_json(MESSAGES, Capital, max_tokens=20)
        assert len(server.requests) == 1


async def test_invalid_output_is_retried_with_a_repair_prompt_then_accepted(settings):
    replies = iter([(200, "The capital is Paris."), (200, json.dumps({"city": "Paris", "country": "France"}))])
    with ScriptedLLM(lambda body: next(replies)) as server:
        result = await _client(settings, server.base_url, Metrics.create()).complete_json(
            MESSAGES, Capital, max_tokens=20)
        repair = server.requests[1]["messages"]
    assert result.value == Capital(city="Paris", country="France") and result.attempts == 2
    assert result.usage.calls == 2
    assert repair[-2] == {"role": "assistant", "content": "The capital is Paris."}
    assert "not valid JSON" in repair[-1]["content"]


async def test_output_that_never_validates_is_a_permanent_error(settings):
    with ScriptedLLM(lambda body: (200, json.dumps({"city": "Paris"}))) as server:
        with pytest.raises(ModelOutputError, match="country"):
            await _client(settings, server.base_url, Metrics.create(), retries=1).complete_json(
                MESSAGES, Capital, max_tokens=20)
        assert len(server.requests) == 2
        # The schema travels in llama.cpp's dialect.
        assert server.requests[0]["response_format"]["type"] == "json_object"
        assert server.requests[0]["response_format"]["schema"]["required"] == ["city", "country"]
