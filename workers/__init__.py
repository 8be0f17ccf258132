"""Background work on RQ: the Redis connection, the queues, and the `flask worker` command."""
