"""Signals sessions_app sends and scheduler_app answers (the dependency
points one way: sessions_app never imports scheduler_app)."""

from django.dispatch import Signal

# Sent after commit when a scheduling pass may place something: a session was
# created or ended, an agent joined or changed. Argument: resource_group_id
# (None: every group).
scheduling_requested = Signal()

# Sent after commit when agents must close a gap now (a session's kernels were
# told to end): scheduler_app nudges their gateways, whose reconcile sends the
# destroys. Argument: agent_ids (a list of agent ids).
reconcile_requested = Signal()
