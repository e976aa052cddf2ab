"""Structured model calls through the ``openai`` client to any OpenAI-compatible server.

Output is requested as JSON under a schema, parsed as data and validated by a
pydantic model; it is never executed. Retries are bounded, jittered, and only
for what a retry can fix (timeouts, 429/5xx, output that failed validation).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import openai
from pydantic import BaseModel, ValidationError

from epistream.core import tracing
from epistream.core.metrics import Metrics
from epistream.core.retry import Backoff, retry
from epistream.errors import ModelOutputError, ModelRejected, ModelUnavailable, is_transient
from epistream.settings.models import JsonMode
from epistream.settings.processes import Settings

log = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)

# What PostgreSQL text (and UTF-8) cannot hold: NUL, and the lone surrogates a JSON "\ud800" escape yields.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """Model text as data PostgreSQL can store: the characters it cannot hold are removed
    (model output only: user text is stored verbatim or rejected at ingest)."""
    return _UNSTORABLE.sub("", text)


def _as_data(value: Any) -> Any:
    """Parsed model JSON with `storable` strings, keys included: the output is data, whatever it holds."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, list):
        return [_as_data(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): _as_data(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.calls + other.calls,
        )


@dataclass(frozen=True)
class StructuredResult(Generic[T]):
    value: T
    usage: Usage
    attempts: int


def create_client(
    settings: Settings, *, base_url: str | None = None, timeout_s: float | None = None
) -> openai.AsyncOpenAI:
    # The client's own retries are off: ours are bounded, counted and logged.
    return openai.AsyncOpenAI(
        base_url=base_url or settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value(),
        timeout=timeout_s or settings.llm_timeout_s,
        max_retries=0,
    )


def response_format(schema_model: type[BaseModel], mode: JsonMode) -> dict:
    schema = schema_model.model_json_schema()
    if mode is JsonMode.LLAMA_CPP:
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": schema_model.__name__, "schema": schema, "strict": True}}


def endpoint_name(base_url: str) -> str:
    """host:port of a model endpoint, for metric labels, spans and logs: never its user or password
    (a URL may carry them: `http://user:secret@host/v1`), never its path or query."""
    parsed = urlsplit(base_url)
    if not parsed.hostname:
        return "unparsable-endpoint"  # the URL itself could be a secret: never echo it
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"{host}:{parsed.port}" if parsed.port else host


def shown_url(base_url: str) -> str:
    """A model endpoint's URL as it may be shown (status lines, errors): its scheme, host:port and path."""
    parsed = urlsplit(base_url)
    return f"{parsed.scheme}://{endpoint_name(base_url)}{parsed.path}" if parsed.scheme else endpoint_name(base_url)


def _server_absent(exc: BaseException) -> bool:
    """Nothing answered the connection (refused, reset): a server that is restarting, not a slow one."""
    return isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError)


class ModelClient:
    """One role's model (extractor, assistant or master) behind an injected client."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        *,
        role: str,
        model: str,
        json_mode: JsonMode,
        metrics: Metrics,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        endpoint_label: str | None = None,
        restart_wait_s: float = 30.0,
    ) -> None:
        self._client = client
        self.role = role
        self.model = model
        self._json_mode = json_mode
        self._metrics = metrics
        self._max_retries = max_retries
        # Between attempts: backoff_s, doubled per attempt, times 0.5 to 1.5 (no cap: attempts are few).
        self._between_attempts = Backoff(first_s=backoff_s, jitter_low=0.5, jitter_high=1.5)
        # While a refused connection says the server is restarting: backoff_s doubled up to 5 s, no jitter.
        self._restart_backoff = Backoff(first_s=backoff_s, cap_s=5.0, jitter_low=1.0, jitter_high=1.0)
        # host:port of the endpoint: bounded by configuration, never by input.
        self.endpoint_label = endpoint_label or endpoint_name(str(client.base_url))
        self._last_transient: Exception | None = None
        # A supervised server that crashed is back within seconds: wait for it this long
        # before a refused connection counts as a failed attempt.
        self._restart_wait_s = restart_wait_s

    async def _request(self, **request: Any) -> Any:
        in_flight = self._metrics.model_in_flight.labels(self.role, self.endpoint_label)

        async def call() -> Any:
            with in_flight.track_inprogress():
                return await self._client.chat.completions.create(model=self.model, **request)

        def waiting(exc: BaseException, _attempt: int, delay: float) -> None:
            log.warning("%s model server not answering (%s): waiting %.1fs for it", self.role,
                        type(exc).__name__, delay)

        return await retry(call, backoff=self._restart_backoff, retry_on=_server_absent,
                           within_s=self._restart_wait_s, on_retry=waiting)

    async def _create(self, attempt: int, **request: Any) -> Any | None:
        """One request, measured and traced. None: a retryable failure (already waited out); raises otherwise."""
        with tracing.span(f"chat {self.model}", kind="client", attributes=self._span_attributes(attempt)) as current:
            tracing.set_text(current, "gen_ai.input.messages", json.dumps(request.get("messages", [])))
            response = await self._measured(attempt, **request)
            if current is not None and response is not None:
                self._describe(current, response)
            return response

    def _span_attributes(self, attempt: int) -> dict[str, str | int]:
        """The GenAI conventions' attributes of a model call (what it is, never what it says)."""
        return {"gen_ai.system": "openai", "gen_ai.operation.name": "chat", "gen_ai.request.model": self.model,
                "server.address": self.endpoint_label, "epistream.model.role": self.role,
                "epistream.model.attempt": attempt}

    def _describe(self, current: Any, response: Any) -> None:
        usage = response.usage
        tracing.set_attributes(current, {
            "gen_ai.response.model": str(getattr(response, "model", "") or self.model),
            "gen_ai.usage.input_tokens": usage.prompt_tokens if usage else 0,
            "gen_ai.usage.output_tokens": usage.completion_tokens if usage else 0,
        })
        if response.choices:
            message = response.choices[0].message
            tracing.set_text(current, "gen_ai.output.messages", str(message.content or message.tool_calls or ""))

    async def _measured(self, attempt: int, **request: Any) -> Any | None:
        started = time.perf_counter()
        try:
            response = await self._request(**request)
        except Exception as exc:  # classified just below
            self._metrics.model_latency_seconds.labels(self.role, self.endpoint_label).observe(
                time.perf_counter() - started)
            if not is_transient(exc):
                self._metrics.model_requests.labels(self.role, self.endpoint_label, "failed").inc()
                raise ModelRejected(f"{self.role} model call failed: {type(exc).__name__}: {exc}") from exc
            self._metrics.model_requests.labels(self.role, self.endpoint_label, "retry").inc()
            log.warning("%s model call attempt %d failed: %s", self.role, attempt, type(exc).__name__)
            self._last_transient = exc
            await self._between_attempts.wait(attempt)
            return None
        self._metrics.model_latency_seconds.labels(self.role, self.endpoint_label).observe(time.perf_counter() - started)
        return response

    def _count_usage(self, response: Any) -> Usage:
        usage = Usage(
            response.usage.prompt_tokens if response.usage else 0,
            response.usage.completion_tokens if response.usage else 0,
            1,
        )
        self._metrics.model_tokens.labels(self.role, self.endpoint_label, "prompt").inc(usage.prompt_tokens)
        self._metrics.model_tokens.labels(self.role, self.endpoint_label, "completion").inc(usage.completion_tokens)
        return usage

    async def complete_json(
        self,
        messages: list[dict[str, str]],
        schema_model: type[T],
        *,
        max_tokens: int,
        temperature: float = 0.0,
    ) -> StructuredResult[T]:
        """Ask for JSON matching ``schema_model``; on invalid output, retry with a repair note."""
        usage = Usage()
        conversation = list(messages)
        last_error: Exception | None = None
        for attempt in range(1, self._max_retries + 2):
            response = await self._create(
                attempt, messages=conversation, max_tokens=max_tokens, temperature=temperature,
                response_format=response_format(schema_model, self._json_mode),
            )
            if response is None:
                last_error = self._last_transient
                continue
            usage = usage + self._count_usage(response)
            content = (response.choices[0].message.content or "") if response.choices else ""
            try:
                # strict=False: raw newlines inside strings are harmless in data.
                value = schema_model.model_validate(_as_data(json.loads(content, strict=False)))
            except (json.JSONDecodeError, ValidationError) as exc:
                last_error = exc
                self._metrics.model_requests.labels(self.role, self.endpoint_label, "invalid_output").inc()
                log.warning("%s model output invalid on attempt %d (%d chars)", self.role, attempt, len(content))
                conversation = [
                    *messages,
                    {"role": "assistant", "content": content[:2000]},
                    {"role": "user", "content": _repair_note(exc)},
                ]
                continue
            self._metrics.model_requests.labels(self.role, self.endpoint_label, "ok").inc()
            return StructuredResult(value=value, usage=usage, attempts=attempt)
        if isinstance(last_error, (json.JSONDecodeError, ValidationError)):
            raise ModelOutputError(f"{self.role} output invalid after retries: {_short(last_error)}")
        raise ModelUnavailable(f"{self.role} model unavailable after retries: {_short(last_error)}")

    async def complete_tool_call(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]], *, max_tokens: int
    ) -> tuple[str, str, Usage]:
        """The OpenAI tools API: the one function the model calls, with its raw JSON arguments."""
        usage = Usage()
        for attempt in range(1, self._max_retries + 2):
            response = await self._create(attempt, messages=messages, tools=tools, tool_choice="required",
                                          max_tokens=max_tokens, temperature=0.0)
            if response is None:
                continue
            usage = usage + self._count_usage(response)
            calls = response.choices[0].message.tool_calls if response.choices else None
            if calls:
                self._metrics.model_requests.labels(self.role, self.endpoint_label, "ok").inc()
                return calls[0].function.name, calls[0].function.arguments or "{}", usage
            self._metrics.model_requests.labels(self.role, self.endpoint_label, "invalid_output").inc()
        raise ModelOutputError(f"{self.role} made no tool call after retries")


def _short(exc: BaseException | None, limit: int = 300) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {str(exc)[:limit]}"


def _repair_note(exc: Exception) -> str:
    return (
        "Your previous reply was not valid JSON for the required schema "
        f"({_short(exc, 200)}). Reply again with only the corrected JSON object."
    )
