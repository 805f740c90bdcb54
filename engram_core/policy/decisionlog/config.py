"""Turning decision logging on: one flag, ``engram serve --decision-log VALUE``, where VALUE
is ``file:PATH`` or an ``http(s)://`` URL (a sink with the defaults below), or a ``.toml``
file whose ``[decision_log]`` section says everything:

```toml
[decision_log]
file = "/var/log/engram/decisions.jsonl"   # or: url = "https://collector.example/logs"
max_file_bytes = 104857600                 # rotate past this (file)
max_files = 5                              # files kept, the current one included (file)
fsync = false                              # fsync after each batch (file)
upload_size_limit_bytes = 32768            # one upload's JSON, uncompressed (url; OPA's name)
min_delay_seconds = 1.0                    # upload period; first backoff step (url)
max_delay_seconds = 10.0                   # backoff cap (url)
bearer_token_file = "/etc/engram/collector.token"   # Authorization: Bearer (url, optional)
buffer_size_limit_events = 10000           # events waiting in memory; beyond: dropped, counted
pseudonym_key_file = "/etc/engram/decision-log.key" # default DATA_DIR/decision-log.key (made on first use)
labels = { region = "eu-1" }               # added to every event's labels
```

Off unless the flag is given. Unknown keys are refused (a typo must not silently log
somewhere else, or not at all).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engram_core.policy.decisionlog.logger import DecisionLogger
from engram_core.policy.decisionlog.mask import KEY_FILE, Pseudonymizer
from engram_core.policy.decisionlog.sinks import FileSink, HttpSink, Sink


@dataclass(frozen=True)
class DecisionLogConfig:
    file: Path | None = None
    url: str | None = None
    max_file_bytes: int = 100 * 1024 * 1024
    max_files: int = 5
    fsync: bool = False
    upload_size_limit_bytes: int = 32768
    min_delay_seconds: float = 1.0
    max_delay_seconds: float = 10.0
    bearer_token_file: Path | None = None
    buffer_size_limit_events: int = 10_000
    pseudonym_key_file: Path | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.file is None) == (self.url is None):
            raise ValueError("decision_log needs exactly one of file or url")
        if self.buffer_size_limit_events < 1:
            raise ValueError("buffer_size_limit_events must be positive")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()):
            raise ValueError("labels must map strings to strings")

    def describe(self) -> str:
        return f"file {self.file}" if self.file is not None else f"http {self.url}"


def parse_decision_log(value: str) -> DecisionLogConfig:
    """The ``--decision-log`` flag's value; ValueError says what is wrong."""
    if value.startswith("file:"):
        path = value.removeprefix("file:")
        if not path:
            raise ValueError("--decision-log file: needs a path")
        return DecisionLogConfig(file=Path(path))
    if value.startswith(("http://", "https://")):
        return DecisionLogConfig(url=value)
    if value.endswith(".toml"):
        return from_toml(Path(value))
    raise ValueError(f"--decision-log takes file:PATH, an http(s):// URL or a .toml file, got {value!r}")


_PATHS = {"file", "bearer_token_file", "pseudonym_key_file"}


def from_toml(path: Path) -> DecisionLogConfig:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    section = doc.get("decision_log")
    if not isinstance(section, dict):
        raise ValueError(f"{path} has no [decision_log] section")
    known = {f.name for f in fields(DecisionLogConfig)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"{path}: unknown [decision_log] keys: {', '.join(unknown)}")
    values: dict[str, Any] = {k: Path(v) if k in _PATHS and isinstance(v, str) else v for k, v in section.items()}
    try:
        return DecisionLogConfig(**values)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def open_sink(config: DecisionLogConfig) -> Sink:
    if config.file is not None:
        return FileSink(config.file, max_bytes=config.max_file_bytes, max_files=config.max_files,
                        fsync=config.fsync)
    token = None
    if config.bearer_token_file is not None:
        try:
            token = config.bearer_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read bearer_token_file {config.bearer_token_file}: {exc.strerror}") from None
    assert config.url is not None
    return HttpSink(config.url, upload_size_limit_bytes=config.upload_size_limit_bytes,
                    min_delay_seconds=config.min_delay_seconds, max_delay_seconds=config.max_delay_seconds,
                    bearer_token=token)


def open_decision_logger(config: DecisionLogConfig, data_dir: Path, *,
                         mask_remotely: Any = None) -> DecisionLogger:
    """The logger with its sink and pseudonym key (created in the data directory if need be)."""
    key_file = config.pseudonym_key_file or Path(data_dir) / KEY_FILE
    try:
        if config.pseudonym_key_file is None:
            Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        pseudonymizer = Pseudonymizer.from_file(key_file, create=config.pseudonym_key_file is None)
    except OSError as exc:
        raise ValueError(f"cannot read the pseudonym key {key_file}: {exc.strerror}") from None
    return DecisionLogger(open_sink(config), pseudonymizer=pseudonymizer, labels=config.labels,
                          buffer_events=config.buffer_size_limit_events, mask_remotely=mask_remotely)
