"""Durable message storage: commit log, consume queues, flushing and recovery."""
