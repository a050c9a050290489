"""The settings transaction (engine/transaction.py): requests laid over each other and answered
together, a take that waits for its models, a failed capture made pending, the answers' shapes."""
import threading
from dataclasses import replace

from engine.events import SettingsApplied, SettingsRefused
from engine.settings import QuantError, Settings
from engine.transaction import SettingsTransaction, applied, refused

BASE = Settings(dtype="fp32")


def test_asking_twice_answers_both_requests_with_the_last_settings():
    tx = SettingsTransaction()
    assert not tx.has_pending and tx.requested(BASE) is BASE and tx.take(lambda s: True) is None
    tx.ask(replace(BASE, weights="int8"), request_id=3)
    tx.ask(replace(BASE, weights="int4"), request_id=4)
    tx.ask(replace(BASE, weights="int4", kv_cache=False))  # id 0: the engine's own, answers nobody
    assert tx.has_pending and tx.requested(BASE).kv_cache is False
    new, ids = tx.take(lambda s: True)
    assert new.weights == "int4" and not new.kv_cache and ids == [3, 4]
    assert not tx.has_pending and tx.take(lambda s: True) is None


def test_a_take_whose_models_are_not_ready_leaves_it_pending():
    tx = SettingsTransaction()
    tx.ask(replace(BASE, weights="int8"), request_id=1)
    assert tx.take(lambda s: False) is None
    assert tx.has_pending and tx.pending_ids == [1]
    assert tx.take(lambda s: s.weights == "int8") == (replace(BASE, weights="int8"), [1])


def test_a_failed_capture_asks_for_eager_over_whatever_is_pending():
    tx = SettingsTransaction()
    tx.drop_capture(replace(BASE, cuda_graphs=False))
    assert not tx.has_pending  # nothing captured: nothing to change
    tx.drop_capture(replace(BASE, cuda_graphs=True))
    assert tx.pending == replace(BASE, cuda_graphs=False)
    tx.ask(replace(BASE, cuda_graphs=True, weights="int8"), request_id=2)
    tx.drop_capture(BASE)
    assert tx.pending == replace(BASE, weights="int8", cuda_graphs=False) and tx.pending_ids == [2]


def test_answers_name_every_request_and_say_nothing_for_no_change():
    old, new = BASE, replace(BASE, weights="int8")
    (answer,) = applied(old, new, [5, 6], step=12)
    assert isinstance(answer, SettingsApplied) and answer.request_ids == (5, 6) and answer.step == 12
    assert answer.changes and answer.settings is new
    assert applied(old, old, [], step=0) == []
    (same,) = applied(old, old, [7], step=0)  # asked for what runs: answered all the same
    assert same.changes == () and same.request_ids == (7,)
    answers = refused([1, 2], QuantError("int4 needs a group size that divides 576\nmore"), old)
    assert [a.request_id for a in answers] == [1, 2] and all(isinstance(a, SettingsRefused) for a in answers)
    assert answers[0].reason == "int4 needs a group size that divides 576" and answers[0].settings is old
    assert [a.request_id for a in refused([], MemoryError(), old)] == [0]
    assert refused([], MemoryError(), old)[0].reason == "MemoryError"


def test_requests_from_many_threads_are_all_answered_once():
    tx = SettingsTransaction()
    taken: list[int] = []
    stop = threading.Event()

    def take_loop():
        while not stop.is_set() or tx.has_pending:
            got = tx.take(lambda s: True)
            if got is not None:
                taken.extend(got[1])

    taker = threading.Thread(target=take_loop)
    taker.start()
    askers = [threading.Thread(target=lambda base=i: [tx.ask(BASE, base * 100 + j + 1) for j in range(50)])
              for i in range(4)]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join()
    stop.set()
    taker.join()
    assert sorted(taken) == sorted(i * 100 + j + 1 for i in range(4) for j in range(50))
