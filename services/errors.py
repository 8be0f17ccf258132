"""Domain errors. Each carries the stable `errorCode` of SPEC section 7; the HTTP layer maps
codes to statuses in one place."""

from __future__ import annotations


class DomainError(Exception):
    code = "INTERNAL_ERROR"
    default_message = "An unexpected error occurred"
    # Seconds a caller should wait before trying again, sent as Retry-After when set.
    retry_after: int | None = None

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)


class ValidationFailed(DomainError):
    code = "VALIDATION_ERROR"
    default_message = "The request is invalid"

    def __init__(self, message: str | None = None, errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.errors = errors or {}


class Unauthorized(DomainError):
    code = "UNAUTHORIZED"
    default_message = "Authentication required"


class Forbidden(DomainError):
    code = "FORBIDDEN"
    default_message = "Forbidden"


class NotFound(DomainError):
    code = "NOT_FOUND"
    default_message = "Not found"


class Conflict(DomainError):
    code = "CONFLICT"
    default_message = "Conflict"

    def __init__(self, message: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ServiceUnavailable(DomainError):
    code = "SERVICE_UNAVAILABLE"
    default_message = "A backing service is unavailable; nothing was changed, retry shortly"

    def __init__(self, message: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(DomainError):
    code = "RATE_LIMITED"
    default_message = "Too many requests for this API key; retry after the Retry-After seconds"

    def __init__(self, retry_after: int, state: object = None, message: str | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.state = state  # the RateLimit-* headers' numbers (services.rate_limits)
