"""RocketMQ 5's gRPC API (apache.rocketmq.v2.MessagingService) on ordermq's core.

A third front beside ordermq's own gRPC (fronts/grpc) and RocketMQ 4's remoting
(fronts/remoting), on a port of its own (BrokerConfig.v2_port), for RocketMQ 5's official
clients (Java, Go, Python, Node.js, C#, Rust). Routes, heartbeats, telemetry settings
and sends are served on the broker's store, groups and scheduler (service.py); receiving
with an invisible time, acks and redelivery are the pop core's (pop.py, receiving.py).
With an ACL file every call is checked first (auth.py: RocketMQ 5's MQv2-HMAC-SHA1
signature, then the permissions of mockbroker.acl's V2_RPCS), refusals answered
UNAUTHORIZED. The generated code it uses lives in mockbroker/_pb_v2, which nothing else
imports.
"""
