"""The asyncio face of ordermq's clients; same core as the blocking ones."""

from sdk.aio.producer import Producer

__all__ = ["Producer"]
