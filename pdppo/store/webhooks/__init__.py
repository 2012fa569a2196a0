"""Webhooks in the store: the endpoints a tenant registers and their delivery log as the API sees
them (`endpoints`), the feed of every job's changes that the job scripts write (`feed`), and what
the webhook workers do with it (`deliveries`: route, take what is due, record each attempt)."""
