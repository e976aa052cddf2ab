"""The read pool of the composition root (pure logic, no database): a standby's pool when
EPISTREAM_DATABASE_READ_URL is set, else the primary's own; the pipeline never reads from a standby;
the read URL is a secret, checked at start-up without being echoed."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import SecretStr

from epistream.errors import SettingsError
from epistream.ops import resources
from epistream.settings.processes import Settings, load_settings

STANDBY = "postgresql://epistream_worker:s3cret@standby-1:5432/epistream"


class FakePool:
    def __init__(self, url: str | None, name: str) -> None:
        self.url, self.name, self.closed = url, name, 0

    async def close(self) -> None:
        self.closed += 1


@pytest.fixture
def opened(monkeypatch) -> list[FakePool]:
    pools: list[FakePool] = []

    async def open_pool(settings: Settings, *, url: str | None = None, name: str = "epistream") -> FakePool:
        pools.append(FakePool(url, name))
        return pools[-1]

    monkeypatch.setattr(resources, "open_pool", open_pool)
    monkeypatch.setattr(resources.Embedder, "from_settings", classmethod(lambda cls, settings: "embedder"))
    return pools


def _open(read_url: str | None, **kwargs: bool) -> resources.Resources:
    settings = Settings().with_overrides(database_read_url=SecretStr(read_url) if read_url else None)
    return asyncio.run(resources.Resources.open(settings, **kwargs))


def test_without_a_read_url_reads_go_to_the_primarys_own_pool(opened):
    shared = _open(None)
    assert shared.read_pool is shared.pool and len(opened) == 1
    asyncio.run(shared.close())
    assert opened[0].closed == 1  # closed once, not once per name


def test_a_read_url_opens_a_pool_of_its_own_on_the_standby(opened):
    shared = _open(STANDBY)
    assert shared.read_pool is not shared.pool
    assert (opened[0].url, opened[1].url, opened[1].name) == (None, STANDBY, "epistream-reads")
    asyncio.run(shared.close())
    assert [p.closed for p in opened] == [1, 1]


def test_the_pipeline_reads_from_the_primary_even_with_a_read_url(opened):
    shared = _open(STANDBY, standby_reads=False)
    assert shared.read_pool is shared.pool and len(opened) == 1


def test_a_bad_read_url_is_named_without_its_password(monkeypatch):
    monkeypatch.setenv("EPISTREAM_DATABASE_READ_URL", "postgresql://epistream_worker:s3cret@standby-1,standby-2/e")
    with pytest.raises(SettingsError, match="EPISTREAM_DATABASE_READ_URL: .*several servers") as raised:
        load_settings()
    assert "s3cret" not in str(raised.value)
    monkeypatch.setenv("EPISTREAM_DATABASE_READ_URL", STANDBY)
    assert load_settings().database_read_url == SecretStr(STANDBY)
