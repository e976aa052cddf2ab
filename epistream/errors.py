"""Exception tree, and which failures are worth retrying (`is_transient`).

    EpistreamError
    ├── RetryableError            try again later: timeouts, 429/5xx, serialization failures
    │   └── ModelUnavailable      the model endpoint did not answer usably
    │       └── ModelRejected     it answered, refusing the request (a 4xx): not an outage
    └── PermanentError            the same input will fail the same way: dead-letter it
        ├── ContractError         a message does not match its topic's contract
        └── ModelOutputError      the model's output failed its JSON schema after retries
"""


class EpistreamError(Exception):
    """Root of every error this project raises on purpose."""


class RetryableError(EpistreamError):
    pass


class ModelUnavailable(RetryableError):
    pass


class ModelRejected(ModelUnavailable):
    """The server is up but refused this request (400 and other 4xx but 429): the same request fails
    the same way, so it does not pause a caller that waits out outages (the enrichment breaker)."""


class PermanentError(EpistreamError):
    pass


class ContractError(PermanentError):
    pass


class ModelOutputError(PermanentError):
    pass


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
