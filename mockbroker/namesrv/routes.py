"""The name server's route table: which brokers are alive and which queues each one has.

Built from registrations only (registration.py), on an injected clock, as RocketMQ's
RouteInfoManager: a broker is keyed by (broker name, broker id), where id 0 is the master;
a master's registration whose DataVersion changed (or its first) replaces that broker
name's queues of every topic (a topic missing from it has no queues there any more: a
topic deleted on the broker leaves the routes at its next registration; RocketMQ's name
server keeps such a route until an operator deletes it); a broker that has not registered
within its timeout (120 s) is dropped by `expire`, as is one that unregisters. A broker
name with no broker left loses its queues. Routes answer in RocketMQ's JSON
(`TopicRouteData`): queue data sorted by broker name, so that every client numbers the
queues alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mockbroker.namesrv.registration import Registration, TopicQueues, Unregistration
from sdk.clock import Clock


@dataclass
class _Broker:
    cluster: str
    name: str
    broker_id: int
    address: str
    last_seen: float
    timeout_seconds: float
    data_version: tuple[int, int]


class RouteTable:
    """Live brokers and their topics' queues."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._brokers: dict[tuple[str, int], _Broker] = {}
        #: topic -> broker name -> that broker's queues of it.
        self._queues: dict[str, dict[str, TopicQueues]] = {}

    def register(self, reg: Registration) -> bool:
        """Record a registration; True when it changed the routes."""
        key = (reg.broker_name, reg.broker_id)
        known = self._brokers.get(key)
        new_member = known is None or known.address != reg.address
        new_topics = known is None or new_member or known.data_version != reg.data_version
        self._brokers[key] = _Broker(
            reg.cluster, reg.broker_name, reg.broker_id, reg.address, self._clock.now(),
            reg.timeout_seconds, reg.data_version,
        )  # fmt: skip
        if reg.broker_id != 0 or not new_topics:
            return new_member
        self._drop_queues(reg.broker_name)
        for topic, queues in reg.topics.items():
            self._queues.setdefault(topic, {})[reg.broker_name] = queues
        return True

    def unregister(self, unreg: Unregistration) -> bool:
        """Drop a broker that shut down; False when it was not registered at that address."""
        key = (unreg.broker_name, unreg.broker_id)
        known = self._brokers.get(key)
        if known is None or known.address != unreg.address:
            return False
        self._remove([key])
        return True

    def expire(self) -> list[str]:
        """Drop the brokers silent past their timeout; their addresses."""
        now = self._clock.now()
        silent = [k for k, b in self._brokers.items() if now - b.last_seen > b.timeout_seconds]
        addresses = [self._brokers[k].address for k in silent]
        self._remove(silent)
        return addresses

    def route(self, topic: str) -> dict[str, Any] | None:
        """The topic's TopicRouteData, None when no live broker has it."""
        by_broker = self._queues.get(topic)
        if not by_broker:
            return None
        names = sorted(by_broker)
        return {
            "brokerDatas": [self._broker_data(name) for name in names],
            "filterServerTable": {},
            "orderTopicConf": ";".join(f"{n}:{by_broker[n].write_queues}" for n in names),
            "queueDatas": [_queue_data(n, by_broker[n]) for n in names],
        }

    def cluster_info(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_INFO's ClusterInfo: brokers by name, broker names by cluster."""
        names = sorted({b.name for b in self._brokers.values()})
        clusters: dict[str, list[str]] = {}
        for b in self._brokers.values():
            if b.name not in clusters.setdefault(b.cluster, []):
                clusters[b.cluster].append(b.name)
        return {
            "brokerAddrTable": {name: self._broker_data(name) for name in names},
            "clusterAddrTable": {c: sorted(n) for c, n in sorted(clusters.items())},
        }

    def broker_addresses(self) -> list[str]:
        """Every live broker's address, sorted."""
        return sorted(b.address for b in self._brokers.values())

    def _broker_data(self, name: str) -> dict[str, Any]:
        members = sorted((b for b in self._brokers.values() if b.name == name),
                         key=lambda b: b.broker_id)  # fmt: skip
        return {
            "brokerAddrs": {str(b.broker_id): b.address for b in members},
            "brokerName": name,
            "cluster": members[0].cluster if members else "",
        }

    def _remove(self, keys: Iterable[tuple[str, int]]) -> None:
        for key in keys:
            del self._brokers[key]
            name = key[0]
            if not any(b.name == name for b in self._brokers.values()):
                self._drop_queues(name)

    def _drop_queues(self, broker_name: str) -> None:
        for topic in list(self._queues):
            by_broker = self._queues[topic]
            by_broker.pop(broker_name, None)
            if not by_broker:
                del self._queues[topic]


def _queue_data(broker_name: str, queues: TopicQueues) -> dict[str, Any]:
    return {
        "brokerName": broker_name,
        "perm": queues.perm,
        "readQueueNums": queues.read_queues,
        "topicSysFlag": queues.sys_flag,
        "writeQueueNums": queues.write_queues,
    }


def route_json(value: dict[str, Any]) -> bytes:
    """A route or cluster info as the name server sends it: standard JSON, keys sorted."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def no_route(topic: str) -> str:
    """TOPIC_NOT_EXIST's remark, worded as RocketMQ's name server words it."""
    return f"No topic route info in name server for the topic: {topic}"
