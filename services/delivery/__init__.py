"""Webhook delivery: docs/delivery.md maps its modules and mechanisms and says why each exists.
Nothing is imported here: each module is imported by name."""
