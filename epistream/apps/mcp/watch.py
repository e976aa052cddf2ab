"""The MCP server's one reader of its tenant's memory events (epistream.client's `follow_events`, the
`events` tool's topic), turning each into the notifications it calls for (changes.py, notify.py).

One consumer, kept while the server runs, so a change reaches the clients that asked within about a
second of its event reaching the events topic (a fetch waits at most half a second), and an idle server
holds one connection instead of starting a consumer per poll. The reader keeps where it is; a read that
fails (Kafka unreachable at start, a topic missing) starts again from there: nothing is skipped, only
late. It starts from the topic's end when the server starts: changes from before are not announced. One
reader for the server, however many clients subscribe."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from epistream.apps.mcp import memory
from epistream.apps.mcp.changes import Change, KnownConversations, change_of, resource_of
from epistream.apps.mcp.notify import Notifier
from epistream.settings.processes import McpServerSettings

log = logging.getLogger(__name__)

class EventWatch:
    """Reads the tenant's memory events while the server runs and hands their changes to the notifier."""

    def __init__(self, settings: McpServerSettings, tenant: str, notifier: Notifier) -> None:
        self.settings = settings
        self.tenant = tenant
        self.notifier = notifier
        self.known = KnownConversations()
        self._positioned = asyncio.Event()
        self._failing = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._run(), name="epistream-mcp-events")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def positioned(self) -> bool:
        """Whether the reader holds its place in the events (waiting for it up to the call timeout): from
        then on no change is missed. False while the events cannot be read (Kafka unreachable)."""
        try:
            await asyncio.wait_for(self._positioned.wait(), self.settings.mcp_timeout_s)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        offsets: dict[int, int] | None = None
        while True:
            try:
                async for batch in memory.follow_events(self.settings, tenant=self.tenant, after=offsets,
                                                        tenant_key=self.settings.mcp_key):
                    offsets = batch.next_offsets
                    await self._positioned_again()
                    for event in batch.events:
                        await self._announce(change_of(event, self.known))
            except memory.EventCursorError as exc:  # the events topic was made again: from its end
                log.warning("memory events cursor dropped (%s): reading from now on", exc)
                offsets = None
            except Exception as exc:  # Kafka unreachable, a topic missing: tell once, retry from the same place
                await self._failed(exc)
                await asyncio.sleep(self.settings.mcp_events_retry_s)

    async def _positioned_again(self) -> None:
        self._positioned.set()
        if self._failing:
            self._failing = False
            await self.notifier.broadcast("notice", "memory events readable again: resource notifications resume")

    async def _failed(self, exc: Exception) -> None:
        if self._failing:
            return
        self._failing = True
        await self.notifier.broadcast(
            "error", f"memory events unreadable ({type(exc).__name__}; Kafka at {self.settings.kafka_bootstrap}): "
            f"resource notifications wait, retrying every {self.settings.mcp_events_retry_s:g} s")

    async def _announce(self, change: Change) -> None:
        updated = set(change.updated)
        if change.everything:  # the whole tenant forgotten: every resource anyone may watch
            updated |= {u for u in self.notifier.subscribed() if resource_of(u) is not None}
        if updated:
            await self.notifier.updated(updated)
        if change.listed:
            await self.notifier.list_changed()
