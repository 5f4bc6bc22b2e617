"""Runnable examples: ``python -m writ_client.examples.refund``."""
