"""Marshmallow schemas: the wire contract of every request and response, and the source of the
OpenAPI document."""
