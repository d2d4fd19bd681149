"""Counting a store's Redis round trips in a test: every pipeline it sends, with the number of
commands in each (the real Redis still answers them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def pipelines_of(client: Any) -> Iterator[list[int]]:
    """While inside, each pipeline `client` (a redis-py client) sends appends its length to
    the list yielded."""
    sent: list[int] = []
    real = client.pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        pipe = real(*args, **kwargs)
        execute = pipe.execute

        def counting(*eargs: Any, **ekwargs: Any) -> Any:
            sent.append(len(pipe.command_stack))
            return execute(*eargs, **ekwargs)

        pipe.execute = counting
        return pipe

    client.pipeline = counted
    try:
        yield sent
    finally:
        client.pipeline = real
