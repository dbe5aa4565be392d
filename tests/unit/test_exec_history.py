"""A code stream's history writes, gathered: a run made and closed within one
gathering is written once, as it ended; everything else keeps its order."""

from __future__ import annotations

from sessions_app.execution import ExecRequest, Sent, coalesce_history


def _sent(mode: str, run_id: str) -> Sent:
    return Sent(ExecRequest(mode=mode, code="1" if mode == "query" else "", run_id=run_id))


def _answer(run_id: str, status: str) -> dict:
    return {"run_id": run_id, "status": status, "exit_code": 0 if status == "finished" else None}


def _change(sent: Sent, answer: dict) -> tuple[Sent, dict, str]:
    change = sent.history_change(answer)
    assert change is not None
    return sent, answer, change


def test_a_quick_run_is_one_create_of_the_run_as_it_ended() -> None:
    sent = _sent("query", "r1")
    first = _change(sent, _answer("r1", "continued"))
    last = _change(sent, _answer("r1", "finished"))
    assert [w[2] for w in (first, last)] == ["create", "close"]

    assert coalesce_history([first, last]) == [(sent, last[1], "create")]


def test_a_run_still_going_stays_a_create_and_a_later_close_stays_a_close() -> None:
    sent = _sent("query", "r1")
    first = _change(sent, _answer("r1", "continued"))
    assert coalesce_history([first]) == [first]

    last = _change(sent, _answer("r1", "finished"))
    assert coalesce_history([last]) == [last]


def test_an_interrupts_answer_closes_the_run_the_query_made() -> None:
    query, interrupt = _sent("query", "r7"), _sent("interrupt", "r7")
    made = _change(query, _answer("r7", "waiting-input"))
    closed = _change(interrupt, _answer("r7", "finished"))

    assert coalesce_history([made, closed]) == [(query, closed[1], "create")]


def test_other_runs_keep_their_order() -> None:
    a, b = _sent("query", "a"), _sent("batch", "b")
    a_made = _change(a, _answer("a", "continued"))
    b_made = _change(b, _answer("b", "continued"))
    b_closed = _change(b, _answer("b", "exec-timeout"))

    assert coalesce_history([a_made, b_made, b_closed]) == [
        a_made,
        (b, b_closed[1], "create"),
    ]
