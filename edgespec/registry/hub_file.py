"""What a file on the Hugging Face hub is: a repository, a file in it and a revision, checked
so that it cannot escape the cache or confuse the hub. Plain Python: naming a hub file needs
no hub client (:mod:`.hub` fetches it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .downloads import DownloadError, check_hub_spec

COMMIT_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class HubFile:
    """One file of a model repository at a revision; ``sha256``/``size`` are expected values
    known in advance (from the registry), or None.

    Construction refuses what could escape the cache or confuse the hub: repo ids that are not
    ``owner/name``, file names with ``..``, empty parts, backslashes or a leading ``/``.
    """

    repo: str
    filename: str
    revision: str = "main"
    sha256: Optional[str] = None
    size: Optional[int] = None

    def __post_init__(self):
        check_hub_spec(self.repo, self.filename, self.revision)
        if self.sha256 is not None and not SHA256_RE.fullmatch(self.sha256.lower()):
            raise DownloadError(f"{self}: expected sha256 must be 64 hex digits")

    @classmethod
    def parse(cls, spec: str, revision: Optional[str] = None) -> "HubFile":
        """``OWNER/NAME/path/to/file.gguf`` (optionally ``...@REVISION``) -> HubFile."""
        if "@" in spec and revision is None:
            spec, revision = spec.rsplit("@", 1)
        parts = spec.strip().split("/", 2)
        if len(parts) < 3:
            raise DownloadError(f"'{spec}' is not REPO_ID/FILENAME, e.g. "
                                "Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf")
        return cls(f"{parts[0]}/{parts[1]}", parts[2], revision or "main")

    def __str__(self) -> str:
        at = "" if self.revision == "main" else f"@{self.revision}"
        return f"{self.repo}/{self.filename}{at}"

    @property
    def pinned(self) -> bool:
        return bool(COMMIT_RE.fullmatch(self.revision))
