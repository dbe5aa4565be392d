"""Batch sessions: main1 runs the start command; the result is SUCCESS on exit
0 and FAILED otherwise, with the exit code; the session then ends by itself
and its logs are kept. Kernel reports arrive as the agent gateway applies
them (session_steps.report).

Persona: ``alice`` runs the jobs.
"""

from __future__ import annotations

import pytest
from session_steps import destroyed, exit_main, launch, report, run

from agent import protocol
from scheduler_app import reconcile
from sessions_app.models import Result, Status

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(alice, image, agent):
    """A running batch cluster: main1 runs the command, sub1 and sub2 help."""
    return run(
        launch(
            alice,
            name="train",
            type="batch",
            startup_command="python train.py",
            roles={"sub": {"replicas": 2}},
        )
    )


def test_only_main1_is_given_the_start_command(job):
    command = reconcile.create_kernels_command(session=job, kernels=list(job.kernels.all()))
    commands = {k["hostname"]: k["startup_command"] for k in command["kernels"]}
    assert commands == {"main1": "python train.py", "sub1": None, "sub2": None}
    assert {k["env"]["BACKENDAI_SESSION_TYPE"] for k in command["kernels"]} == {"batch"}


def test_exit_0_is_a_success_and_the_session_ends_by_itself(job):
    exit_main(job, 0)

    assert job.result == Result.SUCCESS
    assert job.exit_code == 0
    # main1 ended, so the session is ending and the other kernels are told to go.
    assert job.status == Status.TERMINATING
    subs = job.kernels.filter(cluster_role="sub")
    assert {k.status for k in subs} == {Status.TERMINATING}

    destroyed(job)
    assert job.status == Status.TERMINATED
    assert job.result == Result.SUCCESS
    assert not job.kernels.exclude(status=Status.TERMINATED).exists()


@pytest.mark.parametrize("exit_code", [1, 2, 137, -9])
def test_a_non_zero_exit_is_a_failure_with_the_exit_code(job, exit_code):
    exit_main(job, exit_code)
    destroyed(job)

    assert job.status == Status.TERMINATED
    assert job.result == Result.FAILED
    assert job.exit_code == exit_code
    main = job.main_kernel()
    assert main.exit_code == exit_code
    assert main.status_reason == f"exited with code {exit_code}"


def test_a_repeated_exit_report_changes_nothing(job):
    exit_main(job, 3)
    report(job.main_kernel(), protocol.KR_EXITED, exit_code=0)
    job.refresh_from_db()
    assert (job.result, job.exit_code) == (Result.FAILED, 3)


def test_a_single_kernel_job_goes_straight_to_terminated(alice, image, agent):
    job = run(launch(alice, name="one", type="batch", startup_command="echo hi"))
    exit_main(job, 0)
    assert job.status == Status.TERMINATED
    assert job.result == Result.SUCCESS
    assert job.status_reason == "main1: exited with code 0"


def test_the_logs_are_kept_after_the_session_ended(job, api, alice):
    main = job.main_kernel()
    reconcile.kernel_store_log_tail(
        agent_id=main.agent_id, kernel_id=str(main.pk), data="epoch 1\nepoch 2\ndone\n"
    )
    exit_main(job, 0)
    destroyed(job)

    body = api(alice).get(f"/api/v1/sessions/{job.pk}/kernels/main1/logs/").json()
    assert body == {
        "kernel": "main1",
        "status": Status.TERMINATED,
        "live": False,
        "log": "epoch 1\nepoch 2\ndone\n",
    }


def test_an_interactive_session_records_the_exit_code_but_no_result(alice, image, agent):
    session = run(launch(alice, name="shell"))
    exit_main(session, 0)
    assert session.result == Result.UNDEFINED
    assert session.exit_code == 0
    assert session.status == Status.TERMINATED


def test_a_batch_session_needs_a_start_command(alice, image, agent):
    from sessions_app.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        launch(alice, name="nothing", type="batch")
    assert "startup_command" in refused.value.fields
