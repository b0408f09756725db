"""The generated-client test: a client that openapi-python-client generated from the server's own
/openapi.json pays, sees its replay marked as such, gets a 409 for a concurrent duplicate and a
422 naming the differing fields. Run by scripts/contract-check, which generates the client into
PYTHONPATH as the package `client` and starts the server with a slow provider.

Usage: client_test.py BASE_URL API_KEY
"""

import sys
import threading
import time
import uuid

from client import AuthenticatedClient
from client.api.idempotency import get_idempotency_key
from client.api.payments import create_payment, get_payment
from client.models import KeyStateName, KeyStatus, Payment, PaymentRequest, ProblemDetails

BASE_URL, API_KEY = sys.argv[1], sys.argv[2]


def api():
    return AuthenticatedClient(base_url=BASE_URL, token=API_KEY, timeout=30.0)


def pay(key, amount=100.00, currency="BRL"):
    return create_payment.sync_detailed(
        client=api(),
        body=PaymentRequest(amount=amount, currency=currency),
        idempotency_key=key,
    )


def a_payment_is_created_and_its_retry_is_a_marked_replay():
    key = str(uuid.uuid4())
    first = pay(key)
    assert first.status_code == 201, first
    assert isinstance(first.parsed, Payment), first.parsed
    assert first.parsed.amount == 100.00 and first.parsed.currency == "BRL"
    assert first.headers["location"] == f"/payments/{first.parsed.id}"
    assert "idempotent-replayed" not in first.headers, first.headers

    replay = pay(key)
    assert replay.status_code == 201, replay
    assert replay.headers["idempotent-replayed"] == "true", replay.headers
    assert replay.content == first.content, "a replay is the stored response byte for byte"
    assert replay.parsed.id == first.parsed.id

    read = get_payment.sync_detailed(client=api(), id=first.parsed.id)
    assert read.status_code == 200 and read.parsed.charge_id == first.parsed.charge_id, read

    status = get_idempotency_key.sync_detailed(client=api(), key=key)
    assert status.status_code == 200, status
    assert isinstance(status.parsed, KeyStatus)
    assert status.parsed.state == KeyStateName.COMPLETED
    assert status.parsed.response_status == 201


def a_concurrent_duplicate_gets_409_with_retry_after():
    key = str(uuid.uuid4())
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", pay(key)))
    first.start()
    time.sleep(0.5)  # the provider takes 1.5 s: the first request is still running
    duplicate = pay(key)
    first.join()
    assert duplicate.status_code == 409, duplicate
    assert isinstance(duplicate.parsed, ProblemDetails), duplicate.parsed
    assert duplicate.parsed.type_ == "urn:idemlog:problem:request-in-progress"
    assert int(duplicate.headers["retry-after"]) >= 1
    assert results["first"].status_code == 201, results["first"]


def the_same_key_with_another_body_gets_422_naming_the_differing_fields():
    key = str(uuid.uuid4())
    assert pay(key).status_code == 201
    reused = pay(key, amount=250.00)
    assert reused.status_code == 422, reused
    assert isinstance(reused.parsed, ProblemDetails), reused.parsed
    assert reused.parsed.type_ == "urn:idemlog:problem:idempotency-key-reused"
    assert reused.parsed.differing_fields == ["/amount"], reused.parsed.differing_fields


TESTS = [
    a_payment_is_created_and_its_retry_is_a_marked_replay,
    a_concurrent_duplicate_gets_409_with_retry_after,
    the_same_key_with_another_body_gets_422_naming_the_differing_fields,
]

if __name__ == "__main__":
    failed = 0
    for test in TESTS:
        try:
            test()
            print(f"ok     {test.__name__}")
        except Exception as e:  # report every test, then fail
            failed += 1
            print(f"FAILED {test.__name__}: {e!r}")
    print(f"generated client: {len(TESTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
