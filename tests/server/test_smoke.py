"""A first end-to-end check that the server answers over a real socket."""

from helpers.support import RunningServer


def test_create_then_get(server: RunningServer) -> None:
    created = server.ok("promise.create", {"id": "p", "timeoutAt": 5000}, now=1000)
    assert created["promise"]["state"] == "pending"
    assert server.ok("promise.get", {"id": "p"}, now=1001) == created
    status, _ = server.call("promise.get", {"id": "p"}, now=5000)
    assert status == 200
    assert (
        server.ok("promise.get", {"id": "p"}, now=5000)["promise"]["state"] == "rejected_timedout"
    )
