"""Named volumes: storage that outlives sandboxes.

Mount one at create with ``file_systems=[FileSystemMount(file_system_id="data",
mount_path="/data")]`` (Tensorlake's shape) — read-only into many sandboxes at once if
wanted. A snapshot records which volumes were mounted where, not their data; a restore or
fork mounts them again by name.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._transport import Client, seg


class Volume:
    """A named volume the daemon holds."""

    def __init__(self, doc: Dict[str, Any], client: Optional[Client] = None):
        self._client = client or Client()
        self._doc = doc

    def __repr__(self) -> str:
        return f"Volume({self.name!r}, size_mb={self.size_mb})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Volume) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def name(self) -> str:
        return str(self._doc["name"])

    @property
    def size_mb(self) -> int:
        return int(self._doc["size_mb"])

    @property
    def used_bytes(self) -> int:
        return int(self._doc.get("used_bytes", 0))

    @property
    def mounted_by(self) -> List[str]:
        """Live sandboxes that mount it."""
        return list(self._doc.get("mounted_by", []))

    @classmethod
    def create(cls, name: str, size_mb: Optional[int] = None, *, client: Optional[Client] = None) -> "Volume":
        """Creates volume ``name`` with a size limit of ``size_mb`` MiB (default 1024)."""
        client = client or Client()
        body: Dict[str, Any] = {"name": name}
        if size_mb is not None:
            body["size_mb"] = size_mb
        return cls(client.request_json("POST", "/v1/volumes", json_body=body), client)

    @classmethod
    def get(cls, name: str, *, client: Optional[Client] = None) -> "Volume":
        client = client or Client()
        return cls(client.request_json("GET", f"/v1/volumes/{seg(name)}"), client)

    @classmethod
    def list(cls, *, client: Optional[Client] = None) -> List["Volume"]:
        client = client or Client()
        doc = client.request_json("GET", "/v1/volumes") or {}
        return [cls(v, client) for v in doc.get("volumes", [])]

    def refresh(self) -> "Volume":
        self._doc = self._client.request_json("GET", f"/v1/volumes/{seg(self.name)}")
        return self

    def delete(self) -> None:
        """Deletes the volume and its data; refused (409) while a live sandbox mounts it."""
        self._client.request_json("DELETE", f"/v1/volumes/{seg(self.name)}")
