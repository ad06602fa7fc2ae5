"""Per-node ingest tokens: which node a bearer token belongs to (`server.node_tokens_file`).

With one token shared by every agent, any node could post as any other: the server had to
trust the `node` a body names. With this file each node has a token of its own, the token
names the node, and the ingest API refuses a batch that names any other (ui/ingest.py).

The file, typically a mounted Secret, has one node a line:

    # node name     its token, or the token's SHA-256 (the server then never holds it)
    node-a          sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
    node-b          a-token-of-at-least-16-characters

Blank lines and lines starting with `#` are skipped. Each node once, each token once (two
nodes sharing a token could not be told apart). A token given in clear is hashed when the file
is loaded and only its SHA-256 is kept in memory.

It is re-read when it changes (a rotated Secret is picked up without a restart), with the
semantics of every watched file (sloguard/core/watched.py): a file that does not load keeps
the previous map and says why, with the file and line, in the log and in the server's
/readyz (`node-tokens`); a file that was never loaded leaves no node able to post (fail
closed, never open). Errors name lines and nodes, never a token.

Comparison: the offered token is hashed with SHA-256 and the digest looked up in a dict of
the nodes' digests. What the lookup's timing depends on is the digest of what the client
sent, never the token's own characters: learning that a digest shares a prefix with a stored
one brings an attacker no closer to a token (that would take a SHA-256 preimage), so this is
as safe as `hmac.compare_digest` on the token, and, unlike comparing with every node's in
turn, its cost does not grow with the number of nodes. The shared `server.ingest_token` is
still compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sloguard.core.health import ComponentStatus
from sloguard.core.watched import WatchedFiles

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 4 * 1024**2  # ~40,000 nodes of hashed tokens; a larger file is refused
MAX_NODES = 100_000
MAX_TOKEN_CHARS = 8192  # a bearer longer than this is no node's token (not even hashed)
MIN_TOKEN_CHARS = 16  # a token given in clear shorter than this is too easy to guess
CHECK_EVERY_S = 1.0  # the file is stat()ed at most this often, from the requests themselves
NODE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


class NodeTokensError(Exception):
    """The node tokens file cannot be used as it is (the message names file and line)."""


@dataclass(frozen=True)
class NodeToken:
    node: str
    digest: bytes  # SHA-256 of the token
    source: str  # file:line, for errors about it


def digest_of(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def load_node_tokens(path: Path) -> list[NodeToken]:
    """Every line of the file as a NodeToken; NodeTokensError naming the file and line of the
    first problem (the whole file is refused: half a map would lock some nodes out)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise NodeTokensError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise NodeTokensError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise NodeTokensError(f"{path}:{line}: not UTF-8") from None
    tokens: list[NodeToken] = []
    nodes: dict[str, int] = {}
    digests: dict[bytes, tuple[str, int]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        fields = line.split()
        if len(fields) != 2:  # the line itself is never quoted: it may hold a token
            raise NodeTokensError(f"{where}: expected `NODE TOKEN` or `NODE sha256:HEX` "
                                  f"(2 fields separated by spaces), found {len(fields)}")
        node, value = fields
        if not NODE_NAME.match(node):
            raise NodeTokensError(f"{where}: the node name is not a valid node name "
                                  "(letters, digits, '.', '-', '_', at most 253 characters)")
        if value.startswith("sha256:"):
            hexa = value[len("sha256:"):]
            if not SHA256_HEX.match(hexa):
                raise NodeTokensError(f"{where}: node {node}: sha256: must be followed by 64 "
                                      "hex digits (the output of `sha256sum`)")
            digest = bytes.fromhex(hexa)
        else:
            if not MIN_TOKEN_CHARS <= len(value) <= MAX_TOKEN_CHARS:
                raise NodeTokensError(f"{where}: node {node}: a token must have "
                                      f"{MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters")
            digest = digest_of(value)
        if node in nodes:
            raise NodeTokensError(f"{where}: node {node} is already given at line "
                                  f"{nodes[node]}")
        if digest in digests:
            other, at = digests[digest]
            raise NodeTokensError(f"{where}: node {node} has the same token as node {other} "
                                  f"(line {at}): each node needs a token of its own")
        if len(tokens) >= MAX_NODES:
            raise NodeTokensError(f"{where}: more than {MAX_NODES} nodes")
        nodes[node] = number
        digests[digest] = (node, number)
        tokens.append(NodeToken(node, digest, where))
    if not tokens:
        raise NodeTokensError(f"{path}: holds no node (an empty or unmounted Secret?)")
    return tokens


class NodeTokens:
    """The map of `server.node_tokens_file`, reloaded when the file changes; `node_of` tells
    which node a bearer token belongs to."""

    def __init__(self, path: str, check_every: float = CHECK_EVERY_S) -> None:
        self.path = path
        self.check_every = check_every
        self._watched: WatchedFiles[NodeToken] = WatchedFiles(
            "node token", [path], load_node_tokens, key=lambda t: t.node,
            source=lambda t: t.source, load_errors=(NodeTokensError,))
        self._by_digest: dict[bytes, str] = {}
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._dir_error = ""
        self.loaded_ns = 0  # when a good map was last taken in
        self.reload()

    def reload(self) -> None:
        """Read the file if it changed; keep the previous map if it does not load."""
        with self._lock:
            self._reload()

    def refresh(self) -> None:
        """`reload` at most every `check_every` seconds: called on each ingest request, so a
        rotated file is in force within a second of the first request after it, and a flood
        of requests costs one stat() a second. A request that finds another reloading goes on
        with the map in force."""
        if time.monotonic() - self._checked < self.check_every:
            return
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._reload()
        finally:
            self._lock.release()

    def _reload(self) -> None:
        self._checked = time.monotonic()
        if Path(self.path).is_dir():  # WatchedFiles would look for *.yaml in it, find none
            self._dir_error = (f"{self.path}: is a directory: give the file in it (the "
                               "Secret's key, e.g. .../node-tokens/tokens)")
            return
        self._dir_error = ""
        result = self._watched.reload()
        if result.changed or (not self.loaded_ns and self._watched.items):
            self._by_digest = {t.digest: t.node for t in self._watched.items}
            self.loaded_ns = time.time_ns()
            log.info("node tokens: %d nodes from %s", len(self._by_digest), self.path)

    def node_of(self, token: str) -> str | None:
        """The node `token` belongs to, or None."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        return self._by_digest.get(digest_of(token))  # one snapshot: a reload swaps it whole

    @property
    def errors(self) -> dict[str, str]:
        if self._dir_error:
            return {self.path: self._dir_error}
        return self._watched.errors

    @property
    def nodes(self) -> int:
        return len(self._by_digest)

    def status(self) -> ComponentStatus:
        """For /readyz: how many nodes may post, and what is wrong with the file now (checked
        here too, so a broken file is reported while no agent posts)."""
        self.refresh()
        errors = self.errors
        if not self.loaded_ns:
            reason = "no node can post: the file never loaded: " + "; ".join(errors.values())
        elif errors:
            reason = "the previous map is in force: " + "; ".join(errors.values())
        else:
            reason = ""
        return ComponentStatus("node-tokens", ok=not errors and bool(self.loaded_ns),
                               reason=reason, details={
                                   "file": self.path, "nodes": self.nodes,
                                   "loaded_ns": self.loaded_ns or None})
