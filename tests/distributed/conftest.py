"""Fixtures of the distributed tests: a private f* cache (launched ranks inherit it through the environment)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STLSGD_CACHE", str(tmp_path_factory.getbasetemp() / "stlsgd-cache"))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
