"""Exception tree.

    EpistreamError
    ├── RetryableError            try again later: timeouts, 429/5xx, serialization failures
    │   └── ModelUnavailable      the model endpoint did not answer usably
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


class PermanentError(EpistreamError):
    pass


class ContractError(PermanentError):
    pass


class ModelOutputError(PermanentError):
    pass


class ServiceError(EpistreamError):
    """An embedded service could not be started or reached."""
