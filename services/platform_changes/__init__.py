"""How the platform's own changes enter this service.

The marketplace (creating campaigns, accepting offers, verifying posts, moving escrow) lives
elsewhere; this service keeps a read model of it. Each function here is one change the platform
reports: it updates the read model and publishes the SPEC section 6 events that change means,
through `services.events.publish_event`, in the caller's transaction. So an event is published
exactly when its change is committed, and the API never shows a state its webhooks did not
announce. `flask demo seed` and `flask demo simulate` drive these functions like the platform
would.

Rows are locked campaign, then deal, then hold or placement, in that order everywhere, so two
changes to one deal queue instead of deadlocking.
"""
