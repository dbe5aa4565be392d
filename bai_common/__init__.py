"""Rules shared by the manager, the scheduling policy and the agent.

A leaf package: it imports only the standard library, never Django, ``sessions_app``,
``scheduler_app`` or ``agent``, so every part of the project may depend on it.
"""
