"""An inspector comm (``kernos.inspector``) over a :class:`events_support.Feed`, as the
JupyterLab panel uses it: requests by id, and the notices the kernel pushed."""

from __future__ import annotations

from typing import Any

from events_support import Feed

__all__ = ["TARGET", "Inspector"]

TARGET = "kernos.inspector"


class Inspector:
    """One inspector comm on a Feed: requests by id, and the notices it was sent."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.comm = feed.open(target=TARGET, data={"v": 1})
        self.next_id = 1

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.feed.messages[self.comm]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [data for data in self.messages if data.get("type") == kind]

    def ask(self, action: str, **fields: Any) -> dict[str, Any]:
        ident = self.next_id
        self.next_id += 1
        self.feed.send(self.comm, {"v": 1, "id": ident,
                                   "request": {"v": 1, "action": action, **fields}})
        replies = [data for data in self.of_type("reply") if data["id"] == ident]
        assert len(replies) == 1, self.messages
        reply: dict[str, Any] = replies[0]["reply"]
        return reply

    def result(self, action: str, **fields: Any) -> dict[str, Any]:
        reply = self.ask(action, **fields)
        assert reply["status"] == "ok", reply
        result: dict[str, Any] = reply["result"]
        return result

    def objects(self) -> dict[str, int]:
        return {entry["name"]: entry["version"]
                for entry in self.result("objects")["objects"]}
