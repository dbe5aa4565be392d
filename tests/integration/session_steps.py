"""Steps that move a session through its life the way production does:
``session_create`` as the API calls it, a scheduling pass, and kernel reports
as the agent gateway applies them (``scheduler_app.reconcile.agent_kernel_report``).
"""

from __future__ import annotations

from typing import Any

from agent import protocol
from scheduler_app import reconcile
from scheduler_app import services as scheduler
from sessions_app import services
from sessions_app.models import Kernel, Session, Status


def launch(owner: Any, **spec: Any) -> Session:
    spec.setdefault("image", "bai-kernel/minimal:1")
    spec.setdefault("resources", {"cpu": "1", "mem": "1g"})
    return services.session_create(owner=owner, spec=spec)


def place(session: Session) -> Session:
    """One scheduling pass of the session's group."""
    scheduler.schedule_pass(group_id=session.resource_group_id)
    session.refresh_from_db()
    return session


def report(kernel: Kernel, status: str, **extra: Any) -> None:
    """A kernel_status message from the kernel's agent, applied as the gateway does."""
    kernel.refresh_from_db()
    reconcile.agent_kernel_report(
        agent_id=kernel.agent_id, report={"kernel_id": str(kernel.pk), "status": status, **extra}
    )


def run(session: Session) -> Session:
    """Place the session and report every kernel running."""
    place(session)
    assert session.status == Status.SCHEDULED, session.status_reason
    for kernel in session.kernels.all():
        report(kernel, protocol.KR_RUNNING, container_id=f"c-{kernel.cluster_hostname}")
    session.refresh_from_db()
    assert session.status == Status.RUNNING
    return session


def exit_main(session: Session, exit_code: int) -> Session:
    """main1's command exits with ``exit_code``."""
    report(session.main_kernel(), protocol.KR_EXITED, exit_code=exit_code)
    session.refresh_from_db()
    return session


def destroyed(session: Session) -> Session:
    """The agent confirms every kernel being destroyed is gone, echoing the reason."""
    for kernel in session.kernels.filter(status=Status.TERMINATING):
        report(kernel, protocol.KR_GONE, reason=kernel.status_reason)
    session.refresh_from_db()
    return session


def fail_main(session: Session, reason: str) -> Session:
    report(session.main_kernel(), protocol.KR_ERROR, reason=reason)
    session.refresh_from_db()
    return session
