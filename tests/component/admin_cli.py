"""Running the `ordermq` admin command, and an admin client, against an embedded broker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from click.testing import CliRunner, Result

from mockbroker import EmbeddedBroker
from sdk._transport.broker_client import BrokerClient
from sdk.cli import cli


def run(broker: EmbeddedBroker, *args: str, answer: str | None = None) -> Result:
    """`ordermq --broker <broker> *args`, with `answer` as what is typed at its prompts."""
    return CliRunner().invoke(
        cli, ["--broker", broker.address, *args], input=answer, catch_exceptions=False
    )


def run_json(broker: EmbeddedBroker, *args: str) -> Any:
    """`ordermq --json *args`, which must succeed, its output parsed."""
    result = run(broker, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def client(broker: EmbeddedBroker, body: Any) -> Any:
    """What `body` returns, called with a BrokerClient of `broker` in an event loop."""

    async def main() -> Any:
        c = BrokerClient(broker.address)
        try:
            return await body(c)
        finally:
            await c.close()

    return asyncio.run(main())
