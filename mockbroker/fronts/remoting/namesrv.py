"""The name server: RocketMQ clients ask it where a topic's queues are.

mockbroker is one broker that is also its own name server (on a port of its own): every
route names this broker as the master (broker id 0) of all of a topic's queues, at the
address its remoting port is reached by. A topic that does not exist gets TOPIC_NOT_EXIST,
but for two kinds RocketMQ clients rely on: the default topic `TBW102` while topics are
created on first send (producers fall back to its route and the broker creates the topic
on their send), and a group's retry topic `%RETRY%<group>` (one queue; it exists once the
first message is sent back, and reads as empty until then) of a valid group name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.namesrv.routes import no_route, route_json
from mockbroker.state import BrokerState
from mockbroker.topics import DEFAULT_TOPIC, check_any_topic
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import Fields, RemotingCommand, RemotingError
from sdk._validation import RETRY_PREFIX

#: PermName.PERM_READ | PermName.PERM_WRITE.
PERM_READ_WRITE = 6
RETRY_QUEUES = 1


def namesrv_handlers(
    state: BrokerState, broker_address: Callable[[], str], cluster: str = "DefaultCluster"
) -> dict[int, Handler]:
    """GET_ROUTEINFO_BY_TOPIC and GET_BROKER_CLUSTER_INFO for this one broker.

    `broker_address` answers "host:port" of the broker's remoting port, as clients reach it.
    """
    broker_name = state.config.broker_name

    def broker_data() -> dict[str, Any]:
        return {"brokerAddrs": {"0": broker_address()}, "brokerName": broker_name,
                "cluster": cluster}  # fmt: skip

    def queue_count(topic: str) -> int | None:
        found = state.store.topics.find(topic)
        if found is not None:
            return found.queue_count
        if topic == DEFAULT_TOPIC and state.config.auto_create_topics:
            return state.config.default_queues
        if topic.startswith(RETRY_PREFIX):
            try:
                check_any_topic(topic)  # the group's name
            except BrokerError as exc:
                raise RemotingError(
                    ResponseCode.TOPIC_NOT_EXIST, f"{no_route(topic)} ({exc.message})"
                ) from None
            return RETRY_QUEUES
        return None

    async def route(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        topic = Fields.of(request).string("topic")
        count = queue_count(topic)
        if count is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, no_route(topic))
        body = {
            "brokerDatas": [broker_data()],
            "filterServerTable": {},
            "orderTopicConf": f"{broker_name}:{count}",
            "queueDatas": [
                {
                    "brokerName": broker_name,
                    "perm": PERM_READ_WRITE,
                    "readQueueNums": count,
                    "topicSysFlag": 0,
                    "writeQueueNums": count,
                }
            ],
        }
        return request.response(body=route_json(body))

    async def cluster_info(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        body = {
            "brokerAddrTable": {broker_name: broker_data()},
            "clusterAddrTable": {cluster: [broker_name]},
        }
        return request.response(body=route_json(body))

    return {
        RequestCode.GET_ROUTEINFO_BY_TOPIC: route,
        RequestCode.GET_BROKER_CLUSTER_INFO: cluster_info,
    }
