"""The configuration's vocabulary: the types every section uses, secrets, and the loader.

Each part keeps the model of its own section beside its code (collectors/config.py,
detector/config.py, ...); sloguard/settings.py puts them together. What is here is what they
share: durations and sizes as people write them, secrets given inline, by file or by
environment variable, and the loader that remembers where each value came from, so that every
error names the file and line (or the environment variable) and the field.

Precedence (highest first): command-line flags, environment (SLOGUARD_ prefix, `__` between
nested keys, e.g. SLOGUARD_STORE__RETENTION=2h), the YAML file, built-in defaults.
"""

from __future__ import annotations

import ipaddress
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from sloguard.core.selectors import parse_matchers
from sloguard.core.units import parse_duration, parse_size
from sloguard.core.yamlfile import YamlFileError, read_yaml

# Settings whose values never appear in output, logs or errors (pydantic's SecretStr prints
# them as '**********'; errors about them leave the given value out).
SECRET_FIELDS = frozenset({"token", "password", "credentials"})

ENV_PREFIX = "SLOGUARD_"

ENV_NESTED = "__"


Duration = Annotated[
    float, BeforeValidator(parse_duration), Field(ge=0),
    WithJsonSchema({"anyOf": [
        {"type": "number", "minimum": 0, "description": "seconds"},
        {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d|w))+$",
         "examples": ["500ms", "10s", "1m30s", "6h"]},
    ]}),
]

Size = Annotated[
    int, BeforeValidator(parse_size), Field(ge=0),
    WithJsonSchema({"anyOf": [
        {"type": "integer", "minimum": 0, "description": "bytes"},
        {"type": "string", "examples": ["512MiB", "1GiB", "100MB"]},
    ]}),
]



class Section(BaseModel):
    """A config section: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def shipped_rule_paths() -> list[str]:
    """The rules shipped with sloguard: the repository's rules/ in a source checkout (editable
    install), the package's default_rules/ in an installed wheel."""
    package = Path(__file__).resolve().parent.parent  # sloguard/
    for shipped in (package / "default_rules", package.parent / "rules"):
        if shipped.is_dir():
            return [str(shipped)]
    return []


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    return value


def host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. 127.0.0.1:6379, got {value!r}")
    return value


def _matchers(items: list[str]) -> list[str]:
    for item in items:
        parse_matchers([item])
    return items


Matchers = Annotated[list[str], AfterValidator(_matchers)]


# -- secrets --------------------------------------------------------------------------------
# A secret setting NAME may be given as NAME (inline; masked by `config show`, never echoed in
# errors), NAME_file (a path, e.g. a mounted Kubernetes Secret, read when it is needed, so a
# rotated secret is picked up) or NAME_env (the environment variable holding it). Only one.
SECRET_NAMES = frozenset({"webhook_url", "bot_token", "token", "ingest_token",
                          "database_password", "password", "credentials"})



class SecretUnavailable(Exception):
    """The secret's file cannot be read or its variable is unset (the message has no secret)."""



def secret_sources(section: Any, name: str) -> list[str]:
    """The ways `name` is given on `section` (a model or its raw dict)."""
    get = section.get if isinstance(section, dict) else lambda key: getattr(section, key, None)
    return [key for key in (name, f"{name}_file", f"{name}_env") if get(key)]



def read_secret(section: Any, name: str) -> str | None:
    """The secret `name` of a config section, or None when it is not configured."""
    value = getattr(section, name, None)
    if value is not None:
        return value.get_secret_value()
    path = getattr(section, f"{name}_file", None)
    if path:
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise SecretUnavailable(f"{name}_file {path}: {exc.strerror}") from None
        if not text:
            raise SecretUnavailable(f"{name}_file {path} is empty")
        return text
    variable = getattr(section, f"{name}_env", None)
    if variable:
        text = os.environ.get(variable, "").strip()
        if not text:
            raise SecretUnavailable(f"{name}_env: the variable {variable} is not set")
        return text
    return None



def _mentions_secret(value: Any) -> bool:
    if isinstance(value, dict):
        return any(key in SECRET_NAMES or _mentions_secret(v) for key, v in value.items())
    if isinstance(value, list | tuple):
        return any(_mentions_secret(v) for v in value)
    return False



# -- loading ---------------------------------------------------------------------------------
# The YAML document `load_settings` is building from. A context variable, not a class attribute:
# each thread (and task) has its own, so two loads at once cannot see each other's file.
_DOCUMENT: ContextVar[dict[str, Any] | None] = ContextVar("sloguard_config_document",
                                                          default=None)



class _YamlSource(PydanticBaseSettingsSource):
    """Feeds the already-parsed YAML document (set by `load_settings`) to pydantic-settings."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_DOCUMENT.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_DOCUMENT.get() or {})



class ConfigError(Exception):
    """A configuration problem, already phrased for the person who wrote the file."""



@dataclass
class LoadedSettings:
    settings: Any  # the application's settings model (sloguard.settings.Settings)
    file: Path | None
    yaml_lines: dict[tuple[str, ...], tuple[int, int]]
    env_keys: dict[tuple[str, ...], str]
    cli_keys: dict[tuple[str, ...], str]

    def source_of(self, path: tuple[str, ...], nearest: bool = False) -> str:
        """Where the value at `path` came from.

        With `nearest`, the closest enclosing key counts too (for errors about a key that is
        missing or malformed deeper inside what a file or variable gave).
        """
        sizes = range(len(path), 0, -1) if nearest else (len(path),)
        for size in sizes:
            prefix = path[:size]
            if prefix in self.cli_keys:
                return f"command line {self.cli_keys[prefix]}"
            if prefix in self.env_keys:
                return f"environment {self.env_keys[prefix]}"
            if prefix in self.yaml_lines:
                return f"{self.file}:{self.yaml_lines[prefix][0]}"
        if not nearest:
            for size in range(len(path) - 1, 0, -1):
                if path[:size] in self.env_keys:  # a whole section given as JSON
                    return f"environment {self.env_keys[path[:size]]}"
        return "default"

    def effective(self) -> list[tuple[str, Any, str]]:
        """(dotted key, value, source) for every leaf setting."""
        rows: list[tuple[str, Any, str]] = []

        def walk(value: Any, path: tuple[str, ...]) -> None:
            if isinstance(value, BaseModel):
                for name, info in type(value).model_fields.items():
                    walk(getattr(value, name), (*path, info.alias or name))
                for name, extra in (value.model_extra or {}).items():  # a plugin's section
                    walk(extra, (*path, name))
            else:
                if isinstance(value, list):
                    value = [v.model_dump(by_alias=True) if isinstance(v, BaseModel) else v
                             for v in value]
                rows.append((".".join(path), value, self.source_of(path)))

        walk(self.settings, ())
        return rows



def _yaml_document(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], tuple[int, int]]]:
    try:
        document, lines = read_yaml(path)
    except YamlFileError as exc:
        raise ConfigError(str(exc).replace(": cannot read:", ": cannot read config file:")) \
            from exc
    if document is None:
        return {}, {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}:1: the config file must be a mapping of settings")
    return document, lines



def _env_keys() -> dict[tuple[str, ...], str]:
    keys = {}
    for name in os.environ:
        if name.startswith(ENV_PREFIX) and name != f"{ENV_PREFIX}CONFIG":
            path = tuple(part.lower() for part in name[len(ENV_PREFIX):].split(ENV_NESTED))
            keys[path] = name
    return keys



def load_model(
    model: type[BaseSettings], config_file: Path | None = None,
    cli_overrides: dict[str, tuple[str, Any]] | None = None,
) -> LoadedSettings:
    """Build the effective settings; raise ConfigError naming file, line and field on problems.

    `cli_overrides` maps a top-level field to (flag name, value) for flags that were given.
    """
    if config_file is None and os.environ.get(f"{ENV_PREFIX}CONFIG"):
        config_file = Path(os.environ[f"{ENV_PREFIX}CONFIG"])
    document, lines = _yaml_document(config_file) if config_file else ({}, {})
    cli_overrides = cli_overrides or {}
    env_keys = _env_keys()
    cli_keys = {(key,): flag for key, (flag, _) in cli_overrides.items()}
    token = _DOCUMENT.set(document)
    try:
        settings = model(**{key: value for key, (_, value) in cli_overrides.items()})
    except ValidationError as exc:
        loaded = LoadedSettings(model.model_construct(), config_file, lines, env_keys, cli_keys)
        raise ConfigError(_describe(exc, loaded)) from exc
    finally:
        _DOCUMENT.reset(token)
    return LoadedSettings(settings, config_file, lines, env_keys, cli_keys)



def _describe(exc: ValidationError, loaded: LoadedSettings) -> str:
    messages = []
    for error in exc.errors():
        path = tuple(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        given = error.get("input")
        cross = re.match(r"^([a-z_][a-z0-9_.]*): (.*)$", message, re.S)
        if cross and tuple(cross.group(1).split("."))[:len(path)] != path:
            cross = None  # only a field at or below the one the check ran on
        if cross:  # a check across fields (or of a plugin's section) names the field to fix
            path, message, given = tuple(cross.group(1).split(".")), cross.group(2), None
        field = ".".join(path) or "(top level)"
        where = loaded.source_of(path, nearest=True)
        if where == "default" and loaded.file:
            where = str(loaded.file)
        if (SECRET_NAMES | SECRET_FIELDS) & set(path) or _mentions_secret(given) or (
                isinstance(given, dict)):
            given = None  # never echo a secret back (nor a whole section)
        elif isinstance(given, str) and "@" in given and path and (
                path[-1] in ("url", "database") or path[-2:-1] == ("urls",)):
            given = None  # user:password@host
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; `sloguard config show` lists them)"
        elif given is not None and error["type"] != "missing" and repr(given) not in message:
            message = f"{message} (got {given!r})"
        messages.append(f"{where}: {field}: {message}")
    return "\n".join(messages)



def yaml_source(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource:
    """The source a settings model puts after the environment in its
    `settings_customise_sources`: the YAML file `load_model` is reading."""
    return _YamlSource(settings_cls)
