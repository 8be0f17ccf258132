"""The vocabulary of every list (CONTRACT section 3): page bounds and sort orders, shared by the
schemas that parse a request and the services that page and order the query."""

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# Far past any real list, and small enough that page times limit is an offset every database takes.
MAX_PAGE = 1_000_000
ASCENDING = "asc"
DESCENDING = "desc"
