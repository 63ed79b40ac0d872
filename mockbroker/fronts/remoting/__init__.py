"""RocketMQ 4.x remoting: the name server and broker protocol of RocketMQ's own clients.

Served on mockbroker's store and coordination objects, beside the gRPC front.
"""
