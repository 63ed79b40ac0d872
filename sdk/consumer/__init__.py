"""Consumers: push (orderly and concurrent listeners) and lite pull (poll loops)."""
