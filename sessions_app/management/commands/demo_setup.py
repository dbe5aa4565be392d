"""Make a fresh checkout usable: a demo admin, a local agent and its token."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from sessions_app.models import Agent, ResourceGroup


class Command(BaseCommand):
    help = "Create the demo admin and the local agent; write the agent's token to a file."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", default=os.environ.get("BAI_DEMO_PASSWORD", "admin"))
        parser.add_argument("--agent-id", default="local")
        parser.add_argument(
            "--token-file", default=str(Path(settings.VAR_DIR) / "local-agent.token")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=options["username"], defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(options["password"])
            user.save()
            self.stdout.write(f"created admin {user.username!r}")
        group, _ = ResourceGroup.objects.get_or_create(name="default")
        agent = Agent.objects.filter(pk=options["agent_id"]).first() or Agent(
            id=options["agent_id"], resource_group=group
        )
        token = agent.set_new_token()  # a fresh token on every start; stored hashed
        agent.save()
        path = Path(options["token_file"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token)
        path.chmod(0o600)
        self.stdout.write(f"agent {agent.pk!r}: token written to {path}")
