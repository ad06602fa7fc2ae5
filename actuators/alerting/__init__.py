"""Alerting: incidents to Slack with Alertmanager's semantics, and nothing lost or doubled.

The pipeline, one file per idea, in the order an alert goes through it:

- alerts.py      an incident seen as an alert: its labels, and what a reader must be told about
- routing.py     the route tree (matchers, continue) picks the receivers
- silences.py    silences (matchers, author, comment, expiry) mute matching alerts
- inhibition.py  a firing source alert mutes matching targets (a node-level incident mutes the
                 pod-level ones on that node)
- grouping.py    aggregation groups with group_wait / group_interval / repeat_interval and the
                 notification log that deduplicates
- blocks.py      Block Kit messages
- outbox.py      the on-disk queue the agent loop writes and the senders drain
- slack.py       delivery with slack-sdk: retries, Retry-After, idempotent posts
- am_alert.py    an incident as Alertmanager's API v2 takes an alert (receivers of kind
                 `alertmanager`, which group, silence and notify themselves)
- am_spool.py    what each Alertmanager URL has been told, on disk
- alertmanager.py  delivery to Alertmanager: a thread per URL, re-sends, backoff
- pipeline.py    the composition the agent holds (the ladder's `notifier`)

The agent loop only evaluates groups and appends to the outbox (SQLite, in the same transaction
as the notification log); one sender thread per receiver (per URL for Alertmanager) delivers.
Docs: docs/alerting.md.
"""
