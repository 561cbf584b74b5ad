"""``troth cancel`` and ``troth outbox retry``: troth's operator actions
(``POST /ops/…``, server/operator/actions.py), reported for people or as JSON with ``--json``."""

from __future__ import annotations

from typing import Any, Final

from troth.cli.remote import Remote
from troth.cli.render import Renderer
from troth.plural import counted

#: A cancel of a large tree may take a while: how long the CLI waits for it (s).
CANCEL_TIMEOUT: Final = 600.0


def show_cancel(remote: Remote, r: Renderer, body: dict[str, Any]) -> None:
    answer = remote.action("cancel", body, timeout=CANCEL_TIMEOUT)
    if r.as_json:
        r.json(answer)
        return
    id = answer["id"]
    canceled = answer["canceled"]
    if canceled == 0 and answer["pendingLeft"] == 0:
        print(f"{id}: nothing pending (already done or cancelled)", file=r.out)
    else:
        print(f"{id}: {counted(canceled, 'promise')} cancelled", file=r.out)
    if answer["settledMeanwhile"]:
        n = counted(answer["settledMeanwhile"], "promise")
        print(f"  {n} settled by others meanwhile", file=r.out)
    if answer["pendingLeft"]:
        n = counted(answer["pendingLeft"], "promise")
        print(f"  {n} still pending: the workflow kept growing; run it again", file=r.out)


def show_retry(remote: Remote, r: Renderer, body: dict[str, Any]) -> None:
    answer = remote.action("outbox/retry", body)
    if r.as_json:
        r.json(answer)
        return
    matched = counted(answer["matched"], "failed delivery", "failed deliveries")
    skipped = answer["taskNotPending"]
    if answer["dryRun"]:
        wanted = answer["matched"] - skipped
        print(f"{matched} found; {wanted} would be retried", file=r.out)
    else:
        print(f"{matched} found; {answer['retried']} retried", file=r.out)
        if answer["newer"]:
            print(f"  {answer['newer']} skipped: a newer message or already moved", file=r.out)
    if skipped:
        print(f"  {skipped} skipped: their task is no longer pending", file=r.out)
    if answer["rows"]:
        print("  rows: " + ", ".join(str(i) for i in answer["rows"]), file=r.out)
