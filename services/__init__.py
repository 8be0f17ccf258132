"""Business rules as plain functions. They never commit: the caller (an API operation, a CLI
command, a worker job) owns the transaction, so a use case that spans several services is one
atomic write."""
