"""A LangChain retriever over epistream's context read (the `langchain` extra; docs/mcp.md, "From agent
frameworks"): the memory a question calls for within a token budget, as one `Document` per item of the
read (a turn verbatim, a gist, a fact), with the item's ids, conversation, times and score as metadata.
No model call: the answer worker ranks and packs, the caller's own model reads.

The read is `EpistreamClient.context`. An async read goes through the `client` given (one producer and
one reply consumer for the process's lifetime), else through a client of its own for the call; a sync
read always has its own, since a client's Kafka clients belong to the event loop that started them."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # the base install has no LangChain
    raise ImportError(f"epistream.integrations.langchain needs LangChain ({exc.name}): "
                      "pip install 'epistream[langchain]'", name=exc.name) from exc
from pydantic import Field

from epistream.client.session import EpistreamClient
from epistream.contracts.positions import Position
from epistream.contracts.questions import CONTEXT_BUDGET_DEFAULT, CONTEXT_BUDGET_MAX, CONTEXT_BUDGET_MIN
from epistream.contracts.replies import MemoryContext, MemoryItem
from epistream.errors import ServiceError
from epistream.settings.processes import ClientSettings

__all__ = ["EpistreamRetriever", "item_document"]

log = logging.getLogger(__name__)

#: The item's fields that are not metadata: its text is the page, its line and token count are the text
#: block's (docs/contracts.md), its resolved dates are long and rarely wanted.
NOT_METADATA = {"text", "line", "tokens", "dates"}


def item_document(item: MemoryItem, *, incomplete: str | None = None) -> Document:
    """One item of a context read as a Document: its text, and as metadata its ids (`turn_id`, `gist_id` or
    `fact_id`, `turn_ids`, `segment_id`), `conversation_id`, `kind`, times (ISO-8601), `rank`, `scores` and
    `score` (the fused score that ranked it); `incomplete`: why the read may miss turns it was to wait for."""
    metadata: dict[str, Any] = item.model_dump(mode="json", exclude=NOT_METADATA, exclude_none=True)
    metadata["score"] = item.scores.get("rrf")
    if incomplete is not None:
        metadata["incomplete"] = incomplete
    return Document(page_content=item.text, metadata=metadata, id=item.turn_id or item.gist_id or item.fact_id)


def _documents(reply: MemoryContext) -> list[Document]:
    if reply.error:
        raise ServiceError(f"the answer worker could not read memory: {reply.error}")
    if reply.incomplete:
        log.warning("a context read may miss turns it was to wait for: %s", reply.incomplete)
    return [item_document(item, incomplete=reply.incomplete) for item in reply.items]


class EpistreamRetriever(BaseRetriever):
    """``EpistreamRetriever(settings=ClientSettings(), tenant="acme").invoke("Where does Ana live?")``: the
    tenant's memory for the query within `budget_tokens`, best first, of `conversation_ids` (None: all)
    and of [`since`, `until`) where set. `after`: positions from `produce_turns`, so the read waits until
    ingest stored them (read your own writes), else marks each Document `incomplete`."""

    settings: ClientSettings
    tenant: str
    budget_tokens: int = Field(CONTEXT_BUDGET_DEFAULT, ge=CONTEXT_BUDGET_MIN, le=CONTEXT_BUDGET_MAX)
    conversation_ids: list[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    after: list[Position] | dict[str, Position] | None = None
    #: a long-lived client (on the same settings) for the async reads; None: one per read
    client: EpistreamClient | None = Field(None, exclude=True)
    #: the tenant's key where claims are checked (`epistream tenant-key`), not the operator's secret
    tenant_key: bytes | None = Field(None, exclude=True, repr=False)
    timeout_s: float = Field(30.0, gt=0)

    async def _read(self, client: EpistreamClient, query: str) -> list[Document]:
        return _documents(await client.context(
            tenant=self.tenant, question=query, budget_tokens=self.budget_tokens, since=self.since,
            until=self.until, conversation_ids=self.conversation_ids, timeout_s=self.timeout_s,
            tenant_key=self.tenant_key, after=self.after))

    async def _read_once(self, query: str) -> list[Document]:
        async with EpistreamClient(self.settings) as client:
            return await self._read(client, query)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        if self.client is not None:
            return await self._read(self.client, query)
        return await self._read_once(query)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        # In async code, call `ainvoke`: asyncio.run refuses to run inside a running event loop.
        return asyncio.run(self._read_once(query))
