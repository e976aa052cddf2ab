"""Exception tree, and which failures are worth retrying (`is_transient`).

Every exception the project raises on purpose is an :class:`EpistreamError`. Where a caller expects a
built-in (a ``ValueError`` for a bad value, a ``TimeoutError`` for a wait), the class has both bases.
The narrow classes live beside the code that raises them (module in brackets); the broad ones here.
tests/unit/test_errors.py checks this drawing against the classes.

    EpistreamError
    ├── RetryableError                    try again later: timeouts, 429/5xx, serialization failures
    │   ├── ModelUnavailable              the model endpoint did not answer usably
    │   │   └── ModelRejected             it answered, refusing the request (a 4xx): not an outage
    │   └── ReplyTimeout                  no reply within the caller's timeout; also a TimeoutError
    ├── PermanentError                    the same input will fail the same way: dead-letter it
    │   ├── ContractError                 a message does not match its topic's contract
    │   │   └── ListingRefused            a listing the tenant may not make [epistream.consumers.listing]
    │   ├── ModelOutputError              the model's output failed its JSON schema after retries
    │   ├── SettingsError                 a setting that does not validate; also a ValueError
    │   │   └── RankerFileError           a context ranker file that cannot be used
    │   │                                 [epistream.consumers.retrieval.ranker]
    │   ├── ClaimRejected                 a tenant claim its sender may not make [epistream.core.claims]
    │   ├── ForeignReplyTopic             a reply topic not the tenant's [epistream.messaging.tenant_topics]
    │   ├── UnknownReplyTopic             a reply topic that does not exist [epistream.consumers.outcome]
    │   ├── EventCursorError              `after` offsets that do not fit the events topic; also a ValueError
    │   │                                 [epistream.client.api]
    │   ├── ClientClosed                  a call on a closed EpistreamClient, or waiting when it closed
    │   │                                 [epistream.client.replies]
    │   ├── ToolArgumentError             an agentic tool call's bad argument; also a ValueError
    │   │                                 [epistream.consumers.tools.schemas]
    │   ├── ArgumentError                 an MCP tool's bad argument; also a ValueError [epistream.apps.mcp.arguments]
    │   ├── CursorError                   a forged or damaged MCP events cursor; also a ValueError
    │   │                                 [epistream.apps.mcp.cursor]
    │   ├── TenantAdminError              the broker refused a tenant's login or ACLs [epistream.ops.tenants]
    │   └── Withdrawn                     its asker withdrew the question before it was answered
    │                                     [epistream.consumers.withdrawals]
    └── ServiceError                      a service could not be started or reached
        └── WaitTimeout                   the stack did not do what was waited for; also a TimeoutError
                                          [epistream.ops.readiness]
"""


class EpistreamError(Exception):
    """Root of every error this project raises on purpose."""


class RetryableError(EpistreamError):
    pass


class ModelUnavailable(RetryableError):
    pass


class ReplyTimeout(RetryableError, TimeoutError):
    """No reply came within the caller's timeout (the question may still be answered later)."""


class ModelRejected(ModelUnavailable):
    """The server is up but refused this request (400 and other 4xx but 429): the same request fails
    the same way, so it does not pause a caller that waits out outages (the enrichment breaker)."""


class PermanentError(EpistreamError):
    pass


class ContractError(PermanentError):
    pass


class ModelOutputError(PermanentError):
    pass


class SettingsError(PermanentError, ValueError):
    """A setting that does not validate, named by its environment variable."""


class ServiceError(EpistreamError):
    """An embedded service could not be started or reached."""


def is_transient(exc: BaseException) -> bool:
    """Whether waiting and trying the same thing again can succeed: the one list of what the
    workers retry (the ingest store, the answer worker's hiccups, the model calls)."""
    # Imported here so the exception tree stays importable without the client libraries.
    import openai
    import psycopg
    from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError

    if isinstance(exc, (psycopg.OperationalError, psycopg.errors.SerializationFailure,
                        psycopg.errors.DeadlockDetected)):
        return True  # the database went away, or a transaction lost a race: nothing was written
    if isinstance(exc, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedObject,
                        psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName,
                        psycopg.errors.InvalidCatalogName, psycopg.errors.InsufficientPrivilege,
                        psycopg.errors.InvalidAuthorizationSpecification)):
        # The deployment lacks a table, an extension or a right. Every bound parameter's type is fixed by
        # the contracts, so no record's content raises these: wait for the operator (the lag alert fires)
        # rather than dead-letter every record that meets them.
        return True
    if isinstance(exc, (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)):
        return False  # this message will never fit: the caller must send less
    if isinstance(exc, KafkaError):
        return True  # the broker is unreachable or rebalancing: the offset is not committed yet
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError)):
        return True  # a slow, busy or restarting model server
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500
