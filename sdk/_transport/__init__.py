"""Talking to brokers: channels, calls, status -> exception, wire <-> domain types."""
