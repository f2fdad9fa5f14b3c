"""Synthetic raw events for aistack.events.raw: good, malformed and re-sent.

Generation (``plan.generate``) is pure and deterministic for a seed; only
``publish`` talks to Kafka.
"""
