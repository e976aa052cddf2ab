"""OpenTelemetry tracing: the one place it is configured, and the helpers the workers and the client
call (spans, W3C trace context in Kafka headers, trace ids in log lines).

Off unless the standard variables ask for it (`configured`): then nothing here starts a span or
writes a header, and each helper returns at its first test. The OpenTelemetry packages are the
`tracing` extra; without them every helper is off too, so the base install imports this module as is.
Spans never carry turn text, questions, prompts or completions unless EPISTREAM_TRACE_TEXTS asks."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

try:  # the API only: the SDK and the exporter are imported by `setup`, when tracing is on
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the base install: tracing stays off
    trace = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

Headers = list[tuple[str, bytes]]
Attributes = Mapping[str, str | int | float | bool | Sequence[str]]

#: Exporters `setup` can build from OTEL_TRACES_EXPORTER ("otlp" is OTLP over HTTP/protobuf).
EXPORTERS = ("otlp", "console")
#: The trace-context headers the W3C propagator writes (the only ones injected or read).
TRACE_HEADERS = ("traceparent", "tracestate")

_tracer: Any = None  # set by `setup` when tracing is on: the one test every helper makes first
_texts = False


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """The rule: on when OTEL_TRACES_EXPORTER names an exporter (otlp, console), or, with it unset, when
    an OTLP endpoint is given (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); off
    otherwise, and always off with OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def enabled() -> bool:
    return _tracer is not None


def texts_enabled() -> bool:
    """Whether spans may carry user and model text (EPISTREAM_TRACE_TEXTS, and tracing on)."""
    return _tracer is not None and _texts


def setup(service: str, *, texts: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """Configure tracing for this process, once, as `service` (OTEL_SERVICE_NAME wins): spans batched
    to the exporter OTEL_TRACES_EXPORTER names (OTLP/HTTP by default, its endpoint and headers from the
    OTEL_EXPORTER_OTLP_* variables), log lines marked with their trace. True when tracing is on."""
    global _tracer, _texts
    env = os.environ if environ is None else environ
    if _tracer is not None or not configured(env):
        return _tracer is not None
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter_name not in EXPORTERS:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: epistream exports with one of {EXPORTERS}")
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        log.warning("tracing is configured (OTEL_*) but the OpenTelemetry SDK is not installed: "
                    "install epistream[tracing]; tracing stays off")
        return False
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)  # shut down (and flushed) at exit by the SDK itself
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("epistream")
    _texts = texts
    _mark_log_records()
    log.info("tracing on: %s spans as %s", exporter_name, resource.attributes.get("service.name"))
    return True


def shutdown(timeout_s: float = 5.0) -> None:
    """Flush the spans not yet exported (for at most `timeout_s`: a collector that is down must not hold
    an exiting worker) and stop the exporter. Every worker calls it on its way out, `os._exit` included,
    which skips the SDK's own exit hook."""
    if _tracer is None:
        return
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        flush(int(timeout_s * 1000))
    stop = getattr(provider, "shutdown", None)
    if stop is not None:
        stop()


# ---- spans ------------------------------------------------------------------------------------


def _kind(name: str) -> Any:
    return {"consumer": trace.SpanKind.CONSUMER, "producer": trace.SpanKind.PRODUCER,
            "client": trace.SpanKind.CLIENT}.get(name, trace.SpanKind.INTERNAL)


@contextlib.contextmanager
def _started(name: str, kind: str, attributes: Attributes | None, parent: Any, links: Sequence[Any]) -> Iterator[Any]:
    # Not the SDK's exception recording: an error's message may quote what a user said (a validation
    # error quotes its input). The span says which error, by type only.
    with _tracer.start_as_current_span(name, context=parent, kind=_kind(kind), attributes=attributes,
                                       links=list(links), record_exception=False,
                                       set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_attribute("error.type", type(exc).__qualname__)
            current.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__qualname__))
            raise


def span(name: str, *, kind: str = "internal", attributes: Attributes | None = None, parent: Any = None,
         links: Sequence[Any] = ()) -> contextlib.AbstractContextManager[Any]:
    """A span made current for the `with` block (None yielded while tracing is off). `parent`: a context
    from `extract` (None: the current one); `links`: from `link`."""
    if _tracer is None:
        return contextlib.nullcontext()
    return _started(name, kind, attributes, parent, links)


def traced(name: str, attributes: Attributes | None = None) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """An async function run in a span of its own (named `name`; fixed attributes only: never its
    arguments, which hold questions); while tracing is off, one test more per call."""
    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if _tracer is None:
                return await function(*args, **kwargs)
            with _started(name, "internal", attributes, None, ()):
                return await function(*args, **kwargs)
        return run
    return decorate


def set_attributes(current: Any, attributes: Attributes) -> None:
    """Attributes known only at the end of a span (usage tokens, counts); nothing while tracing is off."""
    if current is not None:
        current.set_attributes(dict(attributes))


def set_text(current: Any, key: str, text: str) -> None:
    """A user's or a model's text on a span, only where EPISTREAM_TRACE_TEXTS asks for it."""
    if current is not None and _texts:
        current.set_attribute(key, text)


def messaging(operation: str, kind: str, topic: str, *, partition: int | None = None, offset: int | None = None,
              group: str | None = None, count: int | None = None) -> dict[str, str | int]:
    """The messaging semantic conventions' attributes of a Kafka span (operation: send, process, ...;
    kind: its messaging.operation.type, send, receive or process)."""
    attributes: dict[str, str | int] = {"messaging.system": "kafka", "messaging.operation.name": operation,
                                        "messaging.operation.type": kind, "messaging.destination.name": topic}
    if partition is not None and partition >= 0:
        attributes["messaging.destination.partition.id"] = str(partition)
    if offset is not None and offset >= 0:
        attributes["messaging.kafka.offset"] = offset
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
    if count is not None:
        attributes["messaging.batch.message_count"] = count
    return attributes


# ---- trace context in Kafka headers -------------------------------------------------------------


def inject(headers: Iterable[tuple[str, bytes]] = ()) -> Headers:
    """`headers` plus the current span's W3C trace context, if there is a span to continue (ours, or the
    calling application's own): with none, `headers` unchanged, no header added."""
    out = list(headers)
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return out
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    out.extend((name, value.encode()) for name, value in carrier.items() if name in TRACE_HEADERS)
    return out


def extract(headers: Iterable[tuple[str, bytes]] | None) -> Any:
    """The trace context a record's headers carry (None while tracing is off, or when they carry none:
    a span started with it as parent then begins a trace of its own)."""
    if _tracer is None or not headers:
        return None
    carrier = {name: bytes(value).decode("latin-1") for name, value in headers
               if name in TRACE_HEADERS and value is not None}
    if "traceparent" not in carrier:
        return None
    found = propagate.extract(carrier)
    return found if trace.get_current_span(found).get_span_context().is_valid else None


def link(parent: Any, attributes: Attributes | None = None) -> Any:
    """A link to the span of a context from `extract` (a batch's process span links every record's)."""
    return trace.Link(trace.get_current_span(parent).get_span_context(), attributes)


@contextlib.contextmanager
def attached(parent: Any) -> Iterator[None]:
    """Make `parent` (from `extract`) current for the block; nothing when it is None."""
    if parent is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


# ---- log lines that point at their trace -----------------------------------------------------------


def _mark_log_records() -> None:
    """Every log record made while a span is current gets `trace_id` and `span_id` attributes and ends
    with them (so any formatter, Faust's included, prints them); records outside a span are untouched."""
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            trace_id, span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
            record.__dict__.update(trace_id=trace_id, span_id=span_id)  # for a formatter that names them
            # Literal text with no %: safe whether or not the message has arguments.
            record.msg = f"{record.msg} trace_id={trace_id} span_id={span_id}"
        return record

    logging.setLogRecordFactory(factory)


# ---- where a segment's trace comes from ----------------------------------------------------------

#: (tenant, conversation_id) -> the trace context of the batch's last record of that conversation, while
#: the segments the batch closed are published: each segment's record continues the trace of the turn
#: that closed it, not the batch's (whose process span only links the turns).
_origins: contextvars.ContextVar[Mapping[tuple[str, str], Any] | None] = contextvars.ContextVar(
    "epistream_origins", default=None)


def origins_of(items: Iterable[tuple[str, str, Iterable[tuple[str, bytes]]]]) -> dict[tuple[str, str], Any]:
    """(tenant, conversation_id, headers) in partition order -> each conversation's latest trace context
    (empty while tracing is off)."""
    if _tracer is None:
        return {}
    found: dict[tuple[str, str], Any] = {}
    for tenant, conversation_id, headers in items:
        parent = extract(headers)
        if parent is not None:
            found[(tenant, conversation_id)] = parent
    return found


@contextlib.contextmanager
def publishing(origins: Mapping[tuple[str, str], Any]) -> Iterator[None]:
    """While the block publishes a batch's closed segments, `origin` finds where each came from."""
    token = _origins.set(origins)
    try:
        yield
    finally:
        _origins.reset(token)


def origin(tenant: str, conversation_id: str) -> Any:
    """The trace context of the record that closed this conversation's segment, if the batch being
    published had one (None: the current span, the batch's or none, stays the parent)."""
    found = _origins.get()
    return None if found is None else found.get((tenant, conversation_id))
