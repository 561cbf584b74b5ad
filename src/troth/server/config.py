"""Configuration: defaults < ``troth.toml`` < ``TROTH_*`` environment < flags.

Every setting has one name in every form: ``retry_timeout`` is ``retry_timeout`` in
the TOML file, ``TROTH_RETRY_TIMEOUT`` in the environment and ``--retry-timeout`` on
the command line.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from troth.durations import parse_duration
from troth.flow.limits import limits_text, parse_limits
from troth.protocol.address import valid_subject
from troth.protocol.limits import Limits


class ConfigError(ValueError):
    pass


#: Deepest ``max_depth`` allowed: msgspec decodes recursively and the interpreter
#: stops it near 1000 frames; a malformed body may pass the check at up to twice it.
MAX_DEPTH = 256
#: Longest ``max_id_length``: ids are b-tree keys, and PostgreSQL refuses an index
#: entry longer than about 2700 bytes.
MAX_ID_LENGTH = 2048


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8001
    store: str = "sqlite"  # memory | sqlite | postgres
    db: str = "troth.db"
    synchronous: str = "full"  # full | normal (SQLite)
    lone_commit: str = "loop"  # loop | writer: where a batch alone commits (SQLite)
    postgres_url: str = ""  # libpq URI or key=value string (store = postgres)
    postgres_pool_mode: str = "session"  # transaction: behind PgBouncer's pool_mode=transaction
    postgres_listen_url: str = ""  # direct (unpooled) URL for LISTEN; default postgres_url
    postgres_readers: int = 2  # connections serving read-only requests (0: the writer's)
    postgres_outage_wait: float = 5.0  # seconds a request waits for an unreachable database
    debug: bool = False
    retry_timeout: int = 5000  # ms; how often a pending task re-emits its execute
    max_body: int = 10 * 1024 * 1024  # bytes; larger POST bodies get 413
    max_depth: int = 64  # JSON nesting levels of a request body; deeper gets 400
    max_id_length: int = 1024  # UTF-8 bytes of an id (and pid, address, cron, tag key)
    max_tag_length: int = 65536  # UTF-8 bytes of one tag value
    max_sse: int = 4096  # open SSE connections on this node; more get 503
    max_sse_per_group: int = 1024  # open SSE connections of one poll group; more get 429
    header_timeout: float = 10.0  # seconds for a request's headers to arrive (then 408)
    body_timeout: float = 30.0  # seconds for a request's body after its headers (then 408)
    idle_timeout: int = 5  # seconds an idle keep-alive connection stays open
    log_level: str = "info"
    access_log: bool = True
    log_format: str = "plain"  # plain | json (one JSON object a line; server/logs.py)
    tracing: bool = False  # OpenTelemetry spans over OTLP/HTTP (troth[otel]; OTEL_* variables)
    server_url: str = ""  # goes into execute messages' head.serverUrl
    keepalive: float = 5.0  # seconds between SSE keep-alive comments
    send_timeout: float = 30.0  # seconds; a send that takes longer is outcome-unknown
    max_attempts: int = 5  # sends of one outbox row before it fails
    dispatch_concurrency: int = 64  # sends in flight at once
    outbox_retention: float = 3600.0  # seconds delivered outbox rows are kept
    #: Limits set at start on groups that have none (``troth/flow``):
    #: "GROUP:concurrency=N,rate=R/s,burst=B;…", or a ``[flow_limits]`` table in
    #: troth.toml.
    flow_limits: str = ""
    node_id: str = ""  # this node's name among several (postgres); default host-pid-random
    node_timeout: float = 5.0  # seconds without a heartbeat before peers count a node dead
    retention: str = ""  # e.g. 7d: delete workflows settled longer ago; "" or 0: keep all
    retention_batch: int = 100  # workflows (root promises) one retention batch looks at
    retention_interval: float = 10.0  # seconds between retention passes
    archive_dir: str = ""  # with retention: write each deleted workflow here first (gzip)
    auth_publickey: str = ""  # PEM path of the JWT key; "none": unsigned tokens (dev only)
    auth_issuer: str = ""  # required ``iss`` of every token, when set
    auth_audience: str = ""  # required ``aud`` of every token, when set
    # Bearer tokens troth sends with HTTP push (execute/unblock POSTs); never shown
    # in a repr, so a logged Settings cannot leak them.
    push_token: str = field(default="", repr=False)  # for every http(s) target
    push_tokens: str = field(default="", repr=False)  # "host=token,host:port=token"
    tls_cert: str = ""  # PEM certificate chain: serve HTTPS (with tls_key)
    tls_key: str = ""  # PEM private key of tls_cert
    cors_allow_origins: str = ""  # "https://a.example,https://b.example" or "*"; off if empty
    ui: bool = True  # the dashboard at GET /ui (static files; its data needs admin with auth)
    nats_url: str = ""  # nats://host:4222 (comma-separated for several): NATS ingress + nats://
    nats_prefix: str = "resonate"  # requests arrive on {nats_prefix}.requests.>
    workers: int = 1  # processes serving one port, each a node (postgres; server/workers.py)

    def __post_init__(self) -> None:
        if self.store not in ("memory", "sqlite", "postgres"):
            raise ConfigError(f"store must be memory, sqlite or postgres, not {self.store!r}")
        if self.store == "postgres" and not self.postgres_url:
            raise ConfigError("store postgres needs postgres_url (--postgres-url)")
        if self.postgres_pool_mode not in ("session", "transaction"):
            raise ConfigError("postgres_pool_mode must be session or transaction")
        if self.postgres_readers < 0 or self.postgres_outage_wait < 0:
            raise ConfigError("postgres_readers and postgres_outage_wait must be >= 0")
        if self.lone_commit not in ("loop", "writer"):
            raise ConfigError(f"lone_commit must be loop or writer, not {self.lone_commit!r}")
        if self.synchronous not in ("full", "normal"):
            raise ConfigError(f"synchronous must be full or normal, not {self.synchronous!r}")
        if self.retry_timeout <= 0:
            raise ConfigError("retry_timeout must be > 0 (milliseconds)")
        if self.keepalive <= 0 or self.send_timeout <= 0:
            raise ConfigError("keepalive and send_timeout must be > 0 (seconds)")
        if self.outbox_retention < 0:
            raise ConfigError("outbox_retention must be >= 0 (seconds)")
        if self.max_attempts < 1 or self.dispatch_concurrency < 1:
            raise ConfigError("max_attempts and dispatch_concurrency must be >= 1")
        if self.node_timeout <= 0:
            raise ConfigError("node_timeout must be > 0 (seconds)")
        if len(self.node_id) > 200 or any(c in self.node_id for c in " \x00"):
            raise ConfigError("node_id must be at most 200 characters, without spaces")
        if self.max_body <= 0:
            raise ConfigError("max_body must be > 0 (bytes)")
        if not 2 <= self.max_depth <= MAX_DEPTH:
            # An envelope is 2 deep at least; msgspec recurses, ~1000 levels at most.
            raise ConfigError(f"max_depth must be 2..{MAX_DEPTH}, not {self.max_depth}")
        if self.max_id_length < 64 or self.max_tag_length < 64:
            raise ConfigError("max_id_length and max_tag_length must be >= 64 (bytes)")
        if self.max_id_length > MAX_ID_LENGTH:
            # PostgreSQL refuses a b-tree index entry past ~2700 bytes (a 500).
            raise ConfigError(f"max_id_length must be <= {MAX_ID_LENGTH} (bytes)")
        if self.max_sse < 1 or self.max_sse_per_group < 1:
            raise ConfigError("max_sse and max_sse_per_group must be >= 1")
        if self.header_timeout <= 0 or self.body_timeout <= 0 or self.idle_timeout <= 0:
            raise ConfigError("header_timeout, body_timeout and idle_timeout must be > 0")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, not {self.port}")
        if (self.auth_issuer or self.auth_audience) and not self.auth_publickey:
            raise ConfigError("auth_issuer and auth_audience need auth_publickey")
        try:
            parse_duration(self.retention or "0")
        except ValueError as exc:
            raise ConfigError(f"retention: {exc}") from None
        try:
            parse_limits(self.flow_limits)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.retention_batch < 1 or self.retention_interval <= 0:
            raise ConfigError("retention_batch must be >= 1 and retention_interval > 0")
        if self.archive_dir and not self.retention_ms:
            raise ConfigError("archive_dir needs retention (it archives what retention deletes)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: give both or neither")
        push_token_map(self.push_tokens)  # raises on a malformed list
        cors_origins(self.cors_allow_origins)
        if self.nats_prefix != self.nats_prefix.strip() or not valid_subject(self.nats_prefix):
            raise ConfigError(
                f"nats_prefix must be a NATS subject without wildcards, not {self.nats_prefix!r}"
            )
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, not {self.workers}")
        if self.workers > 1 and self.store != "postgres":
            # One SQLite file has one writer (and a memory store one process): more
            # processes would only queue for its lock, or each hold a store of its own.
            raise ConfigError("workers > 1 needs store postgres (each process is a node)")
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ConfigError(f"unknown log_level {self.log_level!r}")
        if self.log_format not in ("plain", "json"):
            raise ConfigError(f"log_format must be plain or json, not {self.log_format!r}")

    @property
    def retention_ms(self) -> int:
        """The retention horizon in milliseconds; 0: retention is off."""
        return parse_duration(self.retention or "0")

    @property
    def limits(self) -> Limits:
        return Limits(self.max_depth, self.max_id_length, self.max_tag_length)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return self.server_url or f"{scheme}://{self.host}:{self.port}"


def push_token_map(text: str) -> dict[str, str]:
    """``push_tokens`` as ``{host or host:port: token}`` (hosts lower-cased).

    The flag and environment form is ``host=token,host:port=token``; a TOML table is
    turned into that form by :func:`coerce`.  A token may contain ``=`` (base64
    padding): only the first ``=`` of an entry separates."""
    tokens: dict[str, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        host, sep, token = entry.partition("=")
        host = host.strip().lower()
        token = token.strip()
        if not sep or not host or not token or "/" in host or " " in host:
            # Never quote the entry: it holds a secret.
            raise ConfigError(
                f"push_tokens: entry {len(tokens) + 1} is not host=token "
                "(e.g. hooks.example.com=TOKEN or hooks.example.com:8443=TOKEN)"
            )
        tokens[host] = token
    return tokens


def cors_origins(text: str) -> frozenset[str]:
    """``cors_allow_origins`` as a set of origins (``scheme://host[:port]``, or ``*``)."""
    origins = frozenset(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    for origin in origins:
        if origin != "*" and ("://" not in origin or origin.count("/") != 2):
            raise ConfigError(
                f"cors_allow_origins: {origin!r} is not an origin "
                "(scheme://host[:port], no path) or *"
            )
    return origins


NAMES = {f.name for f in fields(Settings)}


def coerce(name: str, value: Any) -> Any:
    """Convert a TOML or environment value to the field's type, with a clear error."""
    default = getattr(Settings, name)
    if name == "push_tokens" and isinstance(value, dict):
        # TOML: push_tokens = {"hooks.example.com" = "TOKEN"}
        if any("," in str(k) or "," in str(v) for k, v in value.items()):
            raise ConfigError("push_tokens: hosts and tokens cannot contain ','")
        return ",".join(f"{k}={v}" for k, v in value.items())
    if name == "flow_limits" and isinstance(value, dict):
        # TOML: [flow_limits] payments = { concurrency = 5 }
        try:
            return limits_text(value)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if name == "cors_allow_origins" and isinstance(value, list):
        # TOML: cors_allow_origins = ["https://ui.example.com"]
        return ",".join(str(v) for v in value)
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
        return str(value)
    except ValueError:
        raise ConfigError(f"invalid value for {name}: {value!r}") from None


def load(
    overrides: dict[str, Any] | None = None,
    *,
    environ: dict[str, str] | None = None,
    toml_path: str | None = None,
    base: Settings | None = None,
) -> Settings:
    """Merge the sources in order; ``overrides`` are flags given on the command line."""
    values: dict[str, Any] = {}
    path = Path(toml_path) if toml_path else Path("troth.toml")
    if toml_path and not path.exists():
        raise ConfigError(f"config file {toml_path} not found")
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in NAMES:
                raise ConfigError(f"{path}: unknown setting {key!r}")
            values[name] = coerce(name, value)
    env = os.environ if environ is None else environ
    for name in NAMES:
        key = f"TROTH_{name.upper()}"
        if key in env:
            values[name] = coerce(name, env[key])
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = value
    return dataclasses.replace(base or Settings(), **values)
