"""epistream: streaming episodic memory for LLM agents.

The public API is what ``__all__`` names (docs/contracts.md#the-python-api): the client's calls, the
contracts a caller builds or receives, the client's settings, and the errors a caller catches. It is
pinned by tests/unit/test_public_api.py; everything else is the project's own, imported from its
modules (``epistream.contracts.turns``, ``epistream.storage.db``, ...) and free to change.

The floors (docs/design.md#code-map): ``settings``, ``contracts`` and ``errors`` at the bottom; ``core``,
``client``, ``messaging``, ``storage``, ``models`` and ``ops`` above them; ``pipeline`` and ``consumers``
(the workers) and ``infra`` (the embedded stack) above those; ``apps`` (the CLI, the MCP server) on top.
"""

from __future__ import annotations

from .client.api import (
    After,
    ClientClosed,
    EpistreamClient,
    EventBatch,
    EventCursorError,
    ask,
    claim_headers,
    context,
    events,
    events_after,
    events_topic,
    follow_events,
    forget,
    produce_raw,
    produce_turns,
)
from .contracts.events import MemoryEvent
from .contracts.positions import Position
from .contracts.questions import (
    CONTEXT_BUDGET_DEFAULT,
    CONTEXT_BUDGET_MAX,
    CONTEXT_BUDGET_MIN,
    Mode,
    Question,
    TimeRange,
)
from .contracts.replies import Answer, Evidence, MemoryContext, MemoryItem, Progress, ResolvedPeriod
from .contracts.turns import ForgetRecord, Turn
from .errors import (
    ContractError,
    EpistreamError,
    PermanentError,
    ReplyTimeout,
    RetryableError,
    ServiceError,
    SettingsError,
)
from .settings.processes import ClientSettings, load_settings

__version__ = "0.1.0"

__all__ = [
    # the client's calls (epistream.client.api), and the long-lived client they wrap (epistream.client.session)
    "EpistreamClient", "ask", "context", "produce_turns", "produce_raw", "forget", "events", "events_after", "events_topic",
    "follow_events", "claim_headers", "After", "EventBatch",
    # the contracts a caller builds or receives (epistream.contracts)
    "Turn", "Question", "Mode", "TimeRange", "Position", "Answer", "Evidence", "MemoryContext", "MemoryItem",
    "ResolvedPeriod", "Progress", "MemoryEvent", "ForgetRecord", "CONTEXT_BUDGET_DEFAULT", "CONTEXT_BUDGET_MIN",
    "CONTEXT_BUDGET_MAX",
    # the client's settings (epistream.settings)
    "ClientSettings", "load_settings",
    # the errors a caller catches (epistream.errors)
    "EpistreamError", "RetryableError", "PermanentError", "ContractError", "SettingsError", "ServiceError",
    "ReplyTimeout", "EventCursorError", "ClientClosed",
    "__version__",
]
