"""RocketMQ's remoting wire model, the one copy in the project.

Frames and their headers (`codec`, `command`, `codes`), the message record and batch
layouts (`message_layout`), message ids (`message_ids`), the properties string
(`properties`), subscriptions (`subscription`), and the translation between RocketMQ
messages and ordermq's frames and records (`translate`). The SDK's `rocketmq://`
transport speaks it as a client; mockbroker's remoting and RocketMQ 5 fronts import it
(a client never imports the broker).
"""
