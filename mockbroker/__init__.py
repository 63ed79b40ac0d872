"""mockbroker: ordermq's embedded broker, durable and crash-safe despite the name.

Run it as `python -m mockbroker --data-dir DIR`, or embed it::

    from mockbroker import BrokerConfig, EmbeddedBroker

    with EmbeddedBroker(BrokerConfig(data_dir="data")) as broker:
        print(broker.address)
"""

from mockbroker.config import BrokerConfig, FlushMode
from mockbroker.embedded import EmbeddedBroker
from mockbroker.server import Broker

__all__ = ["Broker", "BrokerConfig", "EmbeddedBroker", "FlushMode"]
